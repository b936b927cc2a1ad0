//! Rows to build a test story on, inserted directly (the api has its own tests).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tidings_domain::dedup::{dedup_day, parse_time_zone};
use tidings_domain::messages::{
    EnqueueRequest, Payload, PushRequest, Subscription, Urgency, VERSION, encode,
};
use tidings_domain::subjects::{StreamKind, Subjects};
use tidings_domain::trigger::{Baseline, Observation, Trigger};
use tidings_domain::validity;
use tidings_domain::{Channel, DeviceId, OutboxId, SubscriptionId, WatchId};

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

/// Device `device` reads its notifications in BCP 47 `locale` from now on.
pub async fn set_locale(pool: &PgPool, device: DeviceId, locale: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE devices SET locale = $2 WHERE id = $1")
        .bind(device)
        .bind(locale)
        .execute(pool)
        .await?;
    Ok(())
}

/// `sub` as the device's active push subscription.
pub async fn subscription(
    pool: &PgPool,
    device: DeviceId,
    sub: &Subscription,
) -> Result<SubscriptionId, sqlx::Error> {
    let id = SubscriptionId::new();
    let sql = "INSERT INTO push_subscriptions (id, device_id, endpoint, p256dh, auth)
               VALUES ($1, $2, $3, $4, $5)";
    let query = sqlx::query(sql).bind(id).bind(device);
    let query = query.bind(&sub.endpoint).bind(&sub.p256dh).bind(&sub.auth);
    query.execute(pool).await?;
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

/// A device in UTC with one watch of `item` on `trigger`, and `days` pending rows of it, one a
/// day from 2026-11-20 (detected at 09:00 UTC).
pub async fn pending_rows(
    pool: &PgPool,
    item: &str,
    trigger: &Trigger,
    days: u32,
) -> Result<Vec<(OutboxId, chrono::NaiveDate)>, sqlx::Error> {
    let device = device(pool, "UTC").await?;
    let watch = watch(
        pool,
        device.id,
        item,
        std::slice::from_ref(trigger),
        Some(1500),
    )
    .await?;
    let mut rows = Vec::new();
    for day in 0..days {
        let at = chrono::TimeZone::with_ymd_and_hms(&chrono::Utc, 2026, 11, 20, 9, 0, 0)
            .single()
            .expect("a valid time")
            + chrono::Duration::days(i64::from(day));
        let req = enqueue_request(&device, watch, trigger.clone(), 1100, at);
        if let Inserted::New(id) = insert_outbox(pool, &req).await? {
            rows.push((id, req.dedup_day));
        }
    }
    Ok(rows)
}

/// `n` watches of `item` below 1200 (reference 1500), spread over ten devices in UTC that all
/// push to `sub`: a burst of `n` notifications once the item's price drops.
pub async fn crowd(
    pool: &PgPool,
    item: &str,
    sub: &Subscription,
    n: usize,
) -> Result<(), sqlx::Error> {
    let trigger = Trigger::PriceBelow { threshold: 1200 };
    for _ in 0..10 {
        let device = device(pool, "UTC").await?;
        subscription(pool, device.id, sub).await?;
        sqlx::query(
            "INSERT INTO watches (id, device_id, item_code, triggers, reference_price)
             SELECT gen_random_uuid(), $1, $2, $3, 1500 FROM generate_series(1, $4)",
        )
        .bind(device.id)
        .bind(item)
        .bind(sqlx::types::Json(vec![trigger.clone()]))
        .bind(i32::try_from(n / 10).unwrap_or(i32::MAX))
        .execute(pool)
        .await?;
    }
    Ok(())
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
        detected: Observation::on_sale(price, "EUR", detected_at),
        baseline: Baseline::default(),
        dedup_day: dedup_day(detected_at, tz),
        withdraws: None,
        traceparent: None,
    }
}

fn chrono_tz_utc() -> chrono_tz::Tz {
    chrono_tz::Tz::UTC
}

/// What inserting an EnqueueRequest into the outbox did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted {
    New(tidings_domain::OutboxId),
    Duplicate,
}

/// One outbox row, written by ingest's own insert (its week's partition made first, as ingest
/// does); a duplicate of the dedup key inserts nothing.
pub async fn insert_outbox(pool: &PgPool, req: &EnqueueRequest) -> Result<Inserted, sqlx::Error> {
    tidings_store::partitions::Partitions::default()
        .ensure(pool, [req.dedup_day])
        .await?;
    if tidings_store::enqueue::insert(pool, &[(req, None)]).await? == 0 {
        return Ok(Inserted::Duplicate);
    }
    let id = sqlx::query_scalar(
        "SELECT id FROM outbox WHERE watch_id = $1 AND trigger = $2 AND dedup_day = $3 AND channel = $4",
    )
    .bind(req.watch_id)
    .bind(req.announces().key())
    .bind(req.dedup_day)
    .bind(req.channel.as_str())
    .fetch_one(pool)
    .await?;
    Ok(Inserted::New(id))
}

/// A PushRequest as the dispatcher publishes it for `sub`: attempt 1, a deadline 30 s away, a
/// `price_below` notification of a new watch current for 20 minutes.
pub fn push_request(sub: &Subscription) -> PushRequest {
    let id = OutboxId::new();
    let watch = WatchId::new();
    let trigger = Trigger::PriceBelow { threshold: 1200 };
    PushRequest {
        v: VERSION,
        outbox_id: id,
        attempt: 1,
        deadline: Utc::now() + chrono::Duration::seconds(30),
        target: tidings_domain::messages::Target::WebPush(sub.clone()),
        payload: Payload {
            id: Some(id),
            tag: Some(validity::tag(watch, &trigger)),
            observed_at: Some(Utc::now()),
            valid_until: Some(Utc::now() + chrono::Duration::minutes(20)),
            withdraws: None,
            url: Some("https://shop.example/i/SKU-1".into()),
            data: serde_json::json!({"item": "SKU-1", "price": 1050}),
            ..Payload::new(
                "SKU-1 is below your price",
                "Now 10.50 EUR (your limit: 12.00 EUR).",
            )
        },
        ttl: 3600,
        urgency: Urgency::High,
        topic: validity::topic(watch, &trigger),
        dedup_day: None,
        recall: None,
        traceparent: None,
        members: Vec::new(),
    }
}

/// Publishes `req` (a PushRequest, or a PushRequests batch) on the push subject as the
/// dispatcher does, with `msg_id` as its `Nats-Msg-Id`; panics unless JetStream stores it.
pub async fn publish_push(
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
    req: &impl tidings_domain::messages::Message,
    msg_id: &str,
) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", msg_id);
    js.publish_with_headers(
        subjects.subject(StreamKind::Push, Channel::WebPush),
        headers,
        encode(req).into(),
    )
    .await
    .expect("publish PushRequest")
    .await
    .expect("PushRequest stored");
}
