//! A notification as its device is about to show it, and what the device reports it showed
//! (`notifications_shown`, migration 0015).

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;
use sqlx::types::Json;
use tidings_domain::shown::Shown;
use tidings_domain::trigger::{Baseline, Observation};
use tidings_domain::withdrawal::Announces;
use tidings_domain::{DeviceId, OutboxId, WatchId};

/// What the check of a shown notification needs: what it said and where its reader lives.
#[derive(Debug)]
pub struct ToShow {
    pub id: OutboxId,
    pub dedup_day: NaiveDate,
    pub watch_id: WatchId,
    /// `None` once the watch is gone.
    pub item_code: Option<String>,
    pub trigger: Announces,
    /// The value the notification stated; `None` while it was never dispatched.
    pub sent_value: Option<Json<Observation>>,
    pub baseline_price: Option<i64>,
    pub baseline_reference: Option<i64>,
    pub baseline_in_stock: Option<bool>,
    pub valid_until: Option<DateTime<Utc>>,
    pub time_zone: String,
    pub locale: Option<String>,
}

impl ToShow {
    /// The baseline the notification was decided against (the detection's).
    pub fn baseline(&self) -> Baseline {
        Baseline {
            price: self.baseline_price,
            reference: self.baseline_reference,
            in_stock: self.baseline_in_stock,
        }
    }
}

/// Row `id` if it is `device`'s.
pub async fn to_show(
    pool: &PgPool,
    device: DeviceId,
    id: OutboxId,
) -> Result<Option<ToShow>, sqlx::Error> {
    sqlx::query_as!(
        ToShow,
        r#"SELECT o.id AS "id: OutboxId", o.dedup_day, o.watch_id AS "watch_id: WatchId",
                  w.item_code AS "item_code?", o.trigger AS "trigger: Announces",
                  o.sent_value AS "sent_value: Json<Observation>",
                  o.baseline_price, o.baseline_reference, o.baseline_in_stock,
                  (o.payload->>'valid_until')::timestamptz AS valid_until,
                  d.time_zone, d.locale
           FROM outbox o
           JOIN devices d ON d.id = o.device_id
           LEFT JOIN watches w ON w.id = o.watch_id
           WHERE o.id = $1 AND o.device_id = $2"#,
        id.0,
        device.0
    )
    .fetch_optional(pool)
    .await
}

/// Records that `device` showed row `id` (of `dedup_day`) as `shown`; a later report replaces
/// an earlier one.
pub async fn record(
    pool: &PgPool,
    device: DeviceId,
    id: OutboxId,
    dedup_day: NaiveDate,
    shown: Shown,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO notifications_shown (outbox_id, dedup_day, device_id, shown)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (outbox_id) DO UPDATE SET shown = excluded.shown, at = now()",
        id.0,
        dedup_day,
        device.0,
        shown.as_str()
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What the device reported it showed for each of `ids`.
pub async fn reported(
    pool: &PgPool,
    ids: &[OutboxId],
) -> Result<Vec<(OutboxId, Shown, DateTime<Utc>)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT outbox_id AS "outbox_id: OutboxId", shown AS "shown: Shown", at
           FROM notifications_shown WHERE outbox_id = ANY($1)"#,
        ids as _
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.outbox_id, r.shown, r.at))
        .collect())
}

/// Deletes the reports of days before `kept_from`, whose notifications retention removed.
pub async fn purge_before(pool: &PgPool, kept_from: NaiveDate) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query!(
        "DELETE FROM notifications_shown WHERE dedup_day < $1",
        kept_from
    )
    .execute(pool)
    .await?
    .rows_affected())
}
