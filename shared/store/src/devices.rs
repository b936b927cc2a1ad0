//! Devices and their push subscriptions as the api changes them: registering, authenticating,
//! replacing a subscription, removing, pausing, and what operators read of one.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use tidings_domain::preferences::PreferencesSpec;
use tidings_domain::subscription::Deactivation;
use tidings_domain::{Channel, DeviceId, SubscriptionId};

/// A Web Push subscription as the browser gave it.
#[derive(Debug, Clone, Copy)]
pub struct NewSubscription<'a> {
    pub id: SubscriptionId,
    pub endpoint: &'a str,
    pub p256dh: &'a str,
    pub auth: &'a str,
}

/// A device to register: its id, its token's hash, where it lives and what it reads.
pub struct NewDevice<'a> {
    pub id: DeviceId,
    pub token_hash: &'a [u8],
    pub time_zone: &'a str,
    /// BCP 47, checked by the caller; `None` reads English.
    pub locale: Option<&'a str>,
    /// Checked by the caller.
    pub preferences: &'a PreferencesSpec,
}

/// Inserts `device` with its first subscription.
pub async fn register(
    pool: &PgPool,
    device: NewDevice<'_>,
    sub: NewSubscription<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "WITH d AS (INSERT INTO devices (id, token_hash, time_zone, locale, preferences)
                    VALUES ($1, $2, $3, $8, $9) RETURNING id)
         INSERT INTO push_subscriptions (id, device_id, endpoint, p256dh, auth)
         SELECT $4, d.id, $5, $6, $7 FROM d",
        device.id.0,
        device.token_hash,
        device.time_zone,
        sub.id.0,
        sub.endpoint,
        sub.p256dh,
        sub.auth,
        device.locale,
        Json(device.preferences) as _
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The live device whose token hashes to `token_hash`.
pub async fn authenticate(
    pool: &PgPool,
    token_hash: &[u8],
) -> Result<Option<DeviceId>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT id AS "id: DeviceId" FROM devices WHERE token_hash = $1 AND removed_at IS NULL"#,
        token_hash
    )
    .fetch_optional(pool)
    .await
}

/// Whether a live device has this token.
pub async fn is_live(pool: &PgPool, token_hash: &[u8]) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM devices WHERE token_hash = $1 AND removed_at IS NULL)
               AS "live!""#,
        token_hash
    )
    .fetch_one(pool)
    .await
}

/// Makes `sub` device `device`'s only active subscription, in `conn`'s transaction so there is
/// never a moment with two, or none.
pub async fn replace_subscription(
    conn: &mut PgConnection,
    device: DeviceId,
    sub: NewSubscription<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE push_subscriptions SET active = false, deactivated_at = now(),
                deactivation_reason = $2
         WHERE device_id = $1 AND active",
        device.0,
        Deactivation::Replaced.as_str()
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "INSERT INTO push_subscriptions (id, device_id, endpoint, p256dh, auth)
         VALUES ($1, $2, $3, $4, $5)",
        sub.id.0,
        device.0,
        sub.endpoint,
        sub.p256dh,
        sub.auth
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Soft-deletes device `id` with its watches and subscriptions in one statement, so history
/// stays explainable and the dispatcher's pre-guard drops whatever is still pending.
pub async fn remove(pool: &PgPool, id: DeviceId) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "WITH d AS (UPDATE devices SET removed_at = now() WHERE id = $1 AND removed_at IS NULL RETURNING id),
              w AS (UPDATE watches SET removed_at = now(), updated_at = now()
                    WHERE device_id IN (SELECT id FROM d) AND removed_at IS NULL),
              s AS (UPDATE push_subscriptions SET active = false, deactivated_at = now(),
                           deactivation_reason = $2
                    WHERE device_id IN (SELECT id FROM d) AND active)
         SELECT count(*) FROM d",
        id.0,
        Deactivation::DeviceRemoved.as_str()
    )
    .fetch_one(pool)
    .await?;
    Ok(())
}

/// Pauses (keeping the first pause's time) or resumes device `id`; false if there is none.
pub async fn set_paused(pool: &PgPool, id: DeviceId, pause: bool) -> Result<bool, sqlx::Error> {
    let found = sqlx::query!(
        "UPDATE devices SET paused_at = CASE WHEN $2 THEN COALESCE(paused_at, now()) END
         WHERE id = $1",
        id.0,
        pause
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(found == 1)
}

/// A device as operators, and the device itself, see it.
#[derive(Debug)]
pub struct Device {
    pub id: DeviceId,
    pub time_zone: String,
    pub locale: Option<String>,
    pub preferences: Json<PreferencesSpec>,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    pub paused_at: Option<DateTime<Utc>>,
    pub watch_count: i32,
    pub channel: Channel,
}

pub async fn read(pool: &PgPool, id: DeviceId) -> Result<Option<Device>, sqlx::Error> {
    sqlx::query_as!(
        Device,
        r#"SELECT id AS "id: DeviceId", time_zone, locale,
                  preferences AS "preferences: Json<PreferencesSpec>", created_at, removed_at,
                  paused_at, watch_count, channel AS "channel: Channel"
           FROM devices WHERE id = $1"#,
        id.0
    )
    .fetch_optional(pool)
    .await
}

/// What a device may change of itself; each `None` leaves that as it is.
#[derive(Debug, Default)]
pub struct DeviceChange<'a> {
    /// `Some(None)`: back to English. Checked by the caller.
    pub locale: Option<Option<&'a str>>,
    /// Checked by the caller.
    pub preferences: Option<&'a PreferencesSpec>,
}

/// Applies `change` to live device `id`; `None` if it is gone.
pub async fn change(
    pool: &PgPool,
    id: DeviceId,
    change: &DeviceChange<'_>,
) -> Result<Option<Device>, sqlx::Error> {
    sqlx::query_as!(
        Device,
        r#"UPDATE devices SET locale = CASE WHEN $2 THEN $3 ELSE locale END,
                  preferences = coalesce($4, preferences)
           WHERE id = $1 AND removed_at IS NULL
           RETURNING id AS "id: DeviceId", time_zone, locale,
                  preferences AS "preferences: Json<PreferencesSpec>", created_at, removed_at,
                  paused_at, watch_count, channel AS "channel: Channel""#,
        id.0,
        change.locale.is_some(),
        change.locale.flatten(),
        change.preferences.map(Json) as _
    )
    .fetch_optional(pool)
    .await
}

/// A subscription as operators see it: its push service's host, never its keys.
#[derive(Debug)]
pub struct Subscription {
    pub id: SubscriptionId,
    pub push_host: Option<String>,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    pub deactivated_at: Option<DateTime<Utc>>,
    pub deactivation_reason: Option<Deactivation>,
}

/// Device `id`'s subscriptions, newest first.
pub async fn subscriptions(pool: &PgPool, id: DeviceId) -> Result<Vec<Subscription>, sqlx::Error> {
    sqlx::query_as!(
        Subscription,
        r#"SELECT id AS "id: SubscriptionId",
                  substring(endpoint FROM '^[a-z]+://([^/:?#]+)') AS push_host, active,
                  created_at, deactivated_at,
                  deactivation_reason AS "deactivation_reason: Deactivation"
           FROM push_subscriptions WHERE device_id = $1 ORDER BY created_at DESC"#,
        id.0
    )
    .fetch_all(pool)
    .await
}
