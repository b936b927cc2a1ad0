//! API clients and the webhook endpoints they register (migration 0017). An endpoint is a device
//! (channel `webhook`) whose one active subscription is a URL with its signing secret, so it has
//! watches, history, attempts, pause and removal like any device.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Uuid;
use tidings_domain::sql::Count;
use tidings_domain::subscription::Deactivation;
use tidings_domain::{Channel, DeviceId, SubscriptionId};

/// An API client the operator issued a key to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId(pub Uuid);

/// Records a client under its key's hash.
pub async fn create_client(
    pool: &PgPool,
    id: ClientId,
    name: &str,
    key_hash: &[u8],
) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar!(
        "INSERT INTO api_clients (id, name, key_hash) VALUES ($1, $2, $3) RETURNING created_at",
        id.0,
        name,
        key_hash
    )
    .fetch_one(pool)
    .await
}

/// The unrevoked client holding the key with this hash.
pub async fn authenticate_client(
    pool: &PgPool,
    key_hash: &[u8],
) -> Result<Option<ClientId>, sqlx::Error> {
    let id = sqlx::query_scalar!(
        "SELECT id FROM api_clients WHERE key_hash = $1 AND revoked_at IS NULL",
        key_hash
    )
    .fetch_optional(pool)
    .await?;
    Ok(id.map(ClientId))
}

/// Revokes a client and, in the same statement, the endpoints it registered: their devices are
/// removed (their tokens stop working, their watches end, rows still due are withheld as for any
/// removed device) and their subscriptions deactivated with the reason `client_revoked`. A
/// revoked key is one nobody should trust, and nor is what it registered. False if there is no
/// such unrevoked client.
pub async fn revoke_client(pool: &PgPool, id: ClientId) -> Result<bool, sqlx::Error> {
    let revoked = sqlx::query_scalar!(
        r#"WITH c AS (UPDATE api_clients SET revoked_at = now()
                    WHERE id = $1 AND revoked_at IS NULL RETURNING id),
              d AS (UPDATE devices SET removed_at = now()
                    WHERE client_id IN (SELECT id FROM c) AND removed_at IS NULL RETURNING id),
              w AS (UPDATE watches SET removed_at = now(), updated_at = now()
                    WHERE device_id IN (SELECT id FROM d) AND removed_at IS NULL),
              s AS (UPDATE push_subscriptions SET active = false, deactivated_at = now(),
                           deactivation_reason = $2
                    WHERE device_id IN (SELECT id FROM d) AND active)
         SELECT count(*) AS "n!" FROM c"#,
        id.0,
        Deactivation::ClientRevoked.as_str()
    )
    .fetch_one(pool)
    .await?;
    Ok(revoked == 1)
}

/// An API client as operators see it.
#[derive(Debug, Clone)]
pub struct ClientView {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Endpoints it registered that are not removed.
    pub endpoints: i64,
}

/// Every client, newest first, with its endpoints counted.
pub async fn list_clients(pool: &PgPool) -> Result<Vec<ClientView>, sqlx::Error> {
    sqlx::query_as!(
        ClientView,
        r#"SELECT c.id, c.name, c.created_at, c.revoked_at,
                  (SELECT count(*) FROM devices d
                   WHERE d.client_id = c.id AND d.removed_at IS NULL) AS "endpoints!"
           FROM api_clients c ORDER BY c.created_at DESC, c.id DESC"#
    )
    .fetch_all(pool)
    .await
}

/// An endpoint to register, with the device that stands for it.
pub struct NewEndpoint<'a> {
    pub device: DeviceId,
    pub token_hash: &'a [u8],
    pub client: ClientId,
    pub time_zone: &'a str,
    pub locale: Option<&'a str>,
    pub subscription: SubscriptionId,
    pub url: &'a str,
    pub description: Option<&'a str>,
    /// As stored: sealed (`tidings_sealing`), or `whsec_…` as the client was given it.
    pub secret: &'a str,
}

/// Whether an endpoint was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    Yes,
    /// The client already has `max` endpoints that are not removed.
    AtQuota,
}

/// Inserts the endpoint's device and its subscription, unless its client already has `max`
/// endpoints. The client's row is locked first, so registrations of one client at once are
/// counted one after another (a count in the insert's own statement would read the snapshot
/// taken before it waited).
pub async fn register(
    pool: &PgPool,
    e: NewEndpoint<'_>,
    max: i64,
) -> Result<Registered, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query_scalar!(
        "SELECT id FROM api_clients WHERE id = $1 FOR UPDATE",
        e.client.0
    )
    .fetch_optional(&mut *tx)
    .await?;
    let held = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM devices WHERE client_id = $1 AND removed_at IS NULL"#,
        e.client.0
    )
    .fetch_one(&mut *tx)
    .await?;
    if held >= max {
        return Ok(Registered::AtQuota);
    }
    sqlx::query!(
        "WITH d AS (INSERT INTO devices (id, token_hash, time_zone, locale, channel, client_id)
                    VALUES ($1, $2, $3, $4, 'webhook', $5) RETURNING id)
         INSERT INTO push_subscriptions (id, device_id, endpoint, channel, description, secret)
         SELECT $6, d.id, $7, 'webhook', $8, $9 FROM d",
        e.device.0,
        e.token_hash,
        e.time_zone,
        e.locale,
        e.client.0,
        e.subscription.0,
        e.url,
        e.description,
        e.secret
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Registered::Yes)
}

/// Makes `secret` the signing secret of webhook subscription `subscription` (sealed for it); the
/// one it replaces keeps signing beside it until `previous_until`. `None` when it is no longer
/// active (removed, or disabled after its URL answered 410).
pub async fn rotate_secret(
    pool: &PgPool,
    subscription: SubscriptionId,
    secret: &str,
    previous_until: DateTime<Utc>,
) -> Result<Option<SubscriptionId>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"UPDATE push_subscriptions
           SET previous_secret = secret, previous_until = $3, secret = $2
           WHERE id = $1 AND active AND channel = 'webhook'
           RETURNING id AS "id: SubscriptionId""#,
        subscription.0,
        secret,
        previous_until
    )
    .fetch_optional(pool)
    .await
}

/// A webhook subscription's secrets as stored (see `tidings_sealing`).
#[derive(Debug, Clone)]
pub struct StoredSecrets {
    pub id: SubscriptionId,
    pub secret: String,
    pub previous_secret: Option<String>,
}

/// Up to `limit` webhook secrets and mail link keys (by subscription) after `after`, in id order
/// (a page).
pub async fn stored_secrets(
    pool: &PgPool,
    after: Option<SubscriptionId>,
    limit: i64,
) -> Result<Vec<StoredSecrets>, sqlx::Error> {
    sqlx::query_as!(
        StoredSecrets,
        r#"SELECT id AS "id: SubscriptionId", secret AS "secret!", previous_secret
           FROM push_subscriptions
           WHERE channel IN ('webhook', 'email') AND ($1::uuid IS NULL OR id > $1)
           ORDER BY id LIMIT $2"#,
        after.map(|a| a.0),
        limit
    )
    .fetch_all(pool)
    .await
}

/// How many stored webhook secrets (current and rotated-out) and mail link keys each sealing key
/// sealed, by key id; `None`: stored as given.
pub async fn sealing_keys_in_use(pool: &PgPool) -> Result<Vec<(Option<String>, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT CASE WHEN v.s LIKE 'sealed_.%' THEN split_part(v.s, '.', 2) END AS key_id,
                  count(*) AS "n!"
           FROM push_subscriptions p, LATERAL (VALUES (p.secret), (p.previous_secret)) AS v(s)
           WHERE p.channel IN ('webhook', 'email') AND v.s IS NOT NULL
           GROUP BY 1 ORDER BY 1 NULLS FIRST"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.key_id, r.n)).collect())
}

/// Replaces a subscription's stored secrets with `new`, unless they changed since `old` was
/// read (a rotation meanwhile): false then.
pub async fn replace_secrets(
    pool: &PgPool,
    old: &StoredSecrets,
    new: &StoredSecrets,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE push_subscriptions SET secret = $4, previous_secret = $5
         WHERE id = $1 AND secret = $2 AND previous_secret IS NOT DISTINCT FROM $3",
        old.id.0,
        old.secret,
        old.previous_secret as _,
        new.secret,
        new.previous_secret as _
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What a client reads of its endpoint.
#[derive(Debug, Clone)]
pub struct EndpointView {
    pub subscription_id: SubscriptionId,
    pub url: String,
    pub description: Option<String>,
    pub active: bool,
    pub deactivation_reason: Option<Deactivation>,
    pub deactivated_at: Option<DateTime<Utc>>,
    pub previous_until: Option<DateTime<Utc>>,
    pub consecutive_failures: i32,
    pub circuit_open_until: Option<DateTime<Utc>>,
    pub circuit_opens: u32,
    pub pace_per_second: Option<f64>,
    pub paced_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// The device's latest webhook subscription, active or not.
pub async fn view(pool: &PgPool, device: DeviceId) -> Result<Option<EndpointView>, sqlx::Error> {
    sqlx::query_as!(
        EndpointView,
        r#"SELECT id AS "subscription_id: SubscriptionId", endpoint AS url, description, active,
                  deactivation_reason AS "deactivation_reason: Deactivation",
                  deactivated_at, previous_until, consecutive_failures, circuit_open_until,
                  circuit_opens AS "circuit_opens: Count", pace_per_second, paced_until,
                  created_at
           FROM push_subscriptions WHERE device_id = $1 AND channel = 'webhook'
           ORDER BY active DESC, created_at DESC LIMIT 1"#,
        device.0
    )
    .fetch_optional(pool)
    .await
}

/// The channel of the live device with this token's hash.
pub async fn channel_of(pool: &PgPool, token_hash: &[u8]) -> Result<Option<Channel>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT channel AS "channel: Channel" FROM devices
           WHERE token_hash = $1 AND removed_at IS NULL"#,
        token_hash
    )
    .fetch_optional(pool)
    .await
}

/// The channel of device `id`.
pub async fn channel_of_device(
    pool: &PgPool,
    id: DeviceId,
) -> Result<Option<Channel>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT channel AS "channel: Channel" FROM devices WHERE id = $1"#,
        id.0
    )
    .fetch_optional(pool)
    .await
}

/// An endpoint whose breaker opened, for `doctor`.
#[derive(Debug)]
pub struct Opened {
    pub subscription_id: SubscriptionId,
    pub url: String,
    pub failing_since: Option<DateTime<Utc>>,
    pub circuit_open_until: Option<DateTime<Utc>>,
}

/// The `limit` active endpoints whose breaker opened longest ago (open or half-open).
pub async fn opened(pool: &PgPool, limit: i64) -> Result<Vec<Opened>, sqlx::Error> {
    sqlx::query_as!(
        Opened,
        r#"SELECT s.id AS "subscription_id: SubscriptionId", s.endpoint AS url, s.failing_since,
                  s.circuit_open_until
           FROM devices d
           JOIN push_subscriptions s ON s.device_id = d.id AND s.active
           WHERE d.client_id IS NOT NULL AND s.channel = 'webhook' AND s.circuit_opens > 0
           ORDER BY s.failing_since NULLS LAST LIMIT $1"#,
        limit
    )
    .fetch_all(pool)
    .await
}
