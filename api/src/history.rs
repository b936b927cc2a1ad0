//! A device's notification history: every outbox row for it, newest first, including the ones
//! Tidings withheld and why ("the price went back up before we sent it").

use crate::AppState;
use crate::attempts;
use crate::auth::Device;
use crate::extract::{ApiQuery, cursor, limit, page};
use crate::problem::{ApiError, Problem, Unauthorized};
use crate::watches::TriggerSpec;
use axum::Json;
use axum::extract::State;
use chrono::NaiveDate;
use serde::Deserialize;
use std::collections::HashMap;
use tidings_api_types::outbox::{Detected, Notification, NotificationList, ShownReport};
use tidings_domain::OutboxId;
use tidings_domain::outbox::{Delivery, Status};
use tidings_store::{db, history};
use utoipa::IntoParams;
use uuid::Uuid;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListNotifications {
    /// Only rows in this state.
    #[param(value_type = Option<tidings_domain::outbox::Status>)]
    pub status: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<Uuid>)]
    pub cursor: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// Row `r` as its device's history shows it (its attempts and what was shown are added by
/// [`with_attempts`]).
pub(crate) fn notification(r: history::Notification) -> Notification {
    Notification {
        id: r.id.0,
        watch_id: r.watch_id.0,
        item_code: r.item_code,
        trigger: TriggerSpec::from_trigger(r.trigger.trigger()),
        channel: r.channel,
        status: r.status,
        reason: r.reason,
        delivery: Delivery::of(r.status, r.reason, r.maybe_delivered),
        detected: Detected {
            price: r.detected_price,
            currency: r.detected_currency,
            in_stock: r.detected_in_stock,
            at: r.detected_at,
        },
        checked: r.checked,
        sent: r.sent_value,
        created_at: r.created_at,
        updated_at: r.updated_at,
        finished_at: r.finished_at,
        replay_of: r.replay_of.map(|id| id.0),
        withdraws: r.withdraws.map(|id| id.0),
        held: r.held,
        release_at: r.release_at,
        dedup_day: r.dedup_day,
        attempts: Vec::new(),
        shown: None,
    }
}

/// Fills in the attempts of a page of notifications, and what their devices reported showing.
pub(crate) async fn with_attempts<'a>(
    app: &AppState,
    notifications: impl Iterator<Item = &'a mut Notification>,
) -> Result<(), ApiError> {
    let mut page: Vec<&mut Notification> = notifications.collect();
    let keys: Vec<(Uuid, NaiveDate)> = page.iter().map(|n| (n.id, n.dedup_day)).collect();
    let mut found = attempts::summaries(app, &keys).await?;
    let ids: Vec<OutboxId> = keys.iter().map(|(id, _)| OutboxId(*id)).collect();
    let mut shown: HashMap<Uuid, ShownReport> = tidings_store::shown::reported(&app.pool, &ids)
        .await
        .map_err(db("reading what devices showed"))?
        .into_iter()
        .map(|(id, shown, at)| (id.0, ShownReport { shown, at }))
        .collect();
    for n in &mut page {
        n.attempts = found.remove(&n.id).unwrap_or_default();
        n.shown = shown.remove(&n.id);
    }
    Ok(())
}

pub fn status_filter(raw: Option<&str>) -> Result<Option<Status>, ApiError> {
    raw.map(|s| {
        s.parse::<Status>().map_err(|_| {
            ApiError::BadRequest(format!(
                "status `{s}` is not one of pending, retry, sending, sent, dropped, failed"
            ))
        })
    })
    .transpose()
}

#[utoipa::path(
    get, path = "/v1/notifications", tag = "history",
    params(ListNotifications),
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The device's notifications, newest first", body = NotificationList),
        (status = 400, description = "Bad status, cursor or limit", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
    )
)]
pub async fn list_notifications(
    State(app): State<AppState>,
    device: Device,
    ApiQuery(q): ApiQuery<ListNotifications>,
) -> Result<Json<NotificationList>, ApiError> {
    let status = status_filter(q.status.as_deref())?;
    let before = cursor(q.cursor.as_deref())?;
    let limit = limit(q.limit)?;
    let rows = history::of_device(
        &app.pool,
        device.id,
        status,
        before.map(OutboxId),
        limit + 1,
    )
    .await
    .map_err(db("listing notifications"))?;
    let (mut items, next_cursor) = page(rows, limit, |r| r.id.0.to_string(), notification);
    with_attempts(&app, items.iter_mut()).await?;
    let kept_from = tidings_store::partitions::kept_from(&app.pool)
        .await
        .map_err(db("reading how far the outbox reaches back"))?;
    Ok(Json(NotificationList {
        items,
        next_cursor,
        kept_from,
    }))
}
