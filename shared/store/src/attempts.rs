//! Delivery attempts (migration 0012): one record per attempt, written in the transaction that
//! applies the attempt's result, read by the operator api and a device's history.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgConnection;
use tidings_domain::{OutboxId, SubscriptionId};

/// The outcome the lease sweeper records for an attempt that produced no result.
pub const LEASE_EXPIRED: &str = "lease_expired";

/// One attempt as recorded.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Attempt {
    pub outbox_id: OutboxId,
    pub dedup_day: NaiveDate,
    pub attempt: i32,
    pub started_at: Option<DateTime<Utc>>,
    pub subscription_id: Option<SubscriptionId>,
    pub push_host: Option<String>,
    pub outcome: String,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub push_message_id: Option<String>,
}

fn col<'a, T>(attempts: &'a [Attempt], f: impl Fn(&'a Attempt) -> T) -> Vec<T> {
    attempts.iter().map(f).collect()
}

/// The insert's columns, from `$1`…`$11` as an `UNNEST`.
macro_rules! insert_attempts {
    () => {
        "INSERT INTO outbox_attempts AS a (outbox_id, dedup_day, attempt, started_at,
             subscription_id, push_host, outcome, http_status, error, duration_ms, push_message_id)
         SELECT * FROM UNNEST($1::uuid[], $2::date[], $3::int[], $4::timestamptz[], $5::uuid[],
             $6::text[], $7::text[], $8::int[], $9::text[], $10::bigint[], $11::text[])"
    };
}

async fn insert(
    conn: &mut PgConnection,
    sql: &str,
    attempts: &[Attempt],
) -> Result<(), sqlx::Error> {
    if attempts.is_empty() {
        return Ok(());
    }
    sqlx::query(sql)
        .bind(col(attempts, |a| a.outbox_id))
        .bind(col(attempts, |a| a.dedup_day))
        .bind(col(attempts, |a| a.attempt))
        .bind(col(attempts, |a| a.started_at))
        .bind(col(attempts, |a| a.subscription_id))
        .bind(col(attempts, |a| a.push_host.as_deref()))
        .bind(col(attempts, |a| a.outcome.as_str()))
        .bind(col(attempts, |a| a.http_status))
        .bind(col(attempts, |a| a.error.as_deref()))
        .bind(col(attempts, |a| a.duration_ms))
        .bind(col(attempts, |a| a.push_message_id.as_deref()))
        .execute(conn)
        .await?;
    Ok(())
}

/// Records attempts that have no record yet, with a plain insert: the first outcome of a row's
/// current attempt, which the caller knows because the row is still `sending` with that attempt
/// under its lock (every record is written in the transaction that moves the row off it).
pub async fn insert_new(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    insert(conn, insert_attempts!(), attempts).await
}

/// Records attempts that may be on record already (a late or repeated result): a recorded
/// attempt keeps its record, except a `lease_expired` placeholder, which the attempt's real
/// result replaces.
pub async fn record(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    insert(
        conn,
        concat!(
            insert_attempts!(),
            " ON CONFLICT (outbox_id, dedup_day, attempt) DO UPDATE
             SET started_at = EXCLUDED.started_at, recorded_at = now(),
                 subscription_id = COALESCE(EXCLUDED.subscription_id, a.subscription_id),
                 push_host = EXCLUDED.push_host, outcome = EXCLUDED.outcome,
                 http_status = EXCLUDED.http_status, error = EXCLUDED.error,
                 duration_ms = EXCLUDED.duration_ms, push_message_id = EXCLUDED.push_message_id
             WHERE a.outcome = 'lease_expired' AND EXCLUDED.outcome <> 'lease_expired'"
        ),
        attempts,
    )
    .await
}

/// One recorded attempt with when it was recorded and its row's trace.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Recorded {
    #[sqlx(flatten)]
    pub attempt: Attempt,
    pub recorded_at: DateTime<Utc>,
    /// The row's W3C traceparent, which every attempt of the row continues.
    pub traceparent: Option<String>,
}

/// A row's attempts, first to last.
pub async fn of_row<'c, E: sqlx::PgExecutor<'c>>(
    e: E,
    id: OutboxId,
) -> Result<Vec<Recorded>, sqlx::Error> {
    sqlx::query_as(
        "SELECT a.outbox_id, a.dedup_day, a.attempt, a.started_at, a.subscription_id, a.push_host,
                a.outcome, a.http_status, a.error, a.duration_ms, a.push_message_id, a.recorded_at,
                o.traceparent
         FROM outbox_attempts a
         JOIN outbox o ON o.id = a.outbox_id AND o.dedup_day = a.dedup_day
         WHERE a.outbox_id = $1 ORDER BY a.attempt",
    )
    .bind(id)
    .fetch_all(e)
    .await
}
