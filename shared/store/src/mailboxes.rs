//! Email devices (docs/email.md): registered unconfirmed with a confirmation link, confirmed by
//! it, unsubscribed by the signed link each mail carries. The confirmations sent are also what
//! the rate limits count, so they hold across api replicas and restarts.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tidings_domain::subscription::Deactivation;
use tidings_domain::{DeviceId, OutboxId, SubscriptionId};

use crate::devices::NewDevice;

/// A confirmation link: its token's hash, and until when it opens.
#[derive(Clone, Copy, Debug)]
pub struct NewConfirmation<'a> {
    pub token_hash: &'a [u8],
    pub expires_at: DateTime<Utc>,
}

/// An email device to register, unconfirmed.
pub struct NewMailbox<'a> {
    pub device: NewDevice<'a>,
    pub subscription: SubscriptionId,
    /// Lowercase, checked by the caller.
    pub address: &'a str,
    pub domain: &'a str,
    /// The link key, sealed for `subscription`.
    pub link_key: &'a str,
    pub confirmation: NewConfirmation<'a>,
}

/// How many confirmation mails may go: to one address in a day, to one domain in an hour.
#[derive(Clone, Copy, Debug)]
pub struct MailLimits {
    pub per_address_per_day: i64,
    pub per_domain_per_hour: i64,
}

/// Whether a confirmation may go, or which limit it is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowed {
    Yes,
    AddressLimited,
    DomainLimited,
}

/// Counts the confirmations sent to `address` and its `domain`, under a lock on the domain held
/// to the transaction's end, so concurrent registrations cannot both pass the last slot.
async fn allowed(
    tx: &mut sqlx::PgConnection,
    address: &str,
    domain: &str,
    limits: MailLimits,
) -> Result<Allowed, sqlx::Error> {
    let counts = sqlx::query!(
        r#"WITH l AS (SELECT pg_advisory_xact_lock(hashtextextended('email:' || $2, 0)))
           SELECT (SELECT count(*) FROM email_confirmations, l
                   WHERE address = $1 AND created_at > now() - interval '1 day') AS "address!",
                  (SELECT count(*) FROM email_confirmations, l
                   WHERE domain = $2 AND created_at > now() - interval '1 hour') AS "domain!""#,
        address,
        domain
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(if counts.address >= limits.per_address_per_day {
        Allowed::AddressLimited
    } else if counts.domain >= limits.per_domain_per_hour {
        Allowed::DomainLimited
    } else {
        Allowed::Yes
    })
}

/// Registers the email device `m`, unconfirmed, with its confirmation link, unless a limit says
/// no more mail may go to its address or domain now.
pub async fn register(
    pool: &PgPool,
    m: NewMailbox<'_>,
    limits: MailLimits,
) -> Result<Allowed, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let allowed = allowed(&mut tx, m.address, m.domain, limits).await?;
    if allowed != Allowed::Yes {
        return Ok(allowed);
    }
    sqlx::query!(
        "WITH d AS (INSERT INTO devices (id, token_hash, time_zone, locale, channel, preferences)
                    VALUES ($1, $2, $3, $4, 'email', $8) RETURNING id)
         INSERT INTO push_subscriptions (id, device_id, endpoint, channel, secret, unconfirmed)
         SELECT $5, d.id, 'mailto:' || $6, 'email', $7, true FROM d",
        m.device.id.0,
        m.device.token_hash,
        m.device.time_zone,
        m.device.locale,
        m.subscription.0,
        m.address,
        m.link_key,
        sqlx::types::Json(m.device.preferences) as _
    )
    .execute(&mut *tx)
    .await?;
    insert_confirmation(&mut tx, m.subscription, m.address, m.domain, m.confirmation).await?;
    tx.commit().await?;
    Ok(Allowed::Yes)
}

async fn insert_confirmation(
    tx: &mut sqlx::PgConnection,
    subscription: SubscriptionId,
    address: &str,
    domain: &str,
    c: NewConfirmation<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO email_confirmations (token_hash, subscription_id, address, domain, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
        c.token_hash,
        subscription.0,
        address,
        domain,
        c.expires_at
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// The address an email device's active subscription mails, and whether it waits for its
/// confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub subscription: SubscriptionId,
    pub address: String,
    pub unconfirmed: bool,
}

/// Device `device`'s active email subscription, if it has one.
pub async fn address(pool: &PgPool, device: DeviceId) -> Result<Option<Address>, sqlx::Error> {
    let found = sqlx::query!(
        r#"SELECT id AS "id: SubscriptionId", substr(endpoint, 8) AS "address!", unconfirmed
           FROM push_subscriptions
           WHERE device_id = $1 AND active AND channel = 'email'"#,
        device.0
    )
    .fetch_optional(pool)
    .await?;
    Ok(found.map(|r| Address {
        subscription: r.id,
        address: r.address,
        unconfirmed: r.unconfirmed,
    }))
}

/// A new confirmation link for `to` (still unconfirmed), unless a limit says no.
pub async fn resend(
    pool: &PgPool,
    to: &Address,
    domain: &str,
    c: NewConfirmation<'_>,
    limits: MailLimits,
) -> Result<Allowed, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let allowed = allowed(&mut tx, &to.address, domain, limits).await?;
    if allowed == Allowed::Yes {
        insert_confirmation(&mut tx, to.subscription, &to.address, domain, c).await?;
        tx.commit().await?;
    }
    Ok(allowed)
}

/// What a confirmation link did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    /// The subscription may be mailed from now on.
    Yes(SubscriptionId),
    /// It was opened before: nothing changed.
    AlreadyUsed,
    Expired,
    /// No such link, or its subscription is no longer active.
    Unknown,
}

/// Opens the confirmation link whose token hashes to `token_hash`: once, before it expires, for
/// a subscription still active. With the locale of the reader it was mailed to, if any (the
/// language of the page that answers).
pub async fn confirm(
    pool: &PgPool,
    token_hash: &[u8],
) -> Result<(Confirmed, Option<String>), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let link = sqlx::query!(
        r#"SELECT c.subscription_id AS "subscription: SubscriptionId", c.used_at,
                  c.expires_at <= now() AS "expired!", s.active, d.locale
           FROM email_confirmations c JOIN push_subscriptions s ON s.id = c.subscription_id
                JOIN devices d ON d.id = s.device_id
           WHERE c.token_hash = $1 FOR UPDATE OF c"#,
        token_hash
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(link) = link else {
        return Ok((Confirmed::Unknown, None));
    };
    let confirmed = match (link.used_at, link.expired, link.active) {
        (_, _, false) => Confirmed::Unknown,
        (Some(_), _, _) => Confirmed::AlreadyUsed,
        (None, true, _) => Confirmed::Expired,
        (None, false, true) => {
            sqlx::query!(
                "UPDATE email_confirmations SET used_at = now() WHERE token_hash = $1",
                token_hash
            )
            .execute(&mut *tx)
            .await?;
            sqlx::query!(
                "UPDATE push_subscriptions SET unconfirmed = false WHERE id = $1",
                link.subscription.0
            )
            .execute(&mut *tx)
            .await?;
            Confirmed::Yes(link.subscription)
        }
    };
    tx.commit().await?;
    Ok((confirmed, link.locale))
}

/// The locale of the reader a confirmation link (by its token's hash) was mailed to: the language
/// its pages speak, whatever became of the link.
pub async fn confirmation_locale(
    pool: &PgPool,
    token_hash: &[u8],
) -> Result<Option<String>, sqlx::Error> {
    let row = sqlx::query_scalar!(
        "SELECT d.locale FROM email_confirmations c
         JOIN push_subscriptions s ON s.id = c.subscription_id
         JOIN devices d ON d.id = s.device_id
         WHERE c.token_hash = $1",
        token_hash
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.flatten())
}

/// An email subscription's link key (sealed), whether it is still active, and its reader's
/// locale (the language of the pages its links open).
#[derive(Debug)]
pub struct Keyed {
    pub device: DeviceId,
    pub subscription: SubscriptionId,
    pub link_key: String,
    pub active: bool,
    pub locale: Option<String>,
}

/// Email subscription `id`'s link key.
pub async fn keyed(pool: &PgPool, id: SubscriptionId) -> Result<Option<Keyed>, sqlx::Error> {
    sqlx::query_as!(
        Keyed,
        r#"SELECT s.device_id AS "device: DeviceId", s.id AS "subscription: SubscriptionId",
                  s.secret AS "link_key!", s.active, d.locale
           FROM push_subscriptions s JOIN devices d ON d.id = s.device_id
           WHERE s.id = $1 AND s.channel = 'email' AND s.secret IS NOT NULL"#,
        id.0
    )
    .fetch_optional(pool)
    .await
}

/// The link key of the email subscription outbox row `id` was sent to.
pub async fn keyed_by_row(pool: &PgPool, id: OutboxId) -> Result<Option<Keyed>, sqlx::Error> {
    sqlx::query_as!(
        Keyed,
        r#"SELECT s.device_id AS "device: DeviceId", s.id AS "subscription: SubscriptionId",
                  s.secret AS "link_key!", s.active, d.locale
           FROM outbox o JOIN push_subscriptions s ON s.id = o.subscription_id
                JOIN devices d ON d.id = s.device_id
           WHERE o.id = $1 AND s.channel = 'email' AND s.secret IS NOT NULL"#,
        id.0
    )
    .fetch_optional(pool)
    .await
}

/// Stops mail to subscription `id` for `why` (its reader unsubscribed, or its mailbox bounced);
/// false if it was already stopped. Its pending rows are then dropped by the dispatcher's
/// pre-guard (`subscription_inactive`).
pub async fn deactivate(
    pool: &PgPool,
    id: SubscriptionId,
    why: Deactivation,
) -> Result<bool, sqlx::Error> {
    let changed = sqlx::query!(
        "UPDATE push_subscriptions
         SET active = false, deactivated_at = now(), deactivation_reason = $2
         WHERE id = $1 AND active AND channel = 'email'",
        id.0,
        why.as_str()
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(changed == 1)
}

/// Stops mail to every active email subscription of `address` (a relay or provider reported a
/// bounce or complaint for it); how many it stopped.
pub async fn deactivate_address(
    pool: &PgPool,
    address: &str,
    why: Deactivation,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query!(
        "UPDATE push_subscriptions
         SET active = false, deactivated_at = now(), deactivation_reason = $2
         WHERE channel = 'email' AND active AND endpoint = 'mailto:' || $1",
        address,
        why.as_str()
    )
    .execute(pool)
    .await?
    .rows_affected())
}
