//! Rows to build a test story on, inserted directly (the api has its own tests).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tidings_shared::dedup::{dedup_day, parse_time_zone};
use tidings_shared::messages::{EnqueueRequest, VERSION};
use tidings_shared::trigger::{Baseline, Observation, Trigger};
use tidings_shared::{Channel, DeviceId, SubscriptionId, WatchId};

pub struct Device {
    pub id: DeviceId,
    pub time_zone: String,
}

pub async fn device(pool: &PgPool, time_zone: &str) -> Result<Device, sqlx::Error> {
    let id = DeviceId::new();
    let mut token_hash = id.0.as_bytes().to_vec();
    token_hash.extend_from_slice(id.0.as_bytes());
    sqlx::query("INSERT INTO devices (id, token_hash, time_zone) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(token_hash)
        .bind(time_zone)
        .execute(pool)
        .await?;
    Ok(Device {
        id,
        time_zone: time_zone.to_owned(),
    })
}

pub async fn subscription(
    pool: &PgPool,
    device: DeviceId,
    endpoint: &str,
    p256dh: &str,
    auth: &str,
) -> Result<SubscriptionId, sqlx::Error> {
    let id = SubscriptionId::new();
    sqlx::query(
        "INSERT INTO push_subscriptions (id, device_id, endpoint, p256dh, auth) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(device)
    .bind(endpoint)
    .bind(p256dh)
    .bind(auth)
    .execute(pool)
    .await?;
    Ok(id)
}

pub async fn watch(
    pool: &PgPool,
    device: DeviceId,
    item_code: &str,
    triggers: &[Trigger],
    reference_price: Option<i64>,
) -> Result<WatchId, sqlx::Error> {
    let id = WatchId::new();
    sqlx::query(
        "INSERT INTO watches (id, device_id, item_code, triggers, reference_price) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(device)
    .bind(item_code)
    .bind(sqlx::types::Json(triggers))
    .bind(reference_price)
    .execute(pool)
    .await?;
    Ok(id)
}

/// An EnqueueRequest as the detector would build it, with the dedup day in the device's zone.
pub fn enqueue_request(
    device: &Device,
    watch_id: WatchId,
    trigger: Trigger,
    price: i64,
    detected_at: DateTime<Utc>,
) -> EnqueueRequest {
    let tz = parse_time_zone(&device.time_zone).unwrap_or(chrono_tz_utc());
    EnqueueRequest {
        v: VERSION,
        watch_id,
        device_id: device.id,
        trigger,
        channel: Channel::WebPush,
        detected_at,
        detected: Observation {
            price,
            currency: "EUR".into(),
            in_stock: true,
            paused: false,
            observed_at: detected_at,
        },
        baseline: Baseline::default(),
        dedup_day: dedup_day(detected_at, tz),
    }
}

fn chrono_tz_utc() -> chrono_tz::Tz {
    chrono_tz::Tz::UTC
}

/// What inserting an EnqueueRequest into the outbox did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted {
    New(tidings_shared::OutboxId),
    Duplicate,
}

/// One outbox row, the way ingest writes it: `ON CONFLICT DO NOTHING` on the dedup key, and the
/// absence of a returned id is how a duplicate is reported.
pub async fn insert_outbox(pool: &PgPool, req: &EnqueueRequest) -> Result<Inserted, sqlx::Error> {
    let id = tidings_shared::OutboxId::new();
    let row: Option<(tidings_shared::OutboxId,)> = sqlx::query_as(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, trigger_spec, channel, dedup_day,
                             detected_at, detected, detected_baseline)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT ON CONSTRAINT outbox_dedup DO NOTHING
         RETURNING id",
    )
    .bind(id)
    .bind(req.watch_id)
    .bind(req.device_id)
    .bind(req.trigger.key())
    .bind(sqlx::types::Json(&req.trigger))
    .bind(req.channel.as_str())
    .bind(req.dedup_day)
    .bind(req.detected_at)
    .bind(sqlx::types::Json(&req.detected))
    .bind(sqlx::types::Json(&req.baseline))
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        Some((id,)) => Inserted::New(id),
        None => Inserted::Duplicate,
    })
}
