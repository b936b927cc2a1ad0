//! Operations on many outbox rows at once: replay and cancel every row a filter matches, each with
//! a dry run that counts and samples what would change.
//!
//! A bulk operation is a series of calls, each taking one batch of matching rows in id order
//! after `cursor` and returning the cursor to go on from, so a large operation never holds one
//! long transaction, reports progress as it goes, and resumes where it stopped if the client was
//! interrupted. `up_to` fixes the set at the first call: rows created after it (new detections,
//! the operation's own replays) are not part of it. Each step is idempotent — a row is replayed
//! at most once and only a due row is cancelled — so repeating a batch changes nothing.

use crate::AppState;
use crate::auth::Operator;
use crate::extract::{JsonBody, resource_id};
use crate::history::status_filter;
use crate::problem::{ApiError, Problem, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, QueryBuilder};
use std::collections::BTreeMap;
use tidings_domain::OutboxId;
use tidings_domain::outbox::{Reason, Status};
use tidings_runtime::telemetry;
use tidings_store::db;
use utoipa::ToSchema;
use uuid::Uuid;

/// Which outbox rows an operation is about. Every field narrows the set; none means every row.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxFilter {
    #[schema(value_type = Option<tidings_domain::outbox::Status>)]
    pub status: Option<String>,
    /// A drop or failure reason, e.g. `condition_lost`.
    pub reason: Option<String>,
    pub device_id: Option<Uuid>,
    pub watch_id: Option<Uuid>,
    /// The watched item's code (no NUL: Postgres text cannot hold one).
    #[schema(pattern = r"^[^\u0000]*$")]
    pub item: Option<String>,
    /// Rows with an attempt through this push service host (no NUL).
    #[schema(pattern = r"^[^\u0000]*$")]
    pub push_host: Option<String>,
    /// Rows whose last push answer had this HTTP status.
    #[serde(default, deserialize_with = "crate::extract::whole::opt")]
    #[schema(minimum = 0, maximum = 65535)]
    pub http_status: Option<u16>,
    /// Rows detected at or after this instant (a `from` at or after `to` matches nothing).
    pub from: Option<DateTime<Utc>>,
    /// Rows detected before this instant.
    pub to: Option<DateTime<Utc>>,
}

/// An [`OutboxFilter`] whose names were checked.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    status: Option<Status>,
    reason: Option<Reason>,
    device_id: Option<Uuid>,
    watch_id: Option<Uuid>,
    item: Option<String>,
    push_host: Option<String>,
    http_status: Option<i32>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
}

pub(crate) fn reason_filter(name: Option<&str>) -> Result<Option<Reason>, ApiError> {
    name.map(|name| {
        Reason::parse(name).ok_or_else(|| {
            let known: Vec<&str> = Reason::all().map(Reason::as_str).collect();
            ApiError::BadRequest(format!(
                "reason `{name}` is not one of {}",
                known.join(", ")
            ))
        })
    })
    .transpose()
}

impl OutboxFilter {
    pub(crate) fn check(&self) -> Result<Filter, ApiError> {
        // Postgres text cannot hold a NUL: no row has one, and the query would fail.
        for (name, value) in [("item", &self.item), ("push_host", &self.push_host)] {
            if value.as_deref().is_some_and(|v| v.contains('\0')) {
                return Err(ApiError::BadRequest(format!("{name} must not contain NUL")));
            }
        }
        Ok(Filter {
            status: status_filter(self.status.as_deref())?,
            reason: reason_filter(self.reason.as_deref())?,
            device_id: self.device_id,
            watch_id: self.watch_id,
            item: self.item.clone(),
            push_host: self.push_host.clone(),
            http_status: self.http_status.map(i32::from),
            from: self.from,
            to: self.to,
        })
    }
}

impl Filter {
    /// Appends the filter's conditions to a query over `outbox o LEFT JOIN watches w` that
    /// already has a `WHERE`.
    pub(crate) fn push(&self, q: &mut QueryBuilder<'_, Postgres>) {
        if let Some(s) = self.status {
            q.push(" AND o.status = ").push_bind(s.as_str());
        }
        if let Some(r) = self.reason {
            q.push(" AND o.reason = ").push_bind(r.as_str());
        }
        if let Some(d) = self.device_id {
            q.push(" AND o.device_id = ").push_bind(d);
        }
        if let Some(w) = self.watch_id {
            q.push(" AND o.watch_id = ").push_bind(w);
        }
        if let Some(item) = &self.item {
            q.push(" AND w.item_code = ").push_bind(item.clone());
        }
        if let Some(host) = &self.push_host {
            // The attempt that ended a row is on the row; earlier ones in outbox_attempts.
            q.push(" AND (o.attempt_push_host = ")
                .push_bind(host.clone())
                .push(
                    " OR EXISTS (SELECT 1 FROM outbox_attempts a
                        WHERE a.outbox_id = o.id AND a.dedup_day = o.dedup_day AND a.push_host = ",
                )
                .push_bind(host.clone())
                .push("))");
        }
        if let Some(h) = self.http_status {
            q.push(" AND o.http_status = ").push_bind(h);
        }
        if let Some(from) = self.from {
            q.push(" AND o.detected_at >= ").push_bind(from);
        }
        if let Some(to) = self.to {
            q.push(" AND o.detected_at < ").push_bind(to);
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    #[serde(default, deserialize_with = "crate::extract::object_or_default")]
    pub filter: OutboxFilter,
    /// Count and sample what would change; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// `next_cursor` of the previous batch; absent on the first call.
    pub cursor: Option<Uuid>,
    /// `up_to` of the first call; absent on the first call.
    pub up_to: Option<Uuid>,
    /// Rows examined per call (default 500, at most 5,000).
    #[serde(default, deserialize_with = "crate::extract::whole::opt")]
    #[schema(minimum = 1, maximum = 5000)]
    pub batch: Option<u32>,
}

/// A matching row, as a dry run samples it.
#[derive(Debug, Serialize, Deserialize, ToSchema, sqlx::FromRow)]
pub struct Sampled {
    pub id: Uuid,
    pub status: tidings_domain::outbox::Status,
    pub reason: Option<String>,
    pub item_code: Option<String>,
    pub device_id: Uuid,
    pub detected_at: DateTime<Utc>,
    pub http_status: Option<i32>,
    pub replay_of: Option<Uuid>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BulkReport {
    pub dry_run: bool,
    /// Dry run: every row the filter matches, and how many of them the operation would change.
    pub matched: Option<i64>,
    pub would_change: Option<i64>,
    /// Dry run: up to 10 of the rows it would change.
    pub sample: Vec<Sampled>,
    /// Rows examined by this call.
    pub examined: u64,
    /// Rows this call changed (replayed or cancelled).
    pub changed: u64,
    /// Rows this call left alone, by why: `is_a_replay`, `already_replayed`, `not_replayable`,
    /// `not_cancellable`.
    pub skipped: BTreeMap<String, u64>,
    /// Pass it back as `cursor` to take the next batch; absent when the operation is done.
    pub next_cursor: Option<Uuid>,
    /// The operation's end of the id range; pass it back with every later call.
    pub up_to: Uuid,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Operation {
    Replay,
    Cancel,
}

impl Operation {
    /// SQL deciding whether row `o` is one this operation changes.
    fn eligible(self) -> &'static str {
        match self {
            Operation::Replay => concat!(
                "o.status IN ",
                tidings_store::status_sql!(replayable),
                " AND o.replay_of IS NULL
                 AND NOT EXISTS (SELECT 1 FROM outbox r WHERE r.replay_of = o.id AND r.dedup_day = o.dedup_day)"
            ),
            Operation::Cancel => concat!("o.status IN ", tidings_store::status_sql!(cancellable)),
        }
    }
}

fn matching<'a>(select: &str, filter: &Filter, up_to: Uuid) -> QueryBuilder<'a, Postgres> {
    let mut q = QueryBuilder::new(select);
    q.push(" FROM outbox o LEFT JOIN watches w ON w.id = o.watch_id WHERE o.id < ");
    q.push_bind(up_to);
    filter.push(&mut q);
    q
}

/// A row a batch looked at: (id, dedup day, is a replay, replayed already, eligible).
type Candidate = (Uuid, chrono::NaiveDate, bool, bool, bool);

async fn run(app: &AppState, op: Operation, req: BulkRequest) -> Result<BulkReport, ApiError> {
    let filter = req.filter.check()?;
    let batch = match req.batch.unwrap_or(500) {
        n @ 1..=5000 => i64::from(n),
        n => {
            return Err(ApiError::BadRequest(format!(
                "batch must be between 1 and 5000, got {n}"
            )));
        }
    };
    // UUIDv7 ids grow with time: every row that exists now has a smaller one.
    let up_to = req.up_to.unwrap_or_else(Uuid::now_v7);
    let mut report = BulkReport {
        dry_run: req.dry_run,
        matched: None,
        would_change: None,
        sample: Vec::new(),
        examined: 0,
        changed: 0,
        skipped: BTreeMap::new(),
        next_cursor: None,
        up_to,
    };
    if req.dry_run {
        dry_run(app, op, &filter, &mut report).await?;
        return Ok(report);
    }
    let mut tx = app
        .pool
        .begin()
        .await
        .map_err(db("starting a bulk operation"))?;
    let rows = lock_batch(&mut tx, op, &filter, up_to, req.cursor, batch).await?;
    report.examined = rows.len() as u64;
    if rows.len() as i64 == batch {
        report.next_cursor = rows.last().map(|r| r.0);
    }
    let (ids, days) = sort_out(op, &rows, &mut report);
    let mut cancelled = None;
    if !ids.is_empty() {
        report.changed = match op {
            Operation::Replay => replay_rows(&mut tx, &ids, &days).await?,
            Operation::Cancel => {
                let done = cancel_rows(&mut tx, &ids, &days).await?;
                let n = done.count();
                cancelled = Some(done);
                n
            }
        };
    }
    tx.commit()
        .await
        .map_err(db("committing a bulk operation"))?;
    if let Some(done) = cancelled {
        done.record();
    }
    tracing::info!(
        operation = if op == Operation::Replay {
            "replay"
        } else {
            "cancel"
        },
        examined = report.examined,
        changed = report.changed,
        "bulk outbox operation batch"
    );
    Ok(report)
}

/// Counts what the filter matches and what the operation would change, with a sample.
async fn dry_run(
    app: &AppState,
    op: Operation,
    filter: &Filter,
    report: &mut BulkReport,
) -> Result<(), ApiError> {
    let mut q = matching(
        &format!("SELECT count(*), count(*) FILTER (WHERE {})", op.eligible()),
        filter,
        report.up_to,
    );
    let (matched, eligible): (i64, i64) = q
        .build_query_as()
        .fetch_one(&app.pool)
        .await
        .map_err(db("counting the rows a filter matches"))?;
    let mut q = matching(
        "SELECT o.id, o.status, o.reason, w.item_code, o.device_id, o.detected_at,
                o.http_status, o.replay_of",
        filter,
        report.up_to,
    );
    q.push(" AND ")
        .push(op.eligible())
        .push(" ORDER BY o.id LIMIT 10");
    report.sample = q
        .build_query_as()
        .fetch_all(&app.pool)
        .await
        .map_err(db("sampling the rows a filter matches"))?;
    report.matched = Some(matched);
    report.would_change = Some(eligible);
    Ok(())
}

/// The batch after `cursor`, locked so a dispatcher's claim or a concurrent bulk call cannot
/// interleave.
async fn lock_batch(
    tx: &mut sqlx::PgConnection,
    op: Operation,
    filter: &Filter,
    up_to: Uuid,
    cursor: Option<Uuid>,
    batch: i64,
) -> Result<Vec<Candidate>, ApiError> {
    let mut q = matching(
        &format!(
            "SELECT o.id, o.dedup_day, o.replay_of IS NOT NULL,
                    EXISTS (SELECT 1 FROM outbox r WHERE r.replay_of = o.id AND r.dedup_day = o.dedup_day),
                    {}",
            op.eligible()
        ),
        filter,
        up_to,
    );
    if let Some(c) = cursor {
        q.push(" AND o.id > ").push_bind(c);
    }
    q.push(" ORDER BY o.id LIMIT ")
        .push_bind(batch)
        .push(" FOR UPDATE OF o");
    Ok(q.build_query_as()
        .fetch_all(&mut *tx)
        .await
        .map_err(db("reading a batch of matching rows"))?)
}

/// The eligible rows' ids and days; the others counted in the report by why they were skipped.
fn sort_out(
    op: Operation,
    rows: &[Candidate],
    report: &mut BulkReport,
) -> (Vec<Uuid>, Vec<chrono::NaiveDate>) {
    let mut ids = Vec::new();
    let mut days = Vec::new();
    for (id, day, is_replay, replayed, eligible) in rows {
        if *eligible {
            ids.push(*id);
            days.push(*day);
            continue;
        }
        let why = match op {
            Operation::Replay if *is_replay => "is_a_replay",
            Operation::Replay if *replayed => "already_replayed",
            Operation::Replay => "not_replayable",
            Operation::Cancel => "not_cancellable",
        };
        *report.skipped.entry(why.to_owned()).or_default() += 1;
    }
    (ids, days)
}

/// Replays rows (each a new pending row linked to its original, carrying this request's trace).
async fn replay_rows(
    tx: &mut sqlx::PgConnection,
    ids: &[Uuid],
    days: &[chrono::NaiveDate],
) -> Result<u64, ApiError> {
    let traceparent = telemetry::forward(&tracing::Span::current(), None);
    let ids: Vec<OutboxId> = ids.iter().map(|id| OutboxId(*id)).collect();
    Ok(tidings_store::replay::many(tx, &ids, days, traceparent)
        .await
        .map_err(db("replaying outbox rows"))?)
}

/// Ends due rows `dropped`/`cancelled` through the store's transition path; a row claimed or
/// ended meanwhile stays as it is.
async fn cancel_rows(
    tx: &mut sqlx::PgConnection,
    ids: &[Uuid],
    days: &[chrono::NaiveDate],
) -> Result<tidings_store::cancel::Cancelled, ApiError> {
    let rows: Vec<(OutboxId, chrono::NaiveDate)> = ids
        .iter()
        .zip(days)
        .map(|(id, day)| (OutboxId(*id), *day))
        .collect();
    Ok(tidings_store::cancel::cancel(tx, &rows).await?)
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/replay", tag = "operators",
    request_body = BulkRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "One batch replayed (or, with `dry_run`, counted and sampled). Only failed or dropped rows that are not themselves replays and were not replayed before are replayed, once each; each replay is re-checked like any notification.", body = BulkReport),
        (status = 400, description = "Bad filter value or batch size", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A body of the wrong shape (an unknown field, a wrong type)", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
    )
)]
pub async fn bulk_replay(
    State(app): State<AppState>,
    _: Operator,
    JsonBody { value: req, raw }: JsonBody<BulkRequest>,
) -> Result<Json<BulkReport>, ApiError> {
    crate::extract::require_object(&raw)?;
    run(&app, Operation::Replay, req).await.map(Json)
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/cancel", tag = "operators",
    request_body = BulkRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "One batch cancelled (or, with `dry_run`, counted and sampled). Only pending and retrying rows are cancelled: they end `dropped` with reason `cancelled`.", body = BulkReport),
        (status = 400, description = "Bad filter value or batch size", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A body of the wrong shape (an unknown field, a wrong type)", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
    )
)]
pub async fn bulk_cancel(
    State(app): State<AppState>,
    _: Operator,
    JsonBody { value: req, raw }: JsonBody<BulkRequest>,
) -> Result<Json<BulkReport>, ApiError> {
    crate::extract::require_object(&raw)?;
    run(&app, Operation::Cancel, req).await.map(Json)
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Cancelled {
    pub id: Uuid,
    pub status: String,
    pub reason: String,
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/{id}/cancel", tag = "operators",
    params(("id" = Uuid, Path, description = "A pending or retrying outbox row")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The row is now `dropped` with reason `cancelled`", body = Cancelled),
        Unauthorized,
        (status = 404, description = "No such row", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The row is not pending or retrying (a push may be out, or it has ended)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Cancelled>, ApiError> {
    let id = resource_id(id, "outbox row")?;
    let found: Option<(chrono::NaiveDate, String)> =
        sqlx::query_as("SELECT dedup_day, status FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_optional(&app.pool)
            .await
            .map_err(db("reading an outbox row"))?;
    let (day, status) = found.ok_or(ApiError::NotFound("outbox row"))?;
    let mut tx = app
        .pool
        .begin()
        .await
        .map_err(db("cancelling an outbox row"))?;
    let cancelled = cancel_rows(&mut tx, &[id], &[day]).await?;
    tx.commit().await.map_err(db("cancelling an outbox row"))?;
    if cancelled.count() == 0 {
        // Re-read: it may have been claimed or ended since the first read.
        let now: String = sqlx::query_scalar("SELECT status FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .map_err(db("reading an outbox row"))
            .unwrap_or(status);
        return Err(ApiError::Conflict {
            kind: "not-cancellable",
            detail: format!("row {id} is {now}; only pending or retrying rows can be cancelled"),
        });
    }
    cancelled.record();
    tracing::info!(outbox_id = %id, "outbox row cancelled");
    Ok(Json(Cancelled {
        id,
        status: "dropped".into(),
        reason: "cancelled".into(),
    }))
}
