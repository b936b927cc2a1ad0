//! Outbox rows as records of what happened: a device's history, and the operators' view of rows
//! with their delivery record, selected by a [`Filter`].

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgPool, Postgres, QueryBuilder};
use tidings_domain::holding::Held;
use tidings_domain::outbox::{Reason, Status};
use tidings_domain::withdrawal::Announces;
use tidings_domain::{Channel, DeviceId, OutboxId, SubscriptionId, WatchId};

/// One notification, from detection to its outcome.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Notification {
    pub id: OutboxId,
    pub watch_id: WatchId,
    /// `None` once the watch is gone (the join found nothing).
    pub item_code: Option<String>,
    /// Its trigger, or (a withdrawal) the end of one.
    pub trigger: Announces,
    pub channel: Channel,
    pub status: Status,
    pub reason: Option<Reason>,
    pub detected_price: i64,
    pub detected_currency: String,
    pub detected_in_stock: bool,
    pub detected_at: DateTime<Utc>,
    pub checked: Option<serde_json::Value>,
    pub sent_value: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub replay_of: Option<OutboxId>,
    pub maybe_delivered: bool,
    pub dedup_day: NaiveDate,
    /// The sent notification this one withdraws.
    pub withdraws: Option<OutboxId>,
    /// Why it waited for its reader, if it did.
    pub held: Option<Held>,
    /// While it waits for its reader: its release.
    pub release_at: Option<DateTime<Utc>>,
}

const NOTIFICATION_COLUMNS: &str =
    "o.id, o.watch_id, w.item_code, o.trigger, o.channel, o.status, o.reason,
     o.detected_price, o.detected_currency, o.detected_in_stock, o.detected_at, o.checked,
     o.sent_value, o.created_at, o.updated_at, o.finished_at, o.replay_of, o.maybe_delivered,
     o.dedup_day, o.withdraws, o.held,
     CASE WHEN o.held IS NOT NULL AND o.status IN ('pending', 'retry') /* status: due */
               AND o.next_attempt_at > now() THEN o.next_attempt_at END AS release_at";

/// Device `device`'s rows before `before` (newest first), of `status` if given, at most `limit`.
pub async fn of_device(
    pool: &PgPool,
    device: DeviceId,
    status: Option<Status>,
    before: Option<OutboxId>,
    limit: i64,
) -> Result<Vec<Notification>, sqlx::Error> {
    // UUIDv7 ids are time-ordered: "newest first" is id order, served by outbox_device.
    sqlx::query_as!(
        Notification,
        r#"SELECT o.id AS "id: OutboxId", o.watch_id AS "watch_id: WatchId", w.item_code AS "item_code?",
                  o.trigger AS "trigger: Announces", o.channel AS "channel: Channel",
                  o.status AS "status: Status", o.reason AS "reason: Reason",
                  o.detected_price, o.detected_currency, o.detected_in_stock, o.detected_at,
                  o.checked, o.sent_value, o.created_at, o.updated_at, o.finished_at,
                  o.replay_of AS "replay_of: OutboxId", o.maybe_delivered, o.dedup_day,
                  o.withdraws AS "withdraws: OutboxId", o.held AS "held: Held",
                  CASE WHEN o.held IS NOT NULL AND o.status IN ('pending', 'retry') /* status: due */
                            AND o.next_attempt_at > now() THEN o.next_attempt_at END AS release_at
           FROM outbox o LEFT JOIN watches w ON w.id = o.watch_id
           WHERE o.device_id = $1 AND ($2::text IS NULL OR o.status = $2)
             AND ($3::uuid IS NULL OR o.id < $3)
           ORDER BY o.id DESC LIMIT $4"#,
        device.0,
        status.map(Status::as_str),
        before.map(|b| b.0),
        limit
    )
    .fetch_all(pool)
    .await
}

/// Which outbox rows an operator means. Every field narrows the set; none means every row.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub status: Option<Status>,
    pub reason: Option<Reason>,
    pub channel: Option<Channel>,
    pub device_id: Option<DeviceId>,
    pub watch_id: Option<WatchId>,
    pub item: Option<String>,
    /// Rows with an attempt through this push service host.
    pub push_host: Option<String>,
    /// Rows whose last push answer had this HTTP status.
    pub http_status: Option<i32>,
    /// Detected at or after.
    pub from: Option<DateTime<Utc>>,
    /// Detected before.
    pub to: Option<DateTime<Utc>>,
}

impl Filter {
    /// Appends the filter's conditions to a query over `outbox o LEFT JOIN watches w` that
    /// already has a `WHERE`.
    pub(crate) fn push(&self, q: &mut QueryBuilder<'_, Postgres>) {
        if let Some(s) = self.status {
            q.push(" AND o.status = ").push_bind(s);
        }
        if let Some(r) = self.reason {
            q.push(" AND o.reason = ").push_bind(r);
        }
        if let Some(c) = self.channel {
            q.push(" AND o.channel = ").push_bind(c);
        }
        if let Some(d) = self.device_id {
            q.push(" AND o.device_id = ").push_bind(d);
        }
        if let Some(w) = self.watch_id {
            q.push(" AND o.watch_id = ").push_bind(w);
        }
        if let Some(item) = &self.item {
            q.push(" AND w.item_code = ").push_bind(item.clone());
        }
        if let Some(host) = &self.push_host {
            // The attempt that ended a row is on the row; earlier ones in outbox_attempts.
            q.push(" AND (o.attempt_push_host = ")
                .push_bind(host.clone())
                .push(
                    " OR EXISTS (SELECT 1 FROM outbox_attempts a
                        WHERE a.outbox_id = o.id AND a.dedup_day = o.dedup_day AND a.push_host = ",
                )
                .push_bind(host.clone())
                .push("))");
        }
        if let Some(h) = self.http_status {
            q.push(" AND o.http_status = ").push_bind(h);
        }
        if let Some(from) = self.from {
            q.push(" AND o.detected_at >= ").push_bind(from);
        }
        if let Some(to) = self.to {
            q.push(" AND o.detected_at < ").push_bind(to);
        }
    }
}

/// An outbox row as operators see it: the notification plus its delivery record.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Delivery {
    #[sqlx(flatten)]
    pub notification: Notification,
    pub device_id: DeviceId,
    pub attempt: i32,
    pub retry_count: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub lease_until: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub http_status: Option<i32>,
    pub push_message_id: Option<String>,
    pub subscription_id: Option<SubscriptionId>,
    pub traceparent: Option<String>,
    /// Replays of this row (at most one).
    pub replays: Vec<OutboxId>,
}

fn delivery_query(filter: &str) -> String {
    format!(
        "SELECT {NOTIFICATION_COLUMNS}, o.device_id, o.attempt, o.retry_count, o.next_attempt_at,
                o.lease_until, o.deadline, o.last_error, o.http_status, o.push_message_id,
                o.subscription_id, o.traceparent,
                ARRAY(SELECT r.id FROM outbox r WHERE r.replay_of = o.id) AS replays
         FROM outbox o LEFT JOIN watches w ON w.id = o.watch_id
         {filter}"
    )
}

/// Rows `filter` matches before `before`, newest first, at most `limit`. Built at run time (not
/// checked when it compiles): the filter decides which conditions it has.
pub async fn deliveries(
    pool: &PgPool,
    filter: &Filter,
    before: Option<OutboxId>,
    limit: i64,
) -> Result<Vec<Delivery>, sqlx::Error> {
    let mut query = QueryBuilder::new(delivery_query("WHERE TRUE"));
    filter.push(&mut query);
    if let Some(before) = before {
        query.push(" AND o.id < ").push_bind(before);
    }
    query.push(" ORDER BY o.id DESC LIMIT ").push_bind(limit);
    query.build_query_as().fetch_all(pool).await
}

/// Row `id` with its delivery record (the statement of [`deliveries`], whose filters make it
/// dynamic, for one row).
pub async fn delivery(pool: &PgPool, id: OutboxId) -> Result<Option<Delivery>, sqlx::Error> {
    QueryBuilder::new(delivery_query("WHERE o.id = "))
        .push_bind(id)
        .build_query_as()
        .fetch_optional(pool)
        .await
}

/// Row `id`'s dedup day and state.
pub async fn status_of(
    pool: &PgPool,
    id: OutboxId,
) -> Result<Option<(NaiveDate, Status)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT dedup_day, status AS "status: Status" FROM outbox WHERE id = $1"#,
        id.0
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.dedup_day, r.status)))
}

/// Rows by state and reason, over the whole outbox.
pub async fn by_state_and_reason(
    pool: &PgPool,
) -> Result<Vec<(Status, Option<Reason>, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT status AS "status: Status", reason AS "reason: Reason", count(*) AS "n!"
           FROM outbox GROUP BY status, reason ORDER BY status, reason"#
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.status, r.reason, r.n))
        .collect())
}
