//! Creating watches under a device's limit.
//!
//! Both statements keep the same promises: each create is authenticated (by its device's token
//! hash, or by an id the caller authenticated), and no device ever exceeds its watch limit. The
//! shared statement ([`many`]) locks the devices it adds to (in id order, so two statements
//! cannot deadlock) and counts from the locked, latest row; the one-create statements increment
//! the counter only while it is under the limit.

use crate::watches::{WATCH_COLUMNS, Watch};
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use tidings_domain::trigger::Trigger;
use tidings_domain::{Channel, DeviceId, ItemCode, WatchId};

/// A validated create, ready to insert.
#[derive(Debug, Clone)]
pub struct NewWatch {
    pub item: ItemCode,
    pub triggers: Vec<Trigger>,
    /// Whether its sent notifications are withdrawn when they stop holding.
    pub withdraw: bool,
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
}

impl Create {
    pub fn new(token_hash: Vec<u8>, id: WatchId, new: &NewWatch) -> Self {
        Create {
            token_hash,
            id,
            item: new.item.as_str().to_owned(),
            triggers: Json(new.triggers.clone()),
            withdraw: new.withdraw,
        }
    }
}

/// The one-create statement: the device's counter moves only if the device is live, matches
/// `device` (a condition on `$2`) and is under the limit (`$5`), and the watch (`$1`, `$3`,
/// `$4`, `$6`) is inserted only if it moved, on its device's channel.
fn one_create_statement(device: &str, returning: &str) -> String {
    format!(
        "WITH dev AS (
             UPDATE devices SET watch_count = watch_count + 1
             WHERE {device} AND removed_at IS NULL AND watch_count < $5
             RETURNING id, channel)
         INSERT INTO watches (id, device_id, item_code, triggers, channel, withdraw)
         SELECT $1, dev.id, $3, $4, dev.channel, $6 FROM dev
         RETURNING {returning}"
    )
}

/// Creates watch `id` for device `device`, which the caller authenticated, in `conn` (an
/// Idempotency-Key's transaction); `None` if the device is at its limit.
pub async fn for_device(
    conn: &mut PgConnection,
    device: DeviceId,
    id: WatchId,
    new: &NewWatch,
    max_watches: i32,
) -> Result<Option<Watch>, sqlx::Error> {
    sqlx::query_as(&one_create_statement("id = $2", WATCH_COLUMNS))
        .bind(id)
        .bind(device)
        .bind(new.item.as_str())
        .bind(Json(&new.triggers))
        .bind(max_watches)
        .bind(new.withdraw)
        .fetch_optional(conn)
        .await
}

/// One create, one statement, authenticated by its token hash.
pub async fn one(
    pool: &PgPool,
    max_watches: i32,
    create: &Create,
) -> Result<Admission, sqlx::Error> {
    let row: Option<(DeviceId, DateTime<Utc>, Channel)> = sqlx::query_as(&one_create_statement(
        "token_hash = $2",
        "device_id, created_at, channel",
    ))
    .bind(create.id)
    .bind(&create.token_hash)
    .bind(&create.item)
    .bind(&create.triggers)
    .bind(max_watches)
    .bind(create.withdraw)
    .fetch_optional(pool)
    .await?;
    if let Some((device_id, at, channel)) = row {
        return Ok(Admission::Created {
            device_id,
            at,
            channel,
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
    let ids: Vec<WatchId> = creates.iter().map(|p| p.id).collect();
    let hashes: Vec<&[u8]> = creates.iter().map(|p| p.token_hash.as_slice()).collect();
    let items: Vec<&str> = creates.iter().map(|p| p.item.as_str()).collect();
    let triggers: Vec<&Json<Vec<Trigger>>> = creates.iter().map(|p| &p.triggers).collect();
    let withdraw: Vec<bool> = creates.iter().map(|p| p.withdraw).collect();
    let rows: Vec<(i64, DeviceId, bool, DateTime<Utc>, Channel)> = sqlx::query_as(
        "WITH req AS (
             SELECT * FROM UNNEST($1::uuid[], $2::bytea[], $3::text[], $4::jsonb[], $6::bool[])
                           WITH ORDINALITY AS r(id, token_hash, item_code, triggers, withdraw, n)
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
             INSERT INTO watches (id, device_id, item_code, triggers, channel, withdraw)
             SELECT id, device_id, item_code, triggers, channel, withdraw FROM ranked
             WHERE admitted
         )
         SELECT n, device_id, admitted, now(), channel FROM ranked",
    )
    .bind(ids)
    .bind(hashes)
    .bind(items)
    .bind(triggers)
    .bind(max_watches)
    .bind(withdraw)
    .fetch_all(pool)
    .await?;
    let mut admissions = vec![Admission::UnknownToken; creates.len()];
    for (n, device_id, admitted, at, channel) in rows {
        let slot = usize::try_from(n - 1)
            .ok()
            .and_then(|i| admissions.get_mut(i));
        if let Some(slot) = slot {
            *slot = if admitted {
                Admission::Created {
                    device_id,
                    at,
                    channel,
                }
            } else {
                Admission::AtLimit
            };
        }
    }
    Ok(admissions)
}
