//! Creating watches under a device's limit.
//!
//! Both statements keep the same promises: each create is authenticated (by its device's token
//! hash, or by an id the caller authenticated), and no device ever exceeds its watch limit. The
//! shared statement ([`many`]) locks the devices it adds to (in id order, so two statements
//! cannot deadlock) and counts from the locked, latest row; the one-create statements increment
//! the counter only while it is under the limit.

use crate::watches::Watch;
use chrono::{DateTime, Utc};
use sqlx::types::{Json, Uuid};
use sqlx::{PgConnection, PgPool};
use tidings_domain::preferences::PreferencesSpec;
use tidings_domain::trigger::Trigger;
use tidings_domain::{Channel, DeviceId, ItemCode, WatchId};

/// A validated create, ready to insert.
#[derive(Debug, Clone)]
pub struct NewWatch {
    pub item: ItemCode,
    pub triggers: Vec<Trigger>,
    /// Whether its sent notifications are withdrawn when they stop holding.
    pub withdraw: bool,
    /// Whether its notifications go at once, whatever the preferences.
    pub urgent: bool,
    /// Its own preferences, checked; `None`: its device's.
    pub preferences: Option<PreferencesSpec>,
}

/// What became of one create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Inserted for this device; `at` is its `created_at`.
    Created {
        device_id: DeviceId,
        at: DateTime<Utc>,
        /// Its device's, which it notifies on.
        channel: Channel,
    },
    /// The device is at its watch limit; nothing was inserted.
    AtLimit,
    /// No live device has this token.
    UnknownToken,
}

/// One create as the statement takes it.
#[derive(Debug)]
pub struct Create {
    /// SHA-256 of the device token: the statement authenticates it.
    pub token_hash: Vec<u8>,
    pub id: WatchId,
    pub item: String,
    pub triggers: Json<Vec<Trigger>>,
    pub withdraw: bool,
    pub urgent: bool,
    pub preferences: Option<Json<PreferencesSpec>>,
}

impl Create {
    pub fn new(token_hash: Vec<u8>, id: WatchId, new: &NewWatch) -> Self {
        Create {
            token_hash,
            id,
            item: new.item.as_str().to_owned(),
            triggers: Json(new.triggers.clone()),
            withdraw: new.withdraw,
            urgent: new.urgent,
            preferences: new.preferences.clone().map(Json),
        }
    }
}

// The one-create statements: the device's counter moves only if the device is live, is the one
// named (by id, or by token hash: `$2`) and is under the limit (`$5`), and the watch is inserted
// only if it moved, on its device's channel.

/// Creates watch `id` for device `device`, which the caller authenticated, in `conn` (an
/// Idempotency-Key's transaction); `None` if the device is at its limit.
pub async fn for_device(
    conn: &mut PgConnection,
    device: DeviceId,
    id: WatchId,
    new: &NewWatch,
    max_watches: i32,
) -> Result<Option<Watch>, sqlx::Error> {
    crate::watches::watch_query!(
        query_as Watch;
        "WITH dev AS (
             UPDATE devices SET watch_count = watch_count + 1
             WHERE id = $2 AND removed_at IS NULL AND watch_count < $5
             RETURNING id, channel)
         INSERT INTO watches (id, device_id, item_code, triggers, channel, withdraw, urgent,
                              preferences)
         SELECT $1, dev.id, $3, $4, dev.channel, $6, $7, $8 FROM dev
         RETURNING",
        "",
        id.0,
        device.0,
        new.item.as_str(),
        Json(&new.triggers) as _,
        max_watches,
        new.withdraw,
        new.urgent,
        new.preferences.as_ref().map(Json) as _
    )
    .fetch_optional(conn)
    .await
}

/// One create, one statement, authenticated by its token hash.
pub async fn one(
    pool: &PgPool,
    max_watches: i32,
    create: &Create,
) -> Result<Admission, sqlx::Error> {
    let row = sqlx::query!(
        r#"WITH dev AS (
               UPDATE devices SET watch_count = watch_count + 1
               WHERE token_hash = $2 AND removed_at IS NULL AND watch_count < $5
               RETURNING id, channel)
           INSERT INTO watches (id, device_id, item_code, triggers, channel, withdraw, urgent,
                                preferences)
           SELECT $1, dev.id, $3, $4, dev.channel, $6, $7, $8 FROM dev
           RETURNING device_id AS "device_id: DeviceId", created_at,
                     channel AS "channel: Channel""#,
        create.id.0,
        create.token_hash,
        create.item,
        create.triggers as _,
        max_watches,
        create.withdraw,
        create.urgent,
        create.preferences as _
    )
    .fetch_optional(pool)
    .await?;
    if let Some(r) = row {
        return Ok(Admission::Created {
            device_id: r.device_id,
            at: r.created_at,
            channel: r.channel,
        });
    }
    // Nothing inserted: an unknown token, or the limit.
    Ok(
        if crate::devices::is_live(pool, &create.token_hash).await? {
            Admission::AtLimit
        } else {
            Admission::UnknownToken
        },
    )
}

/// One statement for all `creates`; the answers are in the same order. Creates for one device
/// are admitted in the order given until its limit.
pub async fn many(
    pool: &PgPool,
    max_watches: i32,
    creates: &[Create],
) -> Result<Vec<Admission>, sqlx::Error> {
    let ids: Vec<Uuid> = creates.iter().map(|p| p.id.0).collect();
    let hashes: Vec<&[u8]> = creates.iter().map(|p| p.token_hash.as_slice()).collect();
    let items: Vec<&str> = creates.iter().map(|p| p.item.as_str()).collect();
    let triggers: Vec<&Json<Vec<Trigger>>> = creates.iter().map(|p| &p.triggers).collect();
    let withdraw: Vec<bool> = creates.iter().map(|p| p.withdraw).collect();
    let urgent: Vec<bool> = creates.iter().map(|p| p.urgent).collect();
    let preferences: Vec<Option<&Json<PreferencesSpec>>> =
        creates.iter().map(|p| p.preferences.as_ref()).collect();
    let rows = sqlx::query!(
        r#"WITH req AS (
             SELECT * FROM UNNEST($1::uuid[], $2::bytea[], $3::text[], $4::jsonb[], $6::bool[],
                                  $7::bool[], $8::jsonb[])
                           WITH ORDINALITY
                           AS r(id, token_hash, item_code, triggers, withdraw, urgent, preferences, n)
         ), dev AS MATERIALIZED (
             SELECT d.id, d.token_hash, d.watch_count, d.channel FROM devices d
             WHERE d.token_hash = ANY($2) AND d.removed_at IS NULL
             ORDER BY d.id
             FOR UPDATE
         ), ranked AS MATERIALIZED (
             SELECT req.*, dev.id AS device_id, dev.channel,
                    dev.watch_count + row_number() OVER (PARTITION BY dev.id ORDER BY req.n) <= $5
                        AS admitted
             FROM req JOIN dev ON dev.token_hash = req.token_hash
         ), bump AS (
             UPDATE devices d SET watch_count = d.watch_count + c.added
             FROM (SELECT device_id, count(*) AS added FROM ranked WHERE admitted
                   GROUP BY device_id) c
             WHERE d.id = c.device_id
         ), ins AS (
             INSERT INTO watches (id, device_id, item_code, triggers, channel, withdraw, urgent,
                                  preferences)
             SELECT id, device_id, item_code, triggers, channel, withdraw, urgent, preferences
             FROM ranked
             WHERE admitted
         )
         SELECT n AS "n!", device_id AS "device_id!: DeviceId", admitted AS "admitted!",
                now() AS "at!", channel AS "channel!: Channel" FROM ranked"#,
        &ids,
        &hashes as _,
        &items as _,
        &triggers as _,
        i64::from(max_watches),
        &withdraw,
        &urgent,
        &preferences as _
    )
    .fetch_all(pool)
    .await?;
    let mut admissions = vec![Admission::UnknownToken; creates.len()];
    for r in rows {
        let slot = usize::try_from(r.n - 1)
            .ok()
            .and_then(|i| admissions.get_mut(i));
        if let Some(slot) = slot {
            *slot = if r.admitted {
                Admission::Created {
                    device_id: r.device_id,
                    at: r.at,
                    channel: r.channel,
                }
            } else {
                Admission::AtLimit
            };
        }
    }
    Ok(admissions)
}
