//! Delivery attempts: every push a notification went through, in full for operators
//! (`GET /v1/admin/outbox/{id}/attempts`) and summarised in a device's own history.

use crate::AppState;
use crate::auth::Operator;
use crate::extract::resource_id;
use crate::problem::{ApiError, NoSuchRow, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use chrono::NaiveDate;
use std::collections::HashMap;
use tidings_api_types::attempts::{AttemptList, AttemptRecord, AttemptSummary};
use tidings_domain::OutboxId;
use tidings_runtime::telemetry;
use tidings_store::attempts::{Recorded, merged};
use tidings_store::db;
use uuid::Uuid;

/// Attempt `r` as operators see it, in the row's trace `trace_id`.
fn attempt_record(r: Recorded, trace_id: Option<String>) -> AttemptRecord {
    let a = r.attempt;
    AttemptRecord {
        attempt: a.attempt,
        started_at: a.started_at,
        recorded_at: r.recorded_at,
        subscription_id: a.subscription_id.map(|s| s.0),
        push_host: a.push_host,
        outcome: a.outcome,
        http_status: a.http_status,
        error: a.error,
        duration_ms: a.duration_ms,
        push_message_id: a.push_message_id,
        trace_id,
    }
}

#[utoipa::path(
    get, path = "/v1/admin/outbox/{id}/attempts", tag = "operators",
    params(("id" = Uuid, Path, description = "Outbox row id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The row's delivery attempts, first to last", body = AttemptList),
        Unauthorized,
        NoSuchRow,
    )
)]
pub async fn list_attempts(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<AttemptList>, ApiError> {
    let id = resource_id(id, "outbox row")?;
    let (found, traceparent) = tidings_store::attempts::of_row(&app.pool, OutboxId(id))
        .await
        .map_err(db("reading delivery attempts"))?
        .ok_or(ApiError::NotFound("outbox row"))?;
    // Every attempt of a row continues the row's trace.
    let trace_id = traceparent.as_deref().and_then(telemetry::trace_id_of);
    let items = found
        .into_iter()
        .map(|r| attempt_record(r, trace_id.clone()))
        .collect();
    Ok(Json(AttemptList {
        outbox_id: id,
        items,
    }))
}

/// The attempts of a page of rows, by row. One query; the days prune it to their partitions.
pub(crate) async fn summaries(
    app: &AppState,
    rows: &[(Uuid, NaiveDate)],
) -> Result<HashMap<Uuid, Vec<AttemptSummary>>, ApiError> {
    let mut out: HashMap<Uuid, Vec<AttemptSummary>> = HashMap::new();
    if rows.is_empty() {
        return Ok(out);
    }
    let ids: Vec<OutboxId> = rows.iter().map(|r| OutboxId(r.0)).collect();
    let mut days: Vec<NaiveDate> = rows.iter().map(|r| r.1).collect();
    days.sort();
    days.dedup();
    let endings = tidings_store::attempts::endings(&app.pool, &ids, &days)
        .await
        .map_err(db("reading how rows ended"))?;
    let mut recorded: HashMap<Uuid, Vec<Recorded>> = HashMap::new();
    for r in tidings_store::attempts::recorded(&app.pool, &ids, &days)
        .await
        .map_err(db("reading delivery attempts"))?
    {
        recorded.entry(r.attempt.outbox_id.0).or_default().push(r);
    }
    for ending in endings {
        let found = recorded.remove(&ending.id.0).unwrap_or_default();
        let summaries = merged(found, &ending)
            .into_iter()
            .map(|r| AttemptSummary {
                attempt: r.attempt.attempt,
                at: r.attempt.started_at.unwrap_or(r.recorded_at),
                outcome: r.attempt.outcome,
            })
            .collect();
        out.insert(ending.id.0, summaries);
    }
    Ok(out)
}
