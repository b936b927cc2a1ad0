//! Operators pausing and resuming a device or a watch, and looking at one.
//!
//! Pausing withholds instead of sending: a due notification of a paused device or watch is
//! dropped at the re-check (`device_paused`, `watch_paused`), just before it would have been
//! pushed, and the history says so. A paused watch is also left out of the detector's scans; a
//! paused device's watches are still scanned, so resuming it needs no catching up.

use crate::AppState;
use crate::auth::Operator;
use crate::extract::resource_id;
use crate::problem::{ApiError, NoSuchDevice, NoSuchWatch, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use std::collections::BTreeMap;
use tidings_api_types::objects::{DeviceView, SubscriptionView, WatchView};
use tidings_domain::outbox::Status;
use tidings_domain::{DeviceId, WatchId};
use tidings_store::{db, devices, watches};
use uuid::Uuid;

/// Subscription `s` as operators see it (no keys).
fn subscription_view(s: devices::Subscription) -> SubscriptionView {
    SubscriptionView {
        id: s.id.0,
        push_host: s.push_host,
        active: s.active,
        created_at: s.created_at,
        deactivated_at: s.deactivated_at,
        deactivation_reason: s.deactivation_reason,
    }
}

async fn device_view(app: &AppState, id: Uuid) -> Result<DeviceView, ApiError> {
    let row = devices::read(&app.pool, DeviceId(id))
        .await
        .map_err(db("reading a device"))?
        .ok_or(ApiError::NotFound("device"))?;
    let subscriptions = devices::subscriptions(&app.pool, DeviceId(id))
        .await
        .map_err(db("reading a device's subscriptions"))?;
    let outbox = tidings_store::counts::of_device(&app.pool, DeviceId(id))
        .await
        .map_err(db("counting a device's notifications"))?;
    Ok(DeviceView {
        id: row.id.0,
        channel: row.channel,
        time_zone: row.time_zone,
        locale: row.locale,
        preferences: row.preferences.0,
        created_at: row.created_at,
        removed_at: row.removed_at,
        paused_at: row.paused_at,
        watch_count: row.watch_count,
        subscriptions: subscriptions.into_iter().map(subscription_view).collect(),
        outbox: by_state(outbox),
    })
}

#[utoipa::path(
    get, path = "/v1/admin/devices/{id}", tag = "operators",
    params(("id" = Uuid, Path, description = "Device id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The device, its subscriptions and its notifications by status", body = DeviceView),
        Unauthorized,
        NoSuchDevice,
    )
)]
pub async fn admin_get_device(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<DeviceView>, ApiError> {
    let id = resource_id(id, "device")?;
    device_view(&app, id).await.map(Json)
}

async fn set_device_pause(
    app: &AppState,
    id: Uuid,
    pause: bool,
) -> Result<Json<DeviceView>, ApiError> {
    // Pausing twice keeps the first pause's time.
    let found = devices::set_paused(&app.pool, DeviceId(id), pause)
        .await
        .map_err(db("pausing or resuming a device"))?;
    if !found {
        return Err(ApiError::NotFound("device"));
    }
    tracing::info!(device_id = %id, paused = pause, "device paused or resumed by an operator");
    device_view(app, id).await.map(Json)
}

#[utoipa::path(
    post, path = "/v1/admin/devices/{id}/pause", tag = "operators",
    params(("id" = Uuid, Path, description = "Device id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Paused: its due notifications are withheld (`device_paused`) at the re-check until it is resumed", body = DeviceView),
        Unauthorized,
        NoSuchDevice,
    )
)]
pub async fn admin_pause_device(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<DeviceView>, ApiError> {
    let id = resource_id(id, "device")?;
    set_device_pause(&app, id, true).await
}

#[utoipa::path(
    post, path = "/v1/admin/devices/{id}/resume", tag = "operators",
    params(("id" = Uuid, Path, description = "Device id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Resumed: its notifications are sent again", body = DeviceView),
        Unauthorized,
        NoSuchDevice,
    )
)]
pub async fn admin_resume_device(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<DeviceView>, ApiError> {
    let id = resource_id(id, "device")?;
    set_device_pause(&app, id, false).await
}

async fn watch_view(app: &AppState, id: Uuid) -> Result<WatchView, ApiError> {
    let w = watches::inspect(&app.pool, WatchId(id))
        .await
        .map_err(db("reading a watch"))?
        .ok_or(ApiError::NotFound("watch"))?;
    let outbox = tidings_store::counts::of_watch(&app.pool, WatchId(id))
        .await
        .map_err(db("counting a watch's notifications"))?;
    Ok(WatchView {
        watch: crate::watches::watch_of(w.watch),
        device_id: w.device_id.0,
        removed_at: w.removed_at,
        outbox: by_state(outbox),
    })
}

#[utoipa::path(
    get, path = "/v1/admin/watches/{id}", tag = "operators",
    params(("id" = Uuid, Path, description = "Watch id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The watch and its notifications by status", body = WatchView),
        Unauthorized,
        NoSuchWatch,
    )
)]
pub async fn admin_get_watch(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WatchView>, ApiError> {
    let id = resource_id(id, "watch")?;
    watch_view(&app, id).await.map(Json)
}

async fn set_watch_pause(
    app: &AppState,
    id: Uuid,
    pause: bool,
) -> Result<Json<WatchView>, ApiError> {
    let changed = watches::set_paused(&app.pool, WatchId(id), pause)
        .await
        .map_err(db("pausing or resuming a watch"))?;
    if changed {
        tracing::info!(watch_id = %id, paused = pause, "watch paused or resumed by an operator");
    }
    // Already in that state, or absent (404 from the read).
    watch_view(app, id).await.map(Json)
}

#[utoipa::path(
    post, path = "/v1/admin/watches/{id}/pause", tag = "operators",
    params(("id" = Uuid, Path, description = "Watch id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Paused: not scanned, and its due notifications are withheld (`watch_paused`)", body = WatchView),
        Unauthorized,
        NoSuchWatch,
    )
)]
pub async fn admin_pause_watch(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WatchView>, ApiError> {
    let id = resource_id(id, "watch")?;
    set_watch_pause(&app, id, true).await
}

#[utoipa::path(
    post, path = "/v1/admin/watches/{id}/resume", tag = "operators",
    params(("id" = Uuid, Path, description = "Watch id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Resumed", body = WatchView),
        Unauthorized,
        NoSuchWatch,
    )
)]
pub async fn admin_resume_watch(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WatchView>, ApiError> {
    let id = resource_id(id, "watch")?;
    set_watch_pause(&app, id, false).await
}

/// Counts by state as the api shows them: keyed by the state's name.
fn by_state(counts: Vec<(Status, i64)>) -> BTreeMap<Status, i64> {
    counts.into_iter().collect()
}
