//! The operators' audit trail (migration 0023): each action on the operator routes, recorded
//! before it runs and completed after.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// An action about to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Started {
    /// The operator token's name.
    pub operator: String,
    /// Method and route template, e.g. `POST /v1/admin/outbox/replay`.
    pub action: String,
    /// What it named: path parameters, query and body.
    pub target: serde_json::Value,
    pub dry_run: bool,
}

/// One recorded action.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub operator: String,
    pub action: String,
    pub target: serde_json::Value,
    pub dry_run: bool,
    /// The answer's HTTP status; `None` while it runs, or if it never ended.
    pub status: Option<i16>,
    /// Rows or messages it acted on, when the answer says.
    pub rows: Option<i64>,
}

/// Records `started`; its id, to [`finish`] it.
pub async fn start(pool: &PgPool, started: &Started) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        "INSERT INTO operator_actions (operator, action, target, dry_run)
         VALUES ($1, $2, $3, $4) RETURNING id",
        started.operator,
        started.action,
        started.target,
        started.dry_run
    )
    .fetch_one(pool)
    .await
}

/// Completes action `id` with its answer.
pub async fn finish(
    pool: &PgPool,
    id: i64,
    status: u16,
    rows: Option<i64>,
) -> Result<(), sqlx::Error> {
    // An HTTP status is three digits; one that is not is not recorded rather than bent.
    let status = i16::try_from(status).ok();
    sqlx::query!(
        "UPDATE operator_actions SET status = $2, rows = $3 WHERE id = $1",
        id,
        status,
        rows
    )
    .execute(pool)
    .await
    .map(|_| ())
}

/// Which actions to list: newest first, below `before` (an id: the cursor).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    pub operator: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub before: Option<i64>,
    pub limit: i64,
}

pub async fn list(pool: &PgPool, filter: &Filter) -> Result<Vec<Action>, sqlx::Error> {
    sqlx::query_as!(
        Action,
        "SELECT id, at, operator, action, target, dry_run, status, rows FROM operator_actions
         WHERE ($1::text IS NULL OR operator = $1) AND ($2::timestamptz IS NULL OR at >= $2)
           AND ($3::bigint IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4",
        filter.operator.as_deref(),
        filter.since,
        filter.before,
        filter.limit
    )
    .fetch_all(pool)
    .await
}

/// Deletes actions older than `before` (the dispatcher's retention round); how many.
pub async fn purge_before(pool: &PgPool, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query!("DELETE FROM operator_actions WHERE at < $1", before)
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
