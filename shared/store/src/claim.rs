//! Claiming due rows, and reading what the pre-send decision needs about them.
//!
//! A claim is one short statement: it locks due rows with `FOR UPDATE SKIP LOCKED` (so
//! concurrent dispatchers take disjoint rows) and sets `claimed_until`, which hides them from
//! other dispatchers after the statement commits. No lock is held while the source is called or
//! the push published; if this dispatcher dies, the rows are simply claimable again when the
//! claim lease runs out. `claimed_until` is not indexed and the outbox leaves half of each page
//! free (migration 0003), so a claim is a HOT update; every state transition clears it. A claim
//! stamps `updated_at` itself, so the guard trigger need not run its function (migration 0028).

use crate::baselines::BaselineRow;
use crate::subscriptions::Health;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Map;
use sqlx::types::{Json, Uuid};
use sqlx::{PgConnection, PgPool, Postgres};
use std::collections::HashMap;
use std::time::Duration;
use tidings_domain::holding::Held;
use tidings_domain::messages::Subscription;
use tidings_domain::outbox::{Row, Status};
use tidings_domain::preferences::PreferencesSpec;
use tidings_domain::receiver::{Circuit, Pace};
use tidings_domain::sql::Count;
use tidings_domain::trigger::{Baseline, LastSent, Observation};
use tidings_domain::withdrawal::TriggerColumn;
use tidings_domain::{Channel, DeviceId, OutboxId, SubscriptionId, WatchId};

/// What the database says about a claimed row's watch right now.
#[derive(Clone, Debug)]
pub struct WatchState {
    pub item_code: String,
    pub paused: bool,
    /// An operator paused the watch's device.
    pub device_paused: bool,
    /// The watch or its device was removed.
    pub removed: bool,
    /// The device's active subscription: where its notifications go.
    pub subscription: Option<(SubscriptionId, Destination)>,
    /// The device's BCP 47 locale, which its notifications are written for.
    pub locale: Option<String>,
    /// The device's IANA time zone, which times in its notifications are in.
    pub time_zone: String,
    /// The watch's notifications never wait for the reader.
    pub urgent: bool,
    /// When they wait otherwise: the watch's preferences, or else its device's.
    pub preferences: PreferencesSpec,
}

/// Where a device's notifications go.
#[derive(Clone, Debug, PartialEq)]
pub enum Destination {
    WebPush(Subscription),
    Webhook(Endpoint),
    Email(Mailbox),
}

/// An email address: where mail goes once its owner confirmed it, and the key its links are
/// signed with (sealed like a webhook's secret, bound to its subscription).
#[derive(Clone, PartialEq)]
pub struct Mailbox {
    pub subscription: SubscriptionId,
    pub address: String,
    pub link_key: String,
    /// Its owner has not opened the confirmation link yet: nothing may be mailed.
    pub unconfirmed: bool,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("subscription", &self.subscription)
            .field("unconfirmed", &self.unconfirmed)
            .finish_non_exhaustive()
    }
}

/// A webhook endpoint: its URL and the secrets that sign for it (the current one first, then
/// the one a rotation replaced, while it still signs).
#[derive(Clone, PartialEq)]
pub struct Endpoint {
    /// Its subscription, to which its sealed secrets are bound.
    pub subscription: SubscriptionId,
    pub url: String,
    pub secrets: Vec<String>,
    /// Its circuit breaker and its pace, as this claim read them.
    pub health: Health,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("secrets", &self.secrets.len())
            .field("health", &self.health)
            .finish()
    }
}

#[derive(Debug)]
pub struct Claimed {
    pub id: OutboxId,
    pub dedup_day: NaiveDate,
    pub watch_id: WatchId,
    pub device_id: DeviceId,
    /// The channel it goes out on (its watch's, so its device's).
    pub channel: Channel,
    pub status: Status,
    /// Its `trigger` column, split: what it announces, if this build knows the key.
    pub trigger: TriggerColumn,
    pub detected_at: DateTime<Utc>,
    pub detected_price: i64,
    pub detected_currency: String,
    pub detected_in_stock: bool,
    pub detected_paused: bool,
    pub detected_observed_at: DateTime<Utc>,
    pub baseline_price: Option<i64>,
    pub baseline_reference: Option<i64>,
    pub baseline_in_stock: Option<bool>,
    pub attempt: u32,
    pub retry_count: u32,
    pub traceparent: Option<String>,
    /// When it became due: how long it waited for this claim is what admission reads.
    pub next_attempt_at: DateTime<Utc>,
    /// The sent row this one withdraws.
    pub withdraws: Option<OutboxId>,
    /// Why it waited for its reader (it is due at its release), if it did.
    pub held: Option<Held>,
}

impl Claimed {
    /// The key of the trigger the row is about, whose baseline it is decided on (a withdrawal's
    /// key without its prefix).
    pub fn trigger_key(&self) -> &str {
        &self.trigger.key
    }

    /// The detection snapshot.
    pub fn detected(&self) -> Observation {
        Observation {
            price: self.detected_price,
            currency: self.detected_currency.clone(),
            in_stock: self.detected_in_stock,
            paused: self.detected_paused,
            observed_at: self.detected_observed_at,
            // A detection is stored only where its trigger held, which a restock needs stated.
            stock_stated: true,
        }
    }

    /// The baseline detection evaluated against.
    pub fn baseline(&self) -> Baseline {
        Baseline {
            price: self.baseline_price,
            reference: self.baseline_reference,
            in_stock: self.baseline_in_stock,
        }
    }

    /// The counters the state machine needs.
    pub fn row(&self) -> Row {
        Row {
            status: self.status,
            retry_count: self.retry_count,
            attempt: self.attempt,
        }
    }
}

/// Takes up to `batch` due rows, oldest first, and hides them from other claims for `lease`
/// seconds. The update finds each row by its whole key, dedup day included, so it reads one
/// partition.
pub fn statement(
    batch: i64,
    lease: f64,
) -> Map<'static, Postgres, impl FnMut(PgRow) -> Result<Claimed, sqlx::Error> + Send, PgArguments> {
    sqlx::query_as!(
        Claimed,
        r#"WITH due AS (
               SELECT id, dedup_day FROM outbox
               WHERE status IN ('pending', 'retry') /* status: due */
                 AND next_attempt_at <= now()
                 AND (claimed_until IS NULL OR claimed_until <= now())
                 AND held IS DISTINCT FROM 'digest'
               ORDER BY next_attempt_at
               LIMIT $1
               FOR UPDATE SKIP LOCKED
           )
           UPDATE outbox o SET claimed_until = now() + make_interval(secs => $2), updated_at = now()
           FROM due WHERE o.id = due.id AND o.dedup_day = due.dedup_day
           RETURNING o.id AS "id: OutboxId", o.dedup_day, o.watch_id AS "watch_id: WatchId",
                     o.device_id AS "device_id: DeviceId", o.channel AS "channel: Channel",
                     o.status AS "status: Status", o.trigger AS "trigger: TriggerColumn", o.detected_at, o.detected_price,
                     o.detected_currency, o.detected_in_stock, o.detected_paused,
                     o.detected_observed_at, o.baseline_price, o.baseline_reference,
                     o.baseline_in_stock, o.attempt AS "attempt: Count",
                     o.retry_count AS "retry_count: Count", o.traceparent,
                     o.next_attempt_at, o.withdraws AS "withdraws: OutboxId",
                     o.held AS "held: Held""#,
        batch,
        lease
    )
}

/// Run before [`statement`] in the same transaction. The due index yields rows in claim order,
/// so a claim should read about as many rows as it takes. But Postgres' estimate of how many
/// rows are due lags (statistics refresh about once a minute; a backlog builds in seconds), and
/// when it guesses few it plans a bitmap scan of *every* due row and a sort. With 25,000 due
/// rows that took 13 ms to pick 500, against 0.9 ms through the index. `set_config(…, true)`
/// lasts until the transaction ends.
///
/// The claim is also planned once per connection (a generic plan, the same one): Postgres
/// otherwise plans it anew each time, over every week's partition, ~1.3 ms a claim, more than
/// reading 100 rows costs.
pub async fn plan_by_due_index(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let settings = [
        ("enable_bitmapscan", "off"),
        ("enable_seqscan", "off"),
        ("plan_cache_mode", "force_generic_plan"),
    ];
    crate::planner::for_transaction(conn, &settings).await
}

pub async fn claim(
    pool: &PgPool,
    batch: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    plan_by_due_index(&mut tx).await?;
    let claimed = statement(batch, lease.as_secs_f64())
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(claimed)
}

/// Takes the due digest rows (held `digest`, at their release) of up to `devices` readers, the
/// first `members` of each by id, hidden from other claims for `lease`: each reader's go out
/// together ([`claim`] leaves them alone). A reader another dispatcher is taking at the same
/// moment is skipped (an advisory lock of its own class, `tdig`), so two never split one
/// reader's digest between them.
pub async fn claim_digests(
    pool: &PgPool,
    devices: i64,
    members: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let readers: Vec<Uuid> = sqlx::query_scalar!(
        r#"SELECT device_id AS "device_id!" FROM (
               SELECT DISTINCT device_id FROM outbox
               WHERE held = 'digest' AND status IN ('pending', 'retry') /* status: due */
                 AND next_attempt_at <= now()
                 AND (claimed_until IS NULL OR claimed_until <= now())
               LIMIT $1) AS due
           WHERE pg_try_advisory_xact_lock(1952737639, hashtext(device_id::text))"#,
        devices
    )
    .fetch_all(&mut *tx)
    .await?;
    if readers.is_empty() {
        return Ok(Vec::new());
    }
    let claimed = sqlx::query_as!(
        Claimed,
        r#"WITH due AS (
               SELECT r.id, r.dedup_day FROM unnest($1::uuid[]) AS d(device_id)
               CROSS JOIN LATERAL (
                   SELECT id, dedup_day FROM outbox
                   WHERE device_id = d.device_id AND held = 'digest'
                     AND status IN ('pending', 'retry') /* status: due */
                     AND next_attempt_at <= now()
                     AND (claimed_until IS NULL OR claimed_until <= now())
                   ORDER BY id
                   LIMIT $2
                   FOR UPDATE SKIP LOCKED) AS r
           )
           UPDATE outbox o SET claimed_until = now() + make_interval(secs => $3), updated_at = now()
           FROM due WHERE o.id = due.id AND o.dedup_day = due.dedup_day
           RETURNING o.id AS "id: OutboxId", o.dedup_day, o.watch_id AS "watch_id: WatchId",
                     o.device_id AS "device_id: DeviceId", o.channel AS "channel: Channel",
                     o.status AS "status: Status", o.trigger AS "trigger: TriggerColumn", o.detected_at, o.detected_price,
                     o.detected_currency, o.detected_in_stock, o.detected_paused,
                     o.detected_observed_at, o.baseline_price, o.baseline_reference,
                     o.baseline_in_stock, o.attempt AS "attempt: Count",
                     o.retry_count AS "retry_count: Count", o.traceparent,
                     o.next_attempt_at, o.withdraws AS "withdraws: OutboxId",
                     o.held AS "held: Held""#,
        &readers,
        members,
        lease.as_secs_f64()
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(claimed)
}

struct WatchRow {
    watch_id: WatchId,
    item_code: String,
    paused: bool,
    device_paused: bool,
    removed: bool,
    locale: Option<String>,
    time_zone: String,
    urgent: bool,
    preferences: Json<PreferencesSpec>,
    subscription_id: Option<SubscriptionId>,
    channel: Option<Channel>,
    endpoint: Option<String>,
    p256dh: Option<String>,
    auth: Option<String>,
    secret: Option<String>,
    previous_secret: Option<String>,
    circuit_open_until: Option<DateTime<Utc>>,
    circuit_opens: Option<Count>,
    pace_per_second: Option<f64>,
    paced_until: Option<DateTime<Utc>>,
    unconfirmed: Option<bool>,
}

impl WatchRow {
    fn destination(&mut self) -> Option<(SubscriptionId, Destination)> {
        let id = self.subscription_id?;
        let endpoint = self.endpoint.take()?;
        let to = match self.channel? {
            Channel::WebPush => Destination::WebPush(Subscription {
                endpoint,
                p256dh: self.p256dh.take()?,
                auth: self.auth.take()?,
            }),
            Channel::Email => Destination::Email(Mailbox {
                subscription: id,
                address: endpoint.strip_prefix("mailto:")?.to_owned(),
                link_key: self.secret.take()?,
                unconfirmed: self.unconfirmed.unwrap_or(true),
            }),
            Channel::Webhook => Destination::Webhook(Endpoint {
                subscription: id,
                url: endpoint,
                secrets: [self.secret.take()?]
                    .into_iter()
                    .chain(self.previous_secret.take())
                    .collect(),
                health: Health {
                    circuit: Circuit {
                        opens: self.circuit_opens.map_or(0, u32::from),
                        open_until: self.circuit_open_until,
                        ..Circuit::default()
                    },
                    pace: Pace {
                        per_second: self.pace_per_second,
                        until: self.paced_until,
                    },
                },
            }),
        };
        Some((id, to))
    }
}

/// The current state of the claimed rows' watches (absent: the watch does not exist).
pub async fn watches(
    pool: &PgPool,
    rows: &[Claimed],
) -> Result<HashMap<WatchId, WatchState>, sqlx::Error> {
    let mut ids: Vec<Uuid> = rows.iter().map(|r| r.watch_id.0).collect();
    ids.sort();
    ids.dedup();
    let found = sqlx::query_as!(
        WatchRow,
        r#"SELECT w.id AS "watch_id: WatchId", w.item_code, w.paused,
                  d.paused_at IS NOT NULL AS "device_paused!",
                  (w.removed_at IS NOT NULL OR d.removed_at IS NOT NULL) AS "removed!", d.locale,
                  d.time_zone, w.urgent,
                  coalesce(w.preferences, d.preferences) AS "preferences!: Json<PreferencesSpec>",
                  s.id AS "subscription_id?: SubscriptionId",
                  s.channel AS "channel?: Channel", s.endpoint AS "endpoint?", s.p256dh, s.auth,
                  s.secret, CASE WHEN s.previous_until > now() THEN s.previous_secret END
                      AS previous_secret,
                  s.circuit_open_until, s.circuit_opens AS "circuit_opens?: Count", s.pace_per_second,
                  s.paced_until, s.unconfirmed AS "unconfirmed?"
           FROM watches w
           JOIN devices d ON d.id = w.device_id
           LEFT JOIN push_subscriptions s ON s.device_id = w.device_id AND s.active
           WHERE w.id = ANY($1)"#,
        &ids
    )
    .fetch_all(pool)
    .await?;
    Ok(found
        .into_iter()
        .map(|mut w| {
            let subscription = w.destination();
            (
                w.watch_id,
                WatchState {
                    item_code: w.item_code,
                    paused: w.paused,
                    device_paused: w.device_paused,
                    removed: w.removed,
                    subscription,
                    locale: w.locale,
                    time_zone: w.time_zone,
                    urgent: w.urgent,
                    preferences: w.preferences.0,
                },
            )
        })
        .collect())
}

/// The last sent value of each claimed row's (watch, trigger), by [`Claimed::trigger_key`].
pub async fn baselines(
    pool: &PgPool,
    rows: &[Claimed],
) -> Result<HashMap<(WatchId, String), LastSent>, sqlx::Error> {
    let watch_ids: Vec<Uuid> = rows.iter().map(|r| r.watch_id.0).collect();
    let triggers: Vec<&str> = rows.iter().map(Claimed::trigger_key).collect();
    let found = sqlx::query_as!(
        BaselineRow,
        r#"SELECT DISTINCT b.watch_id AS "watch_id: WatchId", b.trigger, b.price, b.in_stock,
                  b.sent_at, b.outbox_id AS "outbox_id: OutboxId", b.dedup_day, b.observed_at,
                  b.valid_until, b.decided_price, b.decided_reference, b.decided_in_stock
           FROM baselines b
           JOIN UNNEST($1::uuid[], $2::text[]) AS k(watch_id, trigger)
             ON b.watch_id = k.watch_id AND b.trigger = k.trigger"#,
        &watch_ids,
        &triggers as _
    )
    .fetch_all(pool)
    .await?;
    Ok(found
        .into_iter()
        .map(|b| {
            let last = b.last_sent();
            ((b.watch_id, b.trigger), last)
        })
        .collect())
}

/// The push service's message resource (`Location`) of each sent row a claimed withdrawal
/// withdraws, by that row's id (a withdrawal shares its row's dedup day, so one partition each).
pub async fn recalls(
    pool: &PgPool,
    rows: &[Claimed],
) -> Result<HashMap<OutboxId, String>, sqlx::Error> {
    let (ids, days): (Vec<Uuid>, Vec<NaiveDate>) = rows
        .iter()
        .filter_map(|r| Some((r.withdraws?.0, r.dedup_day)))
        .unzip();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let found = sqlx::query!(
        r#"SELECT o.id AS "id: OutboxId", o.push_message_id AS "message_id!" FROM outbox o
           JOIN UNNEST($1::uuid[], $2::date[]) AS k(id, dedup_day)
             ON o.id = k.id AND o.dedup_day = k.dedup_day
           WHERE o.push_message_id IS NOT NULL"#,
        &ids,
        &days
    )
    .fetch_all(pool)
    .await?;
    Ok(found.into_iter().map(|r| (r.id, r.message_id)).collect())
}

/// Locks `devices`' caps until `conn`'s transaction ends, so that of two dispatchers deciding
/// for one device, the second waits until the first has written what it sends, and counts it.
/// Locks are taken in device order, so two callers cannot deadlock.
pub async fn lock_caps(conn: &mut PgConnection, devices: &[DeviceId]) -> Result<(), sqlx::Error> {
    let mut ids: Vec<Uuid> = devices.iter().map(|d| d.0).collect();
    ids.sort();
    ids.dedup();
    // The two-key form, with a class of its own (`tcap`), keeps these apart from every other
    // advisory lock.
    sqlx::query!(
        r#"SELECT count(pg_advisory_xact_lock(1952670064, hashtext(d::text))) AS "n!"
           FROM (SELECT d FROM unnest($1::uuid[]) AS d ORDER BY d) AS ordered"#,
        &ids
    )
    .fetch_one(conn)
    .await?;
    Ok(())
}

/// When device `devices`' notifications went out (or are going) since `since`, withdrawals
/// aside: what their caps count.
pub async fn sent_since(
    conn: &mut PgConnection,
    devices: &[DeviceId],
    since: DateTime<Utc>,
) -> Result<HashMap<DeviceId, Vec<DateTime<Utc>>>, sqlx::Error> {
    if devices.is_empty() {
        return Ok(HashMap::new());
    }
    let ids: Vec<Uuid> = devices.iter().map(|d| d.0).collect();
    let rows = sqlx::query!(
        r#"SELECT device_id AS "device_id: DeviceId", coalesce(finished_at, updated_at) AS "at!"
           FROM outbox
           WHERE device_id = ANY($1) AND status IN ('sending', 'sent') /* status: out */
             AND withdraws IS NULL
             AND coalesce(finished_at, updated_at) > $2"#,
        &ids,
        since
    )
    .fetch_all(conn)
    .await?;
    let mut sent: HashMap<DeviceId, Vec<DateTime<Utc>>> = HashMap::new();
    for r in rows {
        sent.entry(r.device_id).or_default().push(r.at);
    }
    Ok(sent)
}

/// A claimed row that waits for its reader: due again at `until`, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub id: OutboxId,
    pub day: NaiveDate,
    pub until: DateTime<Utc>,
    pub held: Held,
}

/// Makes claimed rows wait for their readers: still pending (or retry), due at their release,
/// not counted as an attempt, and saying why.
pub async fn wait(conn: &mut PgConnection, waits: &[Wait]) -> Result<(), sqlx::Error> {
    if waits.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = waits.iter().map(|w| w.id.0).collect();
    let days: Vec<NaiveDate> = waits.iter().map(|w| w.day).collect();
    let until: Vec<DateTime<Utc>> = waits.iter().map(|w| w.until).collect();
    let held: Vec<&str> = waits.iter().map(|w| w.held.as_str()).collect();
    sqlx::query!(
        "UPDATE outbox o SET next_attempt_at = w.until, held = w.held, claimed_until = NULL
         FROM UNNEST($1::uuid[], $2::date[], $3::timestamptz[], $4::text[])
              AS w(id, day, until, held)
         WHERE o.id = w.id AND o.dedup_day = w.day
           AND o.status IN ('pending', 'retry') /* status: due */",
        &ids,
        &days,
        &until,
        &held as _
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Makes device `device`'s held rows (of watch `watch` only, if given) due now, so that they are
/// judged again at once by preferences their reader just changed; how many.
pub async fn release_held(
    pool: &PgPool,
    device: DeviceId,
    watch: Option<WatchId>,
) -> Result<u64, sqlx::Error> {
    // The api's one way to move a row's next attempt (migration 0026).
    let released = sqlx::query_scalar!(
        r#"SELECT tidings_release_held($1, $2) AS "released!""#,
        device.0,
        watch.map(|w| w.0) as Option<Uuid>
    )
    .fetch_one(pool)
    .await?;
    Ok(u64::try_from(released).unwrap_or(0))
}

/// Holds claimed rows back until their time (their webhook endpoint's circuit is open), as a
/// longer claim: they stay pending or retry, unchanged but for `claimed_until`.
pub async fn hold(
    pool: &PgPool,
    rows: &[(OutboxId, NaiveDate, DateTime<Utc>)],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.0.0).collect();
    let days: Vec<NaiveDate> = rows.iter().map(|r| r.1).collect();
    let until: Vec<DateTime<Utc>> = rows.iter().map(|r| r.2).collect();
    sqlx::query!(
        "UPDATE outbox o SET claimed_until = h.until
         FROM UNNEST($1::uuid[], $2::date[], $3::timestamptz[]) AS h(id, day, until)
         WHERE o.id = h.id AND o.dedup_day = h.day
           AND o.status IN ('pending', 'retry') /* status: due */",
        &ids,
        &days,
        &until
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Marks half-open webhook endpoints' probes as out until `until`; returns those this caller
/// won ([`crate::subscriptions::probing`]).
pub async fn probing(
    pool: &PgPool,
    probes: &[(SubscriptionId, DateTime<Utc>)],
) -> Result<Vec<SubscriptionId>, sqlx::Error> {
    if probes.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = pool.acquire().await?;
    crate::subscriptions::probing(&mut conn, probes).await
}

/// Takes paced endpoints' next slots ([`crate::subscriptions::paced`]).
pub async fn pacing(
    pool: &PgPool,
    next: &[(SubscriptionId, DateTime<Utc>)],
) -> Result<(), sqlx::Error> {
    if next.is_empty() {
        return Ok(());
    }
    let mut conn = pool.acquire().await?;
    crate::subscriptions::paced(&mut conn, next).await
}
