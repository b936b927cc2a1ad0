//! Checked again when shown (docs/design.md, *True on the screen*): a device's service worker,
//! about to show a push, asks whether the notification still holds and gets the text to show;
//! afterwards it reports what it showed.
//!
//! The api asks the catalog itself, on demand, rather than reading what a detector saw last:
//! the detectors keep their observations in memory, sharded, and a scan may be a minute old. A
//! push goes to every device watching an item at once, so the answer for an item is kept for
//! `TIDINGS_API_CHECK_CACHE` (10 s) and concurrent checks of one item share one request.

use crate::AppState;
use crate::auth::Device;
use crate::extract::{JsonBody, resource_id};
use crate::problem::{ApiError, BodyRejected, NoSuchDevicesNotification, Problem, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidings_api_types::outbox::{NotificationNow, ShownIn};
use tidings_domain::dedup::parse_time_zone;
use tidings_domain::notification::Notice;
use tidings_domain::shown::showing;
use tidings_domain::trigger::Observation;
use tidings_domain::{DeviceId, ItemCode, OutboxId};
use tidings_source::{Fetched, SourceConfig, SourceConfigError, Sources};
use tidings_store::db;
use tokio::sync::OnceCell;

/// Items whose answers are kept at most; past it the expired ones are forgotten.
const MAX_CACHED: usize = 10_000;

type Answer = Arc<OnceCell<(Instant, DateTime<Utc>, Fetched)>>;

/// The catalog as show-time checks read it: one request per item per `keep`.
pub struct Catalog {
    source: Sources,
    keep: Duration,
    answers: Mutex<HashMap<ItemCode, Answer>>,
}

impl Catalog {
    pub fn new(config: SourceConfig, keep: Duration) -> Result<Self, SourceConfigError> {
        Ok(Catalog {
            source: Sources::new(config)?,
            keep,
            answers: Mutex::new(HashMap::new()),
        })
    }

    /// The sources it reads, which also say what item a new watch means.
    pub fn sources(&self) -> &Sources {
        &self.source
    }

    /// `item` now (at most `keep` old), and when it was read.
    async fn now(&self, item: &ItemCode) -> (DateTime<Utc>, Fetched) {
        let cell = {
            let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = |a: &Answer| a.get().is_none_or(|(at, ..)| at.elapsed() < self.keep);
            if answers.len() >= MAX_CACHED {
                answers.retain(|_, a| fresh(a));
            }
            match answers.get(item) {
                Some(a) if fresh(a) => a.clone(),
                _ => {
                    let a = Answer::default();
                    answers.insert(item.clone(), a.clone());
                    a
                }
            }
        };
        let (_, at, fetched) = cell
            .get_or_init(|| async { (Instant::now(), Utc::now(), self.source.fetch(item).await) })
            .await;
        (*at, fetched.clone())
    }
}

/// The item's value now, as the catalog answers at `checked_at`: an item gone or with nothing to
/// sell reads as not on sale, which no notification survives; no catalog, or no answer, is a 503
/// (the service worker then shows the notification as of its time).
async fn value_now(
    app: &AppState,
    item_code: Option<&str>,
    sent: &Observation,
    id: OutboxId,
) -> Result<(ItemCode, DateTime<Utc>, Observation), ApiError> {
    let (Some(catalog), Some(item)) = (
        app.catalog.as_deref(),
        item_code.and_then(|c| ItemCode::parse(c).ok()),
    ) else {
        return Err(ApiError::Unavailable(
            "no catalog to check the notification against".into(),
        ));
    };
    let (checked_at, fetched) = catalog.now(&item).await;
    match fetched {
        Ok(now) => Ok((item, checked_at, now)),
        Err(e) if !e.kind.is_transient() => {
            let gone = Observation {
                paused: true,
                observed_at: checked_at,
                ..sent.clone()
            };
            Ok((item, checked_at, gone))
        }
        Err(e) => {
            tracing::info!(outbox_id = %id, item = %item, error = %e, "show-time check: the catalog did not answer");
            Err(ApiError::Unavailable(format!(
                "the catalog did not answer ({})",
                e.kind
            )))
        }
    }
}

#[utoipa::path(
    get, path = "/v1/notifications/{id}/now", tag = "history",
    params(("id" = uuid::Uuid, Path, description = "A notification of this device (the push payload's `id`)")),
    security(("device_token" = [])),
    responses(
        (status = 200, description = "Whether it still holds at the item's current value, and what to show", body = NotificationNow),
        Unauthorized,
        NoSuchDevicesNotification,
        (status = 503, description = "The catalog did not answer (or none is configured): show the notification as of its time", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn notification_now(
    State(app): State<AppState>,
    device: Device,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<NotificationNow>, ApiError> {
    let id = OutboxId(resource_id(id, "notification")?);
    Ok(Json(check(&app, device.id, id).await?.now))
}

/// A notification checked against the item's value now, and where its reader lives.
pub struct Checked {
    pub now: NotificationNow,
    pub tz: chrono_tz::Tz,
    pub locale: Option<String>,
}

/// Device `device`'s notification `id`, checked against the item's value now.
pub async fn check(app: &AppState, device: DeviceId, id: OutboxId) -> Result<Checked, ApiError> {
    let row = tidings_store::shown::to_show(&app.pool, device, id)
        .await
        .map_err(db("reading a notification to show"))?
        .ok_or(ApiError::NotFound("notification"))?;
    // A withdrawal says what changed when it was sent; the service worker shows it as sent.
    if row.trigger.is_withdrawal() {
        return Err(ApiError::NotFound(
            "notification to check (not a withdrawal)",
        ));
    }
    let sent = row
        .sent_value
        .as_ref()
        .map(|v| v.0.clone())
        .ok_or(ApiError::NotFound("sent notification"))?;
    let (item, checked_at, now) = value_now(app, row.item_code.as_deref(), &sent, id).await?;
    let tz = parse_time_zone(&row.time_zone).unwrap_or(chrono_tz::Tz::UTC);
    let showing = showing(
        &Notice {
            id,
            watch: row.watch_id,
            trigger: row.trigger.trigger(),
            item: &item,
            now: &now,
            baseline: &row.baseline(),
            valid_until: row.valid_until.unwrap_or(checked_at),
            item_url: None,
            locale: row.locale.as_deref(),
        },
        &sent,
        tz,
    );
    Ok(Checked {
        now: NotificationNow {
            id: id.0,
            holds: showing.holds,
            shown: showing.shown,
            title: showing.title,
            body: showing.body,
            checked_at,
        },
        tz,
        locale: row.locale,
    })
}

#[utoipa::path(
    post, path = "/v1/notifications/{id}/shown", tag = "history",
    params(("id" = uuid::Uuid, Path, description = "A notification of this device")),
    request_body = ShownIn,
    security(("device_token" = [])),
    responses(
        (status = 204, description = "Recorded; the history shows it"),
        BodyRejected,
        (status = 422, description = "A body of the wrong shape (not an object, an unknown `shown`, an unknown field)", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        NoSuchDevicesNotification,
    )
)]
pub async fn report_shown(
    State(app): State<AppState>,
    device: Device,
    id: Result<Path<String>, PathRejection>,
    JsonBody { value: report, .. }: JsonBody<ShownIn>,
) -> Result<StatusCode, ApiError> {
    let id = OutboxId(resource_id(id, "notification")?);
    let row = tidings_store::shown::to_show(&app.pool, device.id, id)
        .await
        .map_err(db("reading a notification to show"))?
        .ok_or(ApiError::NotFound("notification"))?;
    tidings_store::shown::record(&app.pool, device.id, id, row.dedup_day, report.shown)
        .await
        .map_err(db("recording what a device showed"))?;
    Ok(StatusCode::NO_CONTENT)
}
