//! A webhook endpoint's own deliveries: what Tidings sent it and how it answered, and its
//! recovery after an outage on its side, with the endpoint's token (docs/webhooks.md). Svix's
//! and Convoy's users do this themselves; so do Tidings' clients, without an operator.

use crate::AppState;
use crate::auth::Device;
use crate::extract::{ApiQuery, JsonBody, cursor, limit, page};
use crate::problem::{ApiError, BodyRejected, NoWebhookEndpoint, Problem, Unauthorized};
use axum::Json;
use axum::extract::State;
use chrono::Utc;
use serde::Deserialize;
use tidings_api_types::endpoints::{EndpointAttempt, EndpointAttemptList, Recover, Recovered};
use tidings_domain::OutboxId;
use tidings_runtime::telemetry;
use tidings_store::attempts::RowAttempts;
use tidings_store::{db, endpoints};
use utoipa::IntoParams;

/// How far back a recovery reaches: the outbox keeps rows at least this long.
const RECOVER_WITHIN: chrono::Duration = chrono::Duration::days(30);
/// Webhooks replayed per recovery call (`more` says to call again).
const RECOVER_BATCH: i64 = 1_000;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListAttempts {
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<uuid::Uuid>)]
    pub cursor: Option<String>,
    /// Webhooks per page (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// The device's webhook endpoint must exist (active or not): a Web Push device has none.
async fn require_endpoint(app: &AppState, device: &Device) -> Result<(), ApiError> {
    endpoints::view(&app.pool, device.id)
        .await
        .map_err(db("reading a webhook endpoint"))?
        .map(|_| ())
        .ok_or(ApiError::NotFound("webhook endpoint"))
}

fn attempts_of(row: RowAttempts) -> Vec<EndpointAttempt> {
    let status = row.status;
    row.attempts
        .into_iter()
        .rev()
        .map(move |r| EndpointAttempt {
            outbox_id: r.attempt.outbox_id.0,
            status,
            attempt: r.attempt.attempt,
            started_at: r.attempt.started_at,
            at: r.recorded_at,
            outcome: r.attempt.outcome,
            http_status: r.attempt.http_status,
            duration_ms: r.attempt.duration_ms,
            answer: r.attempt.error,
        })
        .collect()
}

#[utoipa::path(
    get, path = "/v1/endpoints/me/attempts", tag = "webhooks",
    params(ListAttempts),
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The endpoint's webhooks that were attempted, newest first, each with its attempts: status, duration and your answer's first bytes", body = EndpointAttemptList),
        (status = 400, description = "Bad cursor or limit", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        NoWebhookEndpoint,
    )
)]
pub async fn list_endpoint_attempts(
    State(app): State<AppState>,
    device: Device,
    ApiQuery(q): ApiQuery<ListAttempts>,
) -> Result<Json<EndpointAttemptList>, ApiError> {
    let before = cursor(q.cursor.as_deref())?;
    let limit = limit(q.limit)?;
    require_endpoint(&app, &device).await?;
    let rows =
        tidings_store::attempts::of_device(&app.pool, device.id, before.map(OutboxId), limit + 1)
            .await
            .map_err(db("listing a webhook endpoint's attempts"))?;
    let (webhooks, next_cursor) = page(rows, limit, |r| r.id.0.to_string(), attempts_of);
    Ok(Json(EndpointAttemptList {
        items: webhooks.into_iter().flatten().collect(),
        next_cursor,
    }))
}

#[utoipa::path(
    post, path = "/v1/endpoints/me/recover", tag = "webhooks",
    request_body = Recover,
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The endpoint's webhooks that ended failed or expired since `since`, and were not recovered yet, replayed (1,000 a call; `more` says to call again). Each is re-checked first and sent only if it still holds, with its own new `webhook-id`.", body = Recovered),
        BodyRejected,
        (status = 422, description = "A body of the wrong shape (not an object, an unknown field, `since` missing or not an RFC 3339 instant)", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        NoWebhookEndpoint,
    )
)]
pub async fn recover_endpoint(
    State(app): State<AppState>,
    device: Device,
    JsonBody { value: req, .. }: JsonBody<Recover>,
) -> Result<Json<Recovered>, ApiError> {
    // Further back than the outbox is sure to keep rows means from then.
    let since = req.since.max(Utc::now() - RECOVER_WITHIN);
    require_endpoint(&app, &device).await?;
    let traceparent = telemetry::forward(&tracing::Span::current(), None);
    let mut tx = app.pool.begin().await.map_err(db("starting a recovery"))?;
    let (replayed, more) =
        tidings_store::replay::recover(&mut tx, device.id, since, RECOVER_BATCH, traceparent)
            .await
            .map_err(db("replaying a webhook endpoint's failed deliveries"))?;
    tx.commit().await.map_err(db("committing a recovery"))?;
    tracing::info!(device_id = %device.id, %since, replayed, more, "webhook endpoint recovered its deliveries");
    Ok(Json(Recovered {
        replayed,
        more,
        since,
    }))
}
