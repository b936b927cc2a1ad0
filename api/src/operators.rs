//! Operator endpoints over the outbox (admin token): find rows by state and reason, see one row's
//! delivery record, count what is where, and replay a terminal row as a new, linked row. Terminal
//! rows are never edited: the database refuses it.

use crate::AppState;
use crate::auth::Operator;
use crate::bulk::OutboxFilter;
use crate::extract::{ApiQuery, cursor, limit, page, resource_id};
use crate::history::with_attempts;
use crate::problem::{ApiError, BadListQuery, NoSuchRow, Problem, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use tidings_api_types::outbox::{OutboxList, OutboxRow, OutboxStats, Replayed, StateCount};
use tidings_domain::OutboxId;
use tidings_runtime::telemetry;
use tidings_store::{db, history};
use utoipa::IntoParams;
use uuid::Uuid;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListOutbox {
    #[param(value_type = Option<tidings_domain::outbox::Status>)]
    pub status: Option<String>,
    /// A drop or failure reason, e.g. `condition_lost`.
    #[param(value_type = Option<tidings_domain::outbox::Reason>)]
    pub reason: Option<String>,
    #[param(value_type = Option<tidings_domain::Channel>)]
    pub channel: Option<String>,
    pub device_id: Option<Uuid>,
    pub watch_id: Option<Uuid>,
    /// The watched item's code (no NUL: Postgres text cannot hold one).
    #[param(pattern = r"^[^\u0000]*$")]
    pub item: Option<String>,
    /// Rows with an attempt through this push service host (no NUL).
    #[param(pattern = r"^[^\u0000]*$")]
    pub push_host: Option<String>,
    /// Rows whose last push answer had this HTTP status.
    #[param(minimum = 0, maximum = 65535)]
    pub http_status: Option<u16>,
    /// Rows detected at or after this instant (RFC 3339).
    pub from: Option<DateTime<Utc>>,
    /// Rows detected before this instant (RFC 3339).
    pub to: Option<DateTime<Utc>>,
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<Uuid>)]
    pub cursor: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

impl ListOutbox {
    fn filter(&self) -> OutboxFilter {
        OutboxFilter {
            status: self.status.clone(),
            reason: self.reason.clone(),
            channel: self.channel.clone(),
            device_id: self.device_id,
            watch_id: self.watch_id,
            item: self.item.clone(),
            push_host: self.push_host.clone(),
            http_status: self.http_status,
            from: self.from,
            to: self.to,
        }
    }
}

/// Row `r` with its delivery record, as operators see it.
fn outbox_row(r: history::Delivery) -> OutboxRow {
    OutboxRow {
        notification: crate::history::notification(r.notification),
        device_id: r.device_id.0,
        attempt: r.attempt,
        retry_count: r.retry_count,
        next_attempt_at: r.next_attempt_at,
        lease_until: r.lease_until,
        deadline: r.deadline,
        last_error: r.last_error,
        http_status: r.http_status,
        push_message_id: r.push_message_id,
        subscription_id: r.subscription_id.map(|id| id.0),
        traceparent: r.traceparent,
        replays: r.replays.into_iter().map(|id| id.0).collect(),
    }
}

#[utoipa::path(
    get, path = "/v1/admin/outbox", tag = "operators",
    params(ListOutbox),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Outbox rows, newest first", body = OutboxList),
        BadListQuery,
        Unauthorized,
    )
)]
pub async fn list_outbox(
    State(app): State<AppState>,
    _: Operator,
    ApiQuery(q): ApiQuery<ListOutbox>,
) -> Result<Json<OutboxList>, ApiError> {
    let filter = q.filter().check()?;
    let before = cursor(q.cursor.as_deref())?;
    let limit = limit(q.limit)?;
    let rows = history::deliveries(&app.pool, &filter, before.map(OutboxId), limit + 1)
        .await
        .map_err(db("listing outbox rows"))?;
    let (mut items, next_cursor) =
        page(rows, limit, |r| r.notification.id.0.to_string(), outbox_row);
    with_attempts(&app, items.iter_mut().map(|r| &mut r.notification)).await?;
    let kept_from = tidings_store::partitions::kept_from(&app.pool)
        .await
        .map_err(db("reading how far the outbox reaches back"))?;
    Ok(Json(OutboxList {
        items,
        next_cursor,
        kept_from,
    }))
}

#[utoipa::path(
    get, path = "/v1/admin/outbox/{id}", tag = "operators",
    params(("id" = Uuid, Path, description = "Outbox row id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The row with its delivery record", body = OutboxRow),
        Unauthorized,
        NoSuchRow,
        (status = 405, description = "`replay` or `cancel` in place of an id: the path of the bulk route, which takes POST", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_outbox_row(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<OutboxRow>, ApiError> {
    let id = resource_id(id, "outbox row")?;
    let row = history::delivery(&app.pool, OutboxId(id))
        .await
        .map_err(db("reading an outbox row"))?;
    let mut row = outbox_row(row.ok_or(ApiError::NotFound("outbox row"))?);
    with_attempts(&app, std::iter::once(&mut row.notification)).await?;
    Ok(Json(row))
}

#[utoipa::path(
    get, path = "/v1/admin/outbox/stats", tag = "operators",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Counts by state and reason", body = OutboxStats),
        Unauthorized,
    )
)]
pub async fn outbox_stats(
    State(app): State<AppState>,
    _: Operator,
) -> Result<Json<OutboxStats>, ApiError> {
    let states = history::by_state_and_reason(&app.pool)
        .await
        .map_err(db("counting outbox rows"))?;
    let due = tidings_store::backlog::due(&app.pool)
        .await
        .map_err(db("measuring the due backlog"))?;
    Ok(Json(OutboxStats {
        states: states
            .into_iter()
            .map(|(status, reason, count)| StateCount {
                status,
                reason,
                count,
            })
            .collect(),
        due: due.rows,
        oldest_due_age_seconds: due.oldest_seconds,
    }))
}

#[utoipa::path(
    post, path = "/v1/admin/outbox/{id}/replay", tag = "operators",
    params(("id" = Uuid, Path, description = "A failed or dropped outbox row")),
    security(("admin_token" = [])),
    responses(
        (status = 201, description = "A new pending row linked to the old one; it goes through the re-check like any other", body = Replayed),
        Unauthorized,
        NoSuchRow,
        (status = 409, description = "The row is not failed or dropped, was already replayed, or is itself a replay", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn replay(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<Replayed>), ApiError> {
    let original = resource_id(id, "outbox row")?;
    let new = OutboxId::new();
    // The replay's trace is the operator's request (this span), linked to the notification it
    // replays: the new row carries this span's traceparent on through the pipeline.
    let request = tracing::Span::current();
    if telemetry::exporting() {
        let replayed = tidings_store::replay::traceparent_of(&app.pool, OutboxId(original))
            .await
            .map_err(db("reading an outbox row"))?;
        telemetry::add_link(&request, replayed.flatten().as_deref());
    }
    // The copy keeps the detection snapshot; the dispatcher re-checks it against the current
    // value and baseline as usual, so a replay never sends something that is no longer true.
    let inserted = tidings_store::replay::one(
        &app.pool,
        OutboxId(original),
        new,
        telemetry::forward(&request, None),
    )
    .await
    .map_err(db("replaying an outbox row"))?;
    if inserted {
        tracing::info!(outbox_id = %new, replay_of = %original, "outbox row replayed");
        return Ok((
            StatusCode::CREATED,
            Json(Replayed {
                id: new.0,
                replay_of: original,
            }),
        ));
    }
    let found = tidings_store::replay::replayability(&app.pool, OutboxId(original))
        .await
        .map_err(db("reading an outbox row"))?;
    match found.map(|r| (r.status, r.replayed_as, r.replay_of)) {
        None => Err(ApiError::NotFound("outbox row")),
        // One replay per notification: a replay of a replay would chain without end.
        Some((_, _, Some(first))) => Err(ApiError::Conflict {
            kind: "is-a-replay",
            detail: format!(
                "row {original} is itself a replay of {first}; a notification is replayed once"
            ),
        }),
        Some((_, Some(replay), None)) => Err(ApiError::Conflict {
            kind: "already-replayed",
            detail: format!("row {original} was already replayed as {replay}"),
        }),
        Some((status, None, None)) => Err(ApiError::Conflict {
            kind: "not-replayable",
            detail: format!(
                "row {original} is {status}; only failed or dropped rows can be replayed"
            ),
        }),
    }
}
