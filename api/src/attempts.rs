//! Delivery attempts: every push a notification went through, in full for operators
//! (`GET /v1/admin/outbox/{id}/attempts`) and summarised in a device's own history.

use crate::AppState;
use crate::auth::Operator;
use crate::extract::resource_id;
use crate::problem::{ApiError, Problem, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tidings_domain::OutboxId;
use tidings_store::attempts::Recorded;
use tidings_store::db;
use utoipa::ToSchema;
use uuid::Uuid;

/// One delivery attempt, as operators see it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptRecord {
    pub attempt: i32,
    /// When the pusher started it; absent when no result came (`lease_expired`).
    pub started_at: Option<DateTime<Utc>>,
    /// When its outcome was recorded.
    pub recorded_at: DateTime<Utc>,
    pub subscription_id: Option<Uuid>,
    /// The push service's host.
    pub push_host: Option<String>,
    /// `delivered`, `transient`, `gone`, `permanent`, `expired`, or `lease_expired` (no result
    /// before the lease ran out).
    pub outcome: String,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    /// The push service's message id (its `Location`).
    pub push_message_id: Option<String>,
    /// The notification's trace.
    pub trace_id: Option<String>,
}

impl AttemptRecord {
    fn new(r: Recorded) -> Self {
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
            // Every attempt of a row continues the row's trace.
            trace_id: r
                .traceparent
                .as_deref()
                .and_then(tidings_runtime::telemetry::trace_id_of),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptList {
    pub outbox_id: Uuid,
    /// First to last.
    pub items: Vec<AttemptRecord>,
}

#[utoipa::path(
    get, path = "/v1/admin/outbox/{id}/attempts", tag = "operators",
    params(("id" = Uuid, Path, description = "Outbox row id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The row's delivery attempts, first to last", body = AttemptList),
        Unauthorized,
        (status = 404, description = "No such row", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_attempts(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<AttemptList>, ApiError> {
    let id = resource_id(id, "outbox row")?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1)")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .map_err(db("reading an outbox row"))?;
    if !exists {
        return Err(ApiError::NotFound("outbox row"));
    }
    let items = tidings_store::attempts::of_row(&app.pool, OutboxId(id))
        .await
        .map_err(db("reading delivery attempts"))?
        .into_iter()
        .map(AttemptRecord::new)
        .collect();
    Ok(Json(AttemptList {
        outbox_id: id,
        items,
    }))
}

/// One delivery attempt, as the device sees it: when and how it ended, nothing internal.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptSummary {
    pub attempt: i32,
    pub at: DateTime<Utc>,
    /// `delivered`, `transient` (the push service was unavailable; tried again), `gone` (the
    /// subscription has expired), `permanent`, `expired` (too late to send), or `lease_expired`.
    pub outcome: String,
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
    let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
    let mut days: Vec<NaiveDate> = rows.iter().map(|r| r.1).collect();
    days.sort();
    days.dedup();
    let found: Vec<(Uuid, i32, DateTime<Utc>, String)> = sqlx::query_as(
        "SELECT outbox_id, attempt, COALESCE(started_at, recorded_at), outcome
         FROM outbox_attempts WHERE outbox_id = ANY($1) AND dedup_day = ANY($2)
         ORDER BY outbox_id, attempt",
    )
    .bind(ids)
    .bind(days)
    .fetch_all(&app.pool)
    .await
    .map_err(db("reading delivery attempts"))?;
    for (id, attempt, at, outcome) in found {
        out.entry(id).or_default().push(AttemptSummary {
            attempt,
            at,
            outcome,
        });
    }
    Ok(out)
}
