//! The outbox rows a batch of push results is about, locked for the transaction that applies
//! them.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;
use tidings_domain::outbox::Status;
use tidings_domain::sql::Count;
use tidings_domain::trigger::{Baseline, Observation};
use tidings_domain::withdrawal::TriggerColumn;
use tidings_domain::{Channel, OutboxId, SubscriptionId, WatchId};

/// A row as the results loop needs it.
#[derive(Debug)]
pub struct Locked {
    pub id: OutboxId,
    pub dedup_day: NaiveDate,
    pub status: Status,
    /// Checked `>= 0` by the schema; outside `u32` the row fails to decode rather than bend.
    pub attempt: u32,
    pub retry_count: u32,
    pub watch_id: WatchId,
    pub trigger: TriggerColumn,
    /// Where it goes: results count on a webhook endpoint's circuit breaker only.
    pub channel: Channel,
    pub sent_value: Option<Json<Observation>>,
    pub subscription_id: Option<SubscriptionId>,
    pub detected_at: DateTime<Utc>,
    pub traceparent: Option<String>,
    pub baseline_price: Option<i64>,
    pub baseline_reference: Option<i64>,
    pub baseline_in_stock: Option<bool>,
    /// Until when what it sent is current (its payload's `valid_until`).
    pub valid_until: Option<DateTime<Utc>>,
}

impl Locked {
    /// The baseline the row was decided on.
    pub fn baseline(&self) -> Baseline {
        Baseline {
            price: self.baseline_price,
            reference: self.baseline_reference,
            in_stock: self.baseline_in_stock,
        }
    }
}

/// A [`Locked`] from a record of a statement that selects its columns (typed by the overrides
/// both statements below spell out).
macro_rules! locked {
    ($r:ident) => {
        Locked {
            id: $r.id,
            dedup_day: $r.dedup_day,
            status: $r.status,
            attempt: $r.attempt.0,
            retry_count: $r.retry_count.0,
            watch_id: $r.watch_id,
            trigger: $r.trigger,
            channel: $r.channel,
            sent_value: $r.sent_value,
            subscription_id: $r.subscription_id,
            detected_at: $r.detected_at,
            traceparent: $r.traceparent,
            baseline_price: $r.baseline_price,
            baseline_reference: $r.baseline_reference,
            baseline_in_stock: $r.baseline_in_stock,
            valid_until: $r.valid_until,
        }
    };
}

/// Locks rows `ids` in id order (so two transactions cannot deadlock). With `days` (every
/// result carried its row's dedup day) only those days' partitions are read; without, every
/// partition's primary-key index.
pub async fn lock(
    conn: &mut PgConnection,
    ids: &[OutboxId],
    days: Option<&[NaiveDate]>,
) -> Result<Vec<Locked>, sqlx::Error> {
    // Two statements rather than one with `$2 IS NULL OR …`, which Postgres cannot prune by.
    macro_rules! lock_where {
        ($condition:tt $(, $arg:expr)*) => {
            sqlx::query!(
                r#"SELECT id AS "id: OutboxId", dedup_day, status AS "status: Status",
                          attempt AS "attempt: Count", retry_count AS "retry_count: Count",
                          watch_id AS "watch_id: WatchId", trigger AS "trigger: TriggerColumn",
                          channel AS "channel: Channel",
                          sent_value AS "sent_value: Json<Observation>",
                          subscription_id AS "subscription_id: SubscriptionId", detected_at,
                          traceparent, baseline_price, baseline_reference, baseline_in_stock,
                          (payload->>'valid_until')::timestamptz AS valid_until
                   FROM outbox WHERE id = ANY($1) "# + $condition + " ORDER BY id FOR UPDATE"
                $(, $arg)*
            )
            .fetch_all(conn)
            .await?
            .into_iter()
            .map(|r| locked!(r))
            .collect::<Vec<_>>()
        };
    }
    Ok(match days {
        Some(days) => lock_where!("AND dedup_day = ANY($2)", ids as _, days),
        None => lock_where!("", ids as _),
    })
}
