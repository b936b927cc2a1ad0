//! Watches: what the detector records on them (the item's stock state it last saw, and the first
//! price a `price_drop` watch is measured from), and what a device reads and changes of its own.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::{Json, Uuid};
use tidings_domain::preferences::PreferencesSpec;
use tidings_domain::trigger::Trigger;
use tidings_domain::{Channel, DeviceId, WatchId};

/// One watch's scan record; `None` leaves that column as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub watch_id: WatchId,
    pub in_stock: Option<bool>,
    /// Written only while the watch has no reference price yet.
    pub reference_price: Option<i64>,
}

/// Records what a scan saw, one statement for every watch (an `UPDATE … FROM` applies one joined
/// row per watch, so each watch appears once).
pub async fn record_seen(pool: &PgPool, seen: &[Seen]) -> Result<(), sqlx::Error> {
    if seen.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = seen.iter().map(|s| s.watch_id.0).collect();
    let states: Vec<Option<bool>> = seen.iter().map(|s| s.in_stock).collect();
    let prices: Vec<Option<i64>> = seen.iter().map(|s| s.reference_price).collect();
    sqlx::query!(
        "UPDATE watches w
         SET last_in_stock = COALESCE(u.s, w.last_in_stock),
             reference_price = COALESCE(w.reference_price, u.p)
         FROM UNNEST($1::uuid[], $2::bool[], $3::bigint[]) AS u(id, s, p)
         WHERE w.id = u.id",
        &ids,
        states as _,
        prices as _
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A watch as the api shows it to its device.
#[derive(Debug, Clone)]
pub struct Watch {
    pub id: WatchId,
    pub item_code: String,
    pub triggers: Json<Vec<Trigger>>,
    pub channel: Channel,
    pub paused: bool,
    /// The first price seen for the item: `price_drop`'s reference until a notification is sent.
    pub reference_price: Option<i64>,
    /// Whether its sent notifications are withdrawn when they stop holding.
    pub withdraw: bool,
    /// Whether its notifications go at once, whatever the preferences.
    pub urgent: bool,
    /// Its own preferences; `None`: its device's.
    pub preferences: Option<Json<PreferencesSpec>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `sqlx::query_as!` (`query_as Watch`) or `sqlx::query!` (`query`) of `$head`, the columns of
/// a [`Watch`] typed as it reads them, then `$tail`. The compile-time check reads only string
/// literals (joined with `+`), so the columns are written once here rather than in a constant.
macro_rules! watch_query {
    ($kind:ident $($ty:ident)?; $head:tt, $tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::$kind!(
            $($ty,)?
            $head
                + r#" id AS "id: WatchId", item_code, triggers AS "triggers: Json<Vec<Trigger>>",
                      channel AS "channel: Channel", paused, reference_price, withdraw,
                      urgent, preferences AS "preferences: Json<PreferencesSpec>",
                      created_at, updated_at "#
                + $tail
            $(, $arg)*
        )
    };
}

pub(crate) use watch_query;

/// Device `device`'s live watches after `after`, in id order, at most `limit`.
pub async fn list(
    pool: &PgPool,
    device: DeviceId,
    after: Option<WatchId>,
    limit: i64,
) -> Result<Vec<Watch>, sqlx::Error> {
    watch_query!(
        query_as Watch;
        "SELECT",
        "FROM watches
         WHERE device_id = $1 AND removed_at IS NULL AND ($2::uuid IS NULL OR id > $2)
         ORDER BY id LIMIT $3",
        device.0,
        after.map(|a| a.0),
        limit
    )
    .fetch_all(pool)
    .await
}

/// Live watch `id` if device `device` owns it.
pub async fn get(
    pool: &PgPool,
    id: WatchId,
    device: DeviceId,
) -> Result<Option<Watch>, sqlx::Error> {
    watch_query!(
        query_as Watch;
        "SELECT",
        "FROM watches WHERE id = $1 AND device_id = $2 AND removed_at IS NULL",
        id.0,
        device.0
    )
    .fetch_optional(pool)
    .await
}

/// What a device may change of its watch; each `None` leaves that as it is.
#[derive(Debug, Default)]
pub struct WatchChange {
    pub paused: Option<bool>,
    pub withdraw: Option<bool>,
    pub urgent: Option<bool>,
    /// `Some(None)`: back to the device's preferences.
    pub preferences: Option<Option<PreferencesSpec>>,
}

/// Applies `change` to live watch `id` of device `device`; `None` if it has no such watch.
pub async fn change_for_device(
    pool: &PgPool,
    id: WatchId,
    device: DeviceId,
    change: &WatchChange,
) -> Result<Option<Watch>, sqlx::Error> {
    let preferences = change.preferences.as_ref();
    watch_query!(
        query_as Watch;
        "UPDATE watches SET paused = coalesce($3, paused), withdraw = coalesce($4, withdraw),
                urgent = coalesce($5, urgent),
                preferences = CASE WHEN $6 THEN $7 ELSE preferences END,
                updated_at = now()
         WHERE id = $1 AND device_id = $2 AND removed_at IS NULL
         RETURNING",
        "",
        id.0,
        device.0,
        change.paused,
        change.withdraw,
        change.urgent,
        preferences.is_some(),
        preferences.and_then(|p| p.as_ref()).map(Json) as _
    )
    .fetch_optional(pool)
    .await
}

/// Soft-deletes live watch `id` of device `device` and gives its slot back under the device's
/// limit, in one statement; false if it has no such watch.
pub async fn remove(pool: &PgPool, id: WatchId, device: DeviceId) -> Result<bool, sqlx::Error> {
    let removed = sqlx::query_scalar!(
        "WITH w AS (UPDATE watches SET removed_at = now(), updated_at = now()
                    WHERE id = $1 AND device_id = $2 AND removed_at IS NULL RETURNING device_id),
              d AS (UPDATE devices SET watch_count = watch_count - 1
                    WHERE id IN (SELECT device_id FROM w) RETURNING id)
         SELECT count(*) FROM d HAVING count(*) > 0",
        id.0,
        device.0
    )
    .fetch_optional(pool)
    .await?;
    Ok(removed.is_some())
}

/// Whether watch `id` of device `device` is gone (deleted, or never its).
pub async fn is_removed(pool: &PgPool, id: WatchId, device: DeviceId) -> Result<bool, sqlx::Error> {
    let removed = sqlx::query_scalar!(
        r#"SELECT removed_at IS NOT NULL AS "removed!" FROM watches
           WHERE id = $1 AND device_id = $2"#,
        id.0,
        device.0
    )
    .fetch_optional(pool)
    .await?;
    Ok(removed.unwrap_or(true))
}

/// A watch as operators see it, removed or not.
#[derive(Debug, Clone)]
pub struct Inspected {
    pub watch: Watch,
    pub device_id: DeviceId,
    pub removed_at: Option<DateTime<Utc>>,
}

/// Watch `id` as operators see it.
pub async fn inspect(pool: &PgPool, id: WatchId) -> Result<Option<Inspected>, sqlx::Error> {
    let row = watch_query!(
        query;
        "SELECT",
        r#", device_id AS "device_id: DeviceId", removed_at FROM watches WHERE id = $1"#,
        id.0
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Inspected {
        watch: Watch {
            id: r.id,
            item_code: r.item_code,
            triggers: r.triggers,
            channel: r.channel,
            paused: r.paused,
            reference_price: r.reference_price,
            withdraw: r.withdraw,
            urgent: r.urgent,
            preferences: r.preferences,
            created_at: r.created_at,
            updated_at: r.updated_at,
        },
        device_id: r.device_id,
        removed_at: r.removed_at,
    }))
}

/// Pauses or resumes watch `id` for an operator; false if it was already so (or is absent).
pub async fn set_paused(pool: &PgPool, id: WatchId, paused: bool) -> Result<bool, sqlx::Error> {
    let changed = sqlx::query!(
        "UPDATE watches SET paused = $2, updated_at = now() WHERE id = $1 AND paused <> $2",
        id.0,
        paused
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(changed == 1)
}

/// The device of each of watches `ids` that exists (removed or not).
pub async fn owners(
    pool: &PgPool,
    ids: &[WatchId],
) -> Result<std::collections::HashMap<WatchId, DeviceId>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT id AS "id: WatchId", device_id AS "device_id: DeviceId"
           FROM watches WHERE id = ANY($1)"#,
        ids as _
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.device_id)).collect())
}
