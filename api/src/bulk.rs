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
use crate::problem::{ApiError, BodyRejected, BulkRejected, NoSuchRow, Problem, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use chrono::NaiveDate;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tidings_api_types::outbox::{BulkReport, Cancelled, Sampled};
use tidings_domain::outbox::Reason;
use tidings_domain::{Channel, DeviceId, OutboxId, WatchId};
use tidings_runtime::telemetry;
use tidings_store::bulk::{self, Candidate, Operation};
use tidings_store::db;
use tidings_store::history::{self, Filter};
use utoipa::ToSchema;
use uuid::Uuid;

/// Which outbox rows an operation is about. Every field narrows the set; none means every row.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxFilter {
    #[schema(value_type = Option<tidings_domain::outbox::Status>)]
    pub status: Option<String>,
    /// A drop or failure reason, e.g. `condition_lost`.
    #[schema(value_type = Option<Reason>)]
    pub reason: Option<String>,
    #[schema(value_type = Option<tidings_domain::Channel>)]
    pub channel: Option<String>,
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

fn channel_filter(name: Option<&str>) -> Result<Option<Channel>, ApiError> {
    name.map(|name| {
        name.parse().map_err(|_| {
            let known: Vec<&str> = Channel::ALL.iter().map(|c| c.as_str()).collect();
            ApiError::BadRequest(format!(
                "channel `{name}` is not one of {}",
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
            channel: channel_filter(self.channel.as_deref())?,
            device_id: self.device_id.map(DeviceId),
            watch_id: self.watch_id.map(WatchId),
            item: self.item.clone(),
            push_host: self.push_host.clone(),
            http_status: self.http_status.map(i32::from),
            from: self.from,
            to: self.to,
        })
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

/// A sampled row as the report shows it.
fn sampled(r: bulk::Sampled) -> Sampled {
    Sampled {
        id: r.id.0,
        status: r.status,
        reason: r.reason,
        item_code: r.item_code,
        device_id: r.device_id.0,
        detected_at: r.detected_at,
        http_status: r.http_status,
        replay_of: r.replay_of.map(|id| id.0),
    }
}

async fn run(app: &AppState, op: Operation, req: BulkRequest) -> Result<BulkReport, ApiError> {
    let filter = req.filter.check()?;
    let batch = batch_size(req.batch)?;
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
    let rows = bulk::lock_batch(
        &mut tx,
        op,
        &filter,
        OutboxId(up_to),
        req.cursor.map(OutboxId),
        batch,
    )
    .await
    .map_err(db("reading a batch of matching rows"))?;
    report.examined = rows.len() as u64;
    if rows.len() as i64 == batch {
        report.next_cursor = rows.last().map(|r| r.id.0);
    }
    let eligible = sort_out(op, &rows, &mut report);
    let (changed, cancelled) = change(&mut tx, op, &eligible).await?;
    report.changed = changed;
    tx.commit()
        .await
        .map_err(db("committing a bulk operation"))?;
    if let Some(done) = cancelled {
        done.observe();
    }
    tracing::info!(
        operation = op.as_str(),
        examined = report.examined,
        changed = report.changed,
        "bulk outbox operation batch"
    );
    Ok(report)
}

/// Rows a call examines: `batch`, 500 if not given, and 1 to 5,000.
fn batch_size(batch: Option<u32>) -> Result<i64, ApiError> {
    match batch.unwrap_or(500) {
        n @ 1..=5000 => Ok(i64::from(n)),
        n => Err(ApiError::BadRequest(format!(
            "batch must be between 1 and 5000, got {n}"
        ))),
    }
}

/// Applies `op` to the eligible rows in `tx`: how many changed, and a cancel's transitions, to
/// count once the transaction has committed.
async fn change(
    tx: &mut sqlx::PgConnection,
    op: Operation,
    eligible: &[(OutboxId, NaiveDate)],
) -> Result<(u64, Option<tidings_store::cancel::Cancelled>), ApiError> {
    if eligible.is_empty() {
        return Ok((0, None));
    }
    match op {
        Operation::Replay => Ok((replay_rows(tx, eligible).await?, None)),
        Operation::Cancel => {
            let done = tidings_store::cancel::cancel(tx, eligible).await?;
            Ok((done.count(), Some(done)))
        }
    }
}

/// Counts what the filter matches and what the operation would change, with a sample.
async fn dry_run(
    app: &AppState,
    op: Operation,
    filter: &Filter,
    report: &mut BulkReport,
) -> Result<(), ApiError> {
    let up_to = OutboxId(report.up_to);
    let (matched, eligible) = bulk::count(&app.pool, op, filter, up_to)
        .await
        .map_err(db("counting the rows a filter matches"))?;
    let sample = bulk::sample(&app.pool, op, filter, up_to)
        .await
        .map_err(db("sampling the rows a filter matches"))?;
    report.sample = sample.into_iter().map(sampled).collect();
    report.matched = Some(matched);
    report.would_change = Some(eligible);
    Ok(())
}

/// The eligible rows' ids and days; the others counted in the report by why they were skipped.
fn sort_out(
    op: Operation,
    rows: &[Candidate],
    report: &mut BulkReport,
) -> Vec<(OutboxId, NaiveDate)> {
    let mut eligible = Vec::new();
    for row in rows {
        if row.eligible {
            eligible.push((row.id, row.dedup_day));
            continue;
        }
        let why = match op {
            Operation::Replay if row.is_replay => "is_a_replay",
            Operation::Replay if row.replayed => "already_replayed",
            Operation::Replay => "not_replayable",
            Operation::Cancel => "not_cancellable",
        };
        *report.skipped.entry(why.to_owned()).or_default() += 1;
    }
    eligible
}

/// Replays rows (each a new pending row linked to its original, carrying this request's trace).
async fn replay_rows(
    tx: &mut sqlx::PgConnection,
    rows: &[(OutboxId, NaiveDate)],
) -> Result<u64, ApiError> {
    let traceparent = telemetry::forward(&tracing::Span::current(), None);
    let (ids, days): (Vec<OutboxId>, Vec<NaiveDate>) = rows.iter().copied().unzip();
    Ok(tidings_store::replay::many(tx, &ids, &days, traceparent)
        .await
        .map_err(db("replaying outbox rows"))?)
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/replay", tag = "operators",
    request_body = BulkRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "One batch replayed (or, with `dry_run`, counted and sampled). Only failed or dropped rows that are not themselves replays and were not replayed before are replayed, once each; each replay is re-checked like any notification.", body = BulkReport),
        BodyRejected,
        BulkRejected,
        Unauthorized,
    )
)]
pub async fn bulk_replay(
    State(app): State<AppState>,
    _: Operator,
    JsonBody { value: req, .. }: JsonBody<BulkRequest>,
) -> Result<Json<BulkReport>, ApiError> {
    run(&app, Operation::Replay, req).await.map(Json)
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/cancel", tag = "operators",
    request_body = BulkRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "One batch cancelled (or, with `dry_run`, counted and sampled). Only pending and retrying rows are cancelled: they end `dropped` with reason `cancelled`.", body = BulkReport),
        BodyRejected,
        BulkRejected,
        Unauthorized,
    )
)]
pub async fn bulk_cancel(
    State(app): State<AppState>,
    _: Operator,
    JsonBody { value: req, .. }: JsonBody<BulkRequest>,
) -> Result<Json<BulkReport>, ApiError> {
    run(&app, Operation::Cancel, req).await.map(Json)
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/{id}/cancel", tag = "operators",
    params(("id" = Uuid, Path, description = "A pending or retrying outbox row")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The row is now `dropped` with reason `cancelled`", body = Cancelled),
        Unauthorized,
        NoSuchRow,
        (status = 409, description = "The row is not pending or retrying (a push may be out, or it has ended)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Cancelled>, ApiError> {
    let id = resource_id(id, "outbox row")?;
    let found = history::status_of(&app.pool, OutboxId(id))
        .await
        .map_err(db("reading an outbox row"))?;
    let (day, status) = found.ok_or(ApiError::NotFound("outbox row"))?;
    let mut tx = app
        .pool
        .begin()
        .await
        .map_err(db("cancelling an outbox row"))?;
    let cancelled = tidings_store::cancel::cancel(&mut tx, &[(OutboxId(id), day)]).await?;
    tx.commit().await.map_err(db("cancelling an outbox row"))?;
    if cancelled.count() == 0 {
        // Re-read: it may have been claimed or ended since the first read.
        let now = match history::status_of(&app.pool, OutboxId(id)).await {
            Ok(Some((_, now))) => now,
            Ok(None) | Err(_) => status,
        };
        return Err(ApiError::Conflict {
            kind: "not-cancellable",
            detail: format!("row {id} is {now}; only pending or retrying rows can be cancelled"),
        });
    }
    cancelled.observe();
    tracing::info!(outbox_id = %id, "outbox row cancelled");
    Ok(Json(Cancelled {
        id,
        status: tidings_domain::outbox::Status::Dropped,
        reason: Reason::Dropped(tidings_domain::outbox::DropReason::Cancelled),
    }))
}
