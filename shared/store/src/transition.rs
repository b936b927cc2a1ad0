//! Writing state transitions: a batch of compare-and-sets in one statement.
//!
//! Every change names the state and attempt it expects (`WHERE status = from AND attempt =
//! from_attempt`); a change that lost a race (a result arrived, another dispatcher or the sweeper
//! got there first) matches no row and changes nothing. Callers learn which changes won and act
//! only on those (publish, advance a baseline, deactivate a subscription).

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::value::RawValue;
use sqlx::types::Json;
use sqlx::{Connection as _, PgConnection, Row as _};
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use tidings_domain::messages::AttemptOutcome;
use tidings_domain::outbox::{Reason, Row, Status, Transition};
use tidings_domain::trigger::Observation;
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
    /// What the re-check read, and (entering `sending`) the value the notification states:
    /// serialised straight to jsonb text, with no `serde_json::Value` tree between.
    pub checked: Option<Observation>,
    pub sent_value: Option<Observation>,
    /// The payload as sent, as JSON text: serialised straight from the notification, with no
    /// `serde_json::Value` tree built between.
    pub payload: Option<Box<RawValue>>,
    pub subscription_id: Option<SubscriptionId>,
    /// Set when entering `sending`; cleared otherwise.
    pub lease_until: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    pub http_status: Option<u16>,
    pub push_message_id: Option<String>,
    /// The attempt that ends the row, recorded on it (`crate::attempts`).
    pub ending: Option<Ending>,
    /// For a row going out in a digest: the row the digest is sent for (its leader). A change
    /// from `pending` or `retry` writes it (none: the row's attempt is its own); a result keeps
    /// it, so it names the digest that carried the row's last attempt.
    pub digest_of: Option<OutboxId>,
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
            digest_of: None,
        }
    }
}

/// A count as the schema's `int` columns store it. The state machine bounds attempts and
/// retries far below `i32::MAX` (`max_retries`), so saturating never changes a real value; a
/// saturated `from_attempt` would match no row and lose its compare-and-set.
fn int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

crate::unnest::unnest_rows! {
    /// One change as [`apply`] binds it: the columns of table `u` in its statement.
    struct ChangeRow<'a> {
        id: OutboxId,
        day: NaiveDate,
        from_status: Status,
        from_attempt: i32,
        to_status: Status,
        reason: Option<Reason>,
        retry_count: i32,
        attempt: i32,
        next_attempt_at: Option<DateTime<Utc>>,
        last_error: Option<&'a str>,
        checked: Option<Json<&'a Observation>>,
        sent_value: Option<Json<&'a Observation>>,
        payload: Option<Json<&'a RawValue>>,
        subscription_id: Option<SubscriptionId>,
        lease_until: Option<DateTime<Utc>>,
        deadline: Option<DateTime<Utc>>,
        http_status: Option<i32>,
        push_message_id: Option<&'a str>,
        maybe_delivered: bool,
        attempt_outcome: Option<AttemptOutcome>,
        attempt_started_at: Option<DateTime<Utc>>,
        attempt_push_host: Option<&'a str>,
        attempt_ms: Option<i64>,
        digest_of: Option<OutboxId>,
    }
}

impl<'a> ChangeRow<'a> {
    fn of(c: &'a Change) -> Self {
        let ending = c.ending.as_ref();
        ChangeRow {
            id: c.id,
            day: c.day,
            from_status: c.from,
            from_attempt: int(c.from_attempt),
            to_status: c.transition.to,
            reason: c.transition.reason,
            retry_count: int(c.transition.retry_count),
            attempt: int(c.transition.attempt),
            next_attempt_at: c.next_attempt_at,
            last_error: c.last_error.as_deref(),
            checked: c.checked.as_ref().map(Json),
            sent_value: c.sent_value.as_ref().map(Json),
            payload: c.payload.as_deref().map(Json),
            subscription_id: c.subscription_id,
            lease_until: c.lease_until,
            deadline: c.deadline,
            http_status: c.http_status.map(i32::from),
            push_message_id: c.push_message_id.as_deref(),
            maybe_delivered: c.transition.maybe_delivered,
            attempt_outcome: ending.map(|e| e.outcome),
            attempt_started_at: ending.and_then(|e| e.started_at),
            attempt_push_host: ending.and_then(|e| e.push_host.as_deref()),
            attempt_ms: ending.and_then(|e| e.duration_ms),
            digest_of: c.digest_of,
        }
    }
}

/// One compare-and-set per change: the row moves only from the state and attempt the change was
/// decided on. The lease is always cleared, so a claim never outlives the change that ends it.
/// Stamping `updated_at` itself lets the guard trigger skip its PL/pgSQL call for a change that
/// breaks none of its rules (migration 0028).
static APPLY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE outbox o SET
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
             digest_of = CASE WHEN u.from_status IN {due} THEN u.digest_of ELSE o.digest_of END,
             finished_at = CASE WHEN u.to_status IN {terminal} THEN now() END,
             updated_at = now()
         FROM {rows}
         WHERE o.id = u.id AND o.dedup_day = u.day
           AND o.status = u.from_status AND o.attempt = u.from_attempt
         RETURNING o.id",
        terminal = crate::status_sql!(terminal),
        due = crate::status_sql!(due),
        rows = ChangeRow::table("u"),
    )
});

/// Applies `changes`; returns the ids whose compare-and-set won. Inside the caller's
/// transaction if there is one, else in a transaction of its own; either way under
/// [`plan_by_key`], which lasts until that transaction ends.
pub async fn apply(
    conn: &mut PgConnection,
    changes: &[Change],
) -> Result<HashSet<OutboxId>, sqlx::Error> {
    if changes.is_empty() {
        return Ok(HashSet::new());
    }
    if conn.is_in_transaction() {
        return apply_by_key(conn, changes).await;
    }
    let mut tx = conn.begin().await?;
    let won = apply_by_key(&mut tx, changes).await?;
    tx.commit().await?;
    Ok(won)
}

/// Makes the transaction's later statements find outbox rows by key, not by scanning: hash and
/// merge joins and sequential scans are priced out (still used where nothing else can run).
///
/// The transition names each row by its primary key, so one index probe a change is the right
/// plan at any size. But a week's partition starts empty and can fill faster than autovacuum
/// (which looks once a minute) refreshes its statistics, and a plan made while it looked small
/// joins the changes by hash over a scan of every partition; the connection keeps that plan
/// until the next analyze. In `bench pipeline` rounds where connections did so, Postgres read
/// 109–139 buffers a `sent` instead of ~90 and took 190–282 µs a `sent` instead of ~150. The statements that
/// follow a transition in a transaction (attempts, baselines, subscriptions) are keyed too.
async fn plan_by_key(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    let settings = [
        ("enable_hashjoin", "off"),
        ("enable_mergejoin", "off"),
        ("enable_seqscan", "off"),
    ];
    crate::planner::for_transaction(conn, &settings).await
}

async fn apply_by_key(
    conn: &mut PgConnection,
    changes: &[Change],
) -> Result<HashSet<OutboxId>, sqlx::Error> {
    plan_by_key(conn).await?;
    let rows: Vec<ChangeRow<'_>> = changes.iter().map(ChangeRow::of).collect();
    let won: Vec<OutboxId> = ChangeRow::bind(&rows, sqlx::query(APPLY.as_str()))
        .fetch_all(conn)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
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
pub fn observe(changes: &[Change], won: &HashSet<OutboxId>) {
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
