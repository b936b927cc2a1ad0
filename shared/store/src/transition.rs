//! Writing state transitions: a batch of compare-and-sets in one statement.
//!
//! Every change names the state and attempt it expects (`WHERE status = from AND attempt =
//! from_attempt`); a change that lost a race (a result arrived, another dispatcher or the sweeper
//! got there first) matches no row and changes nothing. Callers learn which changes won and act
//! only on those (publish, advance a baseline, deactivate a subscription).

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use std::collections::{HashMap, HashSet};
use tidings_domain::messages::AttemptOutcome;
use tidings_domain::outbox::{Reason, Row, Status, Transition};
use tidings_domain::{OutboxId, SubscriptionId};
use tidings_runtime::metrics::{Counter, Family, TransitionLabels};

/// One planned compare-and-set. Optional columns left `None` keep their value.
#[derive(Clone, Debug)]
pub struct Change {
    pub id: OutboxId,
    /// The row's dedup day: with the id, its whole key, so the update reads one partition.
    pub day: NaiveDate,
    pub from: Status,
    pub from_attempt: u32,
    pub transition: Transition,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub checked: Option<Value>,
    pub sent_value: Option<Value>,
    pub payload: Option<Value>,
    pub subscription_id: Option<SubscriptionId>,
    /// Set when entering `sending`; cleared otherwise.
    pub lease_until: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    pub http_status: Option<u16>,
    pub push_message_id: Option<String>,
    /// The attempt that ends the row, recorded on it (`crate::attempts`).
    pub ending: Option<Ending>,
}

/// What a row records of the attempt that ended it, besides its status, HTTP status, message id
/// and error.
#[derive(Clone, Debug)]
pub struct Ending {
    pub outcome: AttemptOutcome,
    pub started_at: Option<DateTime<Utc>>,
    pub push_host: Option<String>,
    pub duration_ms: Option<i64>,
}

impl Change {
    pub fn new(id: OutboxId, day: NaiveDate, row: Row, transition: Transition) -> Self {
        Change {
            id,
            day,
            from: row.status,
            from_attempt: row.attempt,
            transition,
            next_attempt_at: None,
            last_error: None,
            checked: None,
            sent_value: None,
            payload: None,
            subscription_id: None,
            lease_until: None,
            deadline: None,
            http_status: None,
            push_message_id: None,
            ending: None,
        }
    }
}

fn int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// One compare-and-set per change: the row moves only from the state and attempt the change was
/// decided on. The lease is always cleared, so a claim never outlives the change that ends it.
const APPLY: &str = concat!(
    r#"UPDATE outbox o SET
         status = u.to_status,
         reason = u.reason,
         retry_count = u.retry_count,
         attempt = u.attempt,
         next_attempt_at = COALESCE(u.next_attempt_at, o.next_attempt_at),
         last_error = COALESCE(u.last_error, o.last_error),
         checked = COALESCE(u.checked, o.checked),
         sent_value = COALESCE(u.sent_value, o.sent_value),
         payload = COALESCE(u.payload, o.payload),
         subscription_id = COALESCE(u.subscription_id, o.subscription_id),
         lease_until = u.lease_until,
         claimed_until = NULL,
         deadline = COALESCE(u.deadline, o.deadline),
         http_status = COALESCE(u.http_status, o.http_status),
         push_message_id = COALESCE(u.push_message_id, o.push_message_id),
         maybe_delivered = o.maybe_delivered OR u.maybe_delivered,
         attempt_outcome = COALESCE(u.attempt_outcome, o.attempt_outcome),
         attempt_started_at = COALESCE(u.attempt_started_at, o.attempt_started_at),
         attempt_push_host = COALESCE(u.attempt_push_host, o.attempt_push_host),
         attempt_ms = COALESCE(u.attempt_ms, o.attempt_ms),
         finished_at = CASE WHEN u.to_status IN "#,
    crate::status_sql!(terminal),
    r#" THEN now() END
     FROM UNNEST($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::int[], $7::int[],
                 $8::timestamptz[], $9::text[], $10::jsonb[], $11::jsonb[], $12::jsonb[],
                 $13::uuid[], $14::timestamptz[], $15::timestamptz[], $16::int[], $17::text[],
                 $18::bool[], $19::date[], $20::text[], $21::timestamptz[], $22::text[],
                 $23::bigint[])
          AS u(id, from_status, from_attempt, to_status, reason, retry_count, attempt,
               next_attempt_at, last_error, checked, sent_value, payload,
               subscription_id, lease_until, deadline, http_status, push_message_id,
               maybe_delivered, day, attempt_outcome, attempt_started_at,
               attempt_push_host, attempt_ms)
     WHERE o.id = u.id AND o.dedup_day = u.day
       AND o.status = u.from_status AND o.attempt = u.from_attempt
     RETURNING o.id"#
);

/// The changes as one array per column, in the order [`APPLY`] binds them.
struct Columns<'a> {
    ids: Vec<OutboxId>,
    from: Vec<&'a str>,
    from_attempt: Vec<i32>,
    to: Vec<&'a str>,
    reason: Vec<Option<&'a str>>,
    retry_count: Vec<i32>,
    attempt: Vec<i32>,
    next_attempt_at: Vec<Option<DateTime<Utc>>>,
    last_error: Vec<Option<&'a str>>,
    checked: Vec<Option<Value>>,
    sent_value: Vec<Option<Value>>,
    payload: Vec<Option<Value>>,
    subscription_id: Vec<Option<SubscriptionId>>,
    lease_until: Vec<Option<DateTime<Utc>>>,
    deadline: Vec<Option<DateTime<Utc>>>,
    http_status: Vec<Option<i32>>,
    message_id: Vec<Option<&'a str>>,
    maybe_delivered: Vec<bool>,
    days: Vec<NaiveDate>,
    outcome: Vec<Option<&'a str>>,
    started_at: Vec<Option<DateTime<Utc>>>,
    host: Vec<Option<&'a str>>,
    duration_ms: Vec<Option<i64>>,
}

impl<'a> Columns<'a> {
    fn of(changes: &'a [Change]) -> Self {
        fn col<'a, T>(changes: &'a [Change], f: impl Fn(&'a Change) -> T) -> Vec<T> {
            changes.iter().map(f).collect()
        }
        let ending = |c: &'a Change| c.ending.as_ref();
        Columns {
            ids: col(changes, |c| c.id),
            from: col(changes, |c| c.from.as_str()),
            from_attempt: col(changes, |c| int(c.from_attempt)),
            to: col(changes, |c| c.transition.to.as_str()),
            reason: col(changes, |c| c.transition.reason.map(|r| r.as_str())),
            retry_count: col(changes, |c| int(c.transition.retry_count)),
            attempt: col(changes, |c| int(c.transition.attempt)),
            next_attempt_at: col(changes, |c| c.next_attempt_at),
            last_error: col(changes, |c| c.last_error.as_deref()),
            checked: col(changes, |c| c.checked.clone()),
            sent_value: col(changes, |c| c.sent_value.clone()),
            payload: col(changes, |c| c.payload.clone()),
            subscription_id: col(changes, |c| c.subscription_id),
            lease_until: col(changes, |c| c.lease_until),
            deadline: col(changes, |c| c.deadline),
            http_status: col(changes, |c| c.http_status.map(i32::from)),
            message_id: col(changes, |c| c.push_message_id.as_deref()),
            maybe_delivered: col(changes, |c| c.transition.maybe_delivered),
            days: col(changes, |c| c.day),
            outcome: col(changes, |c| ending(c).map(|e| e.outcome.as_str())),
            started_at: col(changes, |c| ending(c).and_then(|e| e.started_at)),
            host: col(changes, |c| ending(c).and_then(|e| e.push_host.as_deref())),
            duration_ms: col(changes, |c| ending(c).and_then(|e| e.duration_ms)),
        }
    }
}

/// Applies `changes`; returns the ids whose compare-and-set won.
pub async fn apply(
    conn: &mut PgConnection,
    changes: &[Change],
) -> Result<HashSet<OutboxId>, sqlx::Error> {
    if changes.is_empty() {
        return Ok(HashSet::new());
    }
    let c = Columns::of(changes);
    let won: Vec<OutboxId> = sqlx::query_scalar(APPLY)
        .bind(c.ids)
        .bind(c.from)
        .bind(c.from_attempt)
        .bind(c.to)
        .bind(c.reason)
        .bind(c.retry_count)
        .bind(c.attempt)
        .bind(c.next_attempt_at)
        .bind(c.last_error)
        .bind(c.checked)
        .bind(c.sent_value)
        .bind(c.payload)
        .bind(c.subscription_id)
        .bind(c.lease_until)
        .bind(c.deadline)
        .bind(c.http_status)
        .bind(c.message_id)
        .bind(c.maybe_delivered)
        .bind(c.days)
        .bind(c.outcome)
        .bind(c.started_at)
        .bind(c.host)
        .bind(c.duration_ms)
        .fetch_all(conn)
        .await?;
    Ok(won.into_iter().collect())
}

tidings_runtime::families! {
    /// The outbox's state changes, counted by the store that makes them.
    pub struct TransitionMetrics {
        transitions: Family<TransitionLabels, Counter> = Family::default()
            => "tidings_outbox_transitions",
            "Outbox state changes by target state and reason (dropped = correctly withheld)";
    }
}

/// Counts `n` changes to `to` (with `reason`, if it records one).
fn count(to: Status, reason: Option<Reason>, n: u64) {
    metrics()
        .transitions
        .get_or_create(&TransitionLabels {
            to: to.as_str().to_owned(),
            reason: reason.map_or("", Reason::as_str).to_owned(),
        })
        .inc_by(n);
}

/// Creates every (state, reason) series of `tidings_outbox_transitions_total` at 0 (a service
/// that moves rows calls it at start).
pub fn init_metrics() {
    for to in [Status::Sending, Status::Sent, Status::Retry] {
        count(to, None, 0);
    }
    for r in Reason::all() {
        let to = match r {
            Reason::Dropped(_) => Status::Dropped,
            Reason::Failed(_) => Status::Failed,
        };
        count(to, Some(r), 0);
    }
}

/// Counts the changes that won in the metrics, by target state and reason. Call after commit.
pub fn record(changes: &[Change], won: &HashSet<OutboxId>) {
    let mut counts: HashMap<(Status, Option<Reason>), u64> = HashMap::new();
    for c in changes.iter().filter(|c| won.contains(&c.id)) {
        *counts
            .entry((c.transition.to, c.transition.reason))
            .or_default() += 1;
    }
    for ((to, reason), n) in counts {
        count(to, reason, n);
    }
}
