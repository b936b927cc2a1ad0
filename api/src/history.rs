//! A device's notification history: every outbox row for it, newest first, including the ones
//! Tidings withheld and why ("the price went back up before we sent it").

use crate::AppState;
use crate::attempts::{self, AttemptSummary};
use crate::auth::Device;
use crate::extract::{ApiQuery, cursor, limit, page};
use crate::problem::{ApiError, Problem, Unauthorized};
use crate::watches::TriggerSpec;
use axum::Json;
use axum::extract::State;
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use tidings_domain::outbox::{Delivery, Reason, Status};
use tidings_domain::trigger::Trigger;
use tidings_store::db;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// What detection saw.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Detected {
    pub price: i64,
    pub currency: String,
    pub in_stock: bool,
    pub at: DateTime<Utc>,
}

/// One notification, from detection to its outcome.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Notification {
    pub id: Uuid,
    pub watch_id: Uuid,
    pub item_code: Option<String>,
    pub trigger: Option<TriggerSpec>,
    pub channel: String,
    pub status: Status,
    /// Why a row was dropped (withheld) or failed, e.g. `condition_lost`.
    pub reason: Option<String>,
    /// What it means for the device: `in_progress`, `delivered`, `withheld`, `not_delivered`, or
    /// `may_have_been_delivered` (no confirmed delivery, but an attempt timed out after it was
    /// sent, so the notification may have arrived).
    #[schema(value_type = String)]
    pub delivery: Delivery,
    pub detected: Detected,
    /// The value seen by the re-check right before sending (recorded when it withheld the row).
    #[schema(value_type = Option<Object>)]
    pub checked: Option<serde_json::Value>,
    /// The value that was sent, when one was.
    #[schema(value_type = Option<Object>)]
    pub sent: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Set on an operator replay: the row it replays.
    pub replay_of: Option<Uuid>,
    /// The day its dedup key counts (one notification per watch, trigger and day).
    pub dedup_day: NaiveDate,
    /// Its delivery attempts, first to last.
    #[serde(default)]
    pub attempts: Vec<AttemptSummary>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotificationList {
    pub items: Vec<Notification>,
    pub next_cursor: Option<String>,
    /// How far back history reaches: notifications detected before this day have left with
    /// the retention (TIDINGS_RETENTION, at least 8 days).
    pub kept_from: Option<NaiveDate>,
}

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

#[derive(sqlx::FromRow)]
pub(crate) struct NotificationRow {
    id: Uuid,
    watch_id: Uuid,
    item_code: Option<String>,
    trigger: String,
    channel: String,
    status: Status,
    reason: Option<String>,
    detected_price: i64,
    detected_currency: String,
    detected_in_stock: bool,
    detected_at: DateTime<Utc>,
    checked: Option<serde_json::Value>,
    sent_value: Option<serde_json::Value>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    replay_of: Option<Uuid>,
    maybe_delivered: bool,
    dedup_day: NaiveDate,
}

impl NotificationRow {
    pub(crate) fn id(&self) -> Uuid {
        self.id
    }
}

pub(crate) const NOTIFICATION_COLUMNS: &str =
    "o.id, o.watch_id, w.item_code, o.trigger, o.channel, o.status, o.reason,
     o.detected_price, o.detected_currency, o.detected_in_stock, o.detected_at, o.checked,
     o.sent_value, o.created_at, o.updated_at, o.finished_at, o.replay_of, o.maybe_delivered,
     o.dedup_day";

impl From<NotificationRow> for Notification {
    fn from(r: NotificationRow) -> Self {
        let delivery = Delivery::of(
            r.status,
            r.reason.as_deref().and_then(Reason::parse),
            r.maybe_delivered,
        );
        Notification {
            id: r.id,
            watch_id: r.watch_id,
            item_code: r.item_code,
            trigger: Trigger::from_key(&r.trigger).map(|t| TriggerSpec::from_trigger(&t)),
            channel: r.channel,
            status: r.status,
            reason: r.reason,
            delivery,
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
            replay_of: r.replay_of,
            dedup_day: r.dedup_day,
            attempts: Vec::new(),
        }
    }
}

/// Fills in the attempts of a page of notifications.
pub(crate) async fn with_attempts<'a>(
    app: &AppState,
    notifications: impl Iterator<Item = &'a mut Notification>,
) -> Result<(), ApiError> {
    let mut page: Vec<&mut Notification> = notifications.collect();
    let keys: Vec<(Uuid, NaiveDate)> = page.iter().map(|n| (n.id, n.dedup_day)).collect();
    let mut found = attempts::summaries(app, &keys).await?;
    for n in &mut page {
        n.attempts = found.remove(&n.id).unwrap_or_default();
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
    // UUIDv7 ids are time-ordered: "newest first" is id order, served by outbox_device.
    let rows: Vec<NotificationRow> = sqlx::query_as(&format!(
        "SELECT {NOTIFICATION_COLUMNS}
         FROM outbox o LEFT JOIN watches w ON w.id = o.watch_id
         WHERE o.device_id = $1 AND ($2::text IS NULL OR o.status = $2)
           AND ($3::uuid IS NULL OR o.id < $3)
         ORDER BY o.id DESC LIMIT $4"
    ))
    .bind(device.id)
    .bind(status.map(Status::as_str))
    .bind(before)
    .bind(limit + 1)
    .fetch_all(&app.pool)
    .await
    .map_err(db("listing notifications"))?;
    let (mut items, next_cursor) = page(rows, limit, |r| r.id, Notification::from);
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
