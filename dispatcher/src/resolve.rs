//! What push results do, decided without I/O (the results loop, [`crate::results`], locks the
//! rows, writes what is decided here and counts it): each result's transition by the shared
//! state machine, the attempt record it leaves, the baseline a `sent` row advances, and what a
//! batch says about a webhook endpoint. Dispatch's decisions are beside it in [`crate::plan`].

use chrono::Utc;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tidings_domain::messages::{Outcome, PushResult};
use tidings_domain::outbox::{self, Event, Row, Status};
use tidings_domain::push;
use tidings_domain::receiver::Observed;
use tidings_domain::trigger::Observation;
use tidings_domain::withdrawal::Promise;
use tidings_domain::{Channel, OutboxId};
use tidings_store::attempts::Attempt;
use tidings_store::baselines;
use tidings_store::rows::Locked;
use tidings_store::transition::{Change, Ending};

use crate::config::Settings;

/// How long the attempt took; a result the pusher did not time (the sweeper's, an older
/// pusher's) has no duration. (Milliseconds past `i64::MAX` are 292 million years: saturating
/// cannot change a real one.)
pub(crate) fn duration_of(result: &PushResult) -> Option<i64> {
    result
        .started_at
        .map(|_| i64::try_from(result.latency_ms).unwrap_or(i64::MAX))
}

/// The record of the attempt `result` reports.
pub(crate) fn attempt_of(row: &Locked, result: &PushResult) -> Attempt {
    Attempt {
        outbox_id: row.id,
        dedup_day: row.dedup_day,
        // Recorded only for attempts up to the row's own, which its `int` column holds.
        attempt: i32::try_from(result.attempt).unwrap_or(i32::MAX),
        started_at: result.started_at,
        subscription_id: row.subscription_id,
        push_host: result.push_host.clone(),
        outcome: result.outcome().into(),
        http_status: result.http_status.map(i32::from),
        error: result.error.clone(),
        duration_ms: duration_of(result),
        push_message_id: result.ended.message_id().map(str::to_owned),
    }
}

/// The transition `result` makes to `row`, if any: none for a result of an older attempt, a
/// second result of the same attempt in the batch, or an outcome the row's state ignores.
pub(crate) fn change_for(
    row: &Locked,
    current: Row,
    result: &PushResult,
    settings: &Settings,
    seen: &mut HashSet<OutboxId>,
) -> Option<Change> {
    // A result of an older attempt is stale: a newer attempt owns the row now.
    if current.attempt != result.attempt || seen.contains(&result.outbox_id) {
        return None;
    }
    let event = push::event(result);
    match current.status {
        Status::Sending => {}
        // A late result of the last attempt, which the sweeper (or an earlier transient
        // result) already sent back to retry: only an outcome that ends the row counts.
        Status::Retry if !matches!(event, Event::Transient | Event::Unknown) => {
            tracing::info!(outbox_id = %row.id, attempt = result.attempt, outcome = result.outcome().as_str(), "late result of the last attempt applied to a retrying row");
        }
        // Terminal, or a pending row (no attempt yet): nothing to do.
        _ => return None,
    }
    let mut t = outbox::apply(current, event, settings.retry.max_retries).ok()?;
    // A result that ends the row unsent (gone, refused) may follow a push that reached the user
    // (a redelivered request whose first holder died): the row keeps that mark.
    if result.ended.maybe_delivered() && t.to != Status::Sent {
        t.maybe_delivered = true;
    }
    seen.insert(result.outbox_id);
    let mut c = Change::new(row.id, row.dedup_day, current, t);
    c.http_status = result.http_status;
    c.push_message_id = result.ended.message_id().map(str::to_owned);
    if let Some(e) = &result.error {
        c.last_error = Some(format!("{}: {e}", result.outcome().as_str()));
    } else if result.outcome() != Outcome::Delivered {
        c.last_error = Some(result.outcome().as_str().to_owned());
    }
    if t.to == Status::Retry {
        let retry_after = result.ended.retry_after().map(Duration::from_secs);
        let delay = match retry_after {
            // A webhook receiver that asks to slow down sets the pace of its rows.
            Some(asked)
                if row.channel == Channel::Webhook
                    && push::back_pressure(result.http_status, result.ended.retry_after()) =>
            {
                settings.retry.paced(asked)
            }
            _ => settings.retry.delay(current.retry_count, retry_after),
        };
        c.next_attempt_at = Some(Utc::now() + delay);
    }
    if matches!(result.http_status, Some(401 | 403)) {
        tracing::error!(
            outbox_id = %row.id,
            http_status = result.http_status,
            "push service rejected our VAPID credentials: check TIDINGS_VAPID_PRIVATE_KEY and the subject"
        );
    }
    Some(c)
}

/// What a batch of results does, before it is written.
#[derive(Default)]
pub(crate) struct Planned {
    pub changes: Vec<Change>,
    /// Attempts with no record yet: the row is still `sending` with that attempt, under our lock.
    pub fresh: Vec<Attempt>,
    /// Attempts that may have a record already: a late or repeated result.
    pub late: Vec<Attempt>,
}

pub(crate) fn plan(
    results: &[&PushResult],
    rows: &HashMap<OutboxId, &Locked>,
    settings: &Settings,
) -> Planned {
    let mut planned = Planned::default();
    let mut seen = HashSet::new();
    let mut recorded = HashSet::new();
    for result in results {
        let Some(row) = rows.get(&result.outbox_id) else {
            tracing::warn!(outbox_id = %result.outbox_id, "result for an unknown outbox row");
            continue;
        };
        let current = Row {
            status: row.status,
            retry_count: row.retry_count,
            attempt: row.attempt,
        };
        // Every attempt the row has made is recorded once, a stale one's result included: the
        // record is history, whatever the result does to the row. The attempt that ends the row
        // is recorded on it by the same update; any other in `outbox_attempts`.
        // The record itself is built only where it is written (the common delivered-at-once
        // result ends its row and needs none).
        let record = result.attempt >= 1
            && result.attempt <= current.attempt
            && recorded.insert((result.outbox_id, result.attempt));
        let change = change_for(row, current, result, settings, &mut seen);
        match (change, record) {
            (Some(mut c), _) if c.transition.to.is_terminal() => {
                c.ending = Some(Ending {
                    outcome: result.outcome().into(),
                    started_at: result.started_at,
                    push_host: result.push_host.clone(),
                    duration_ms: duration_of(result),
                });
                planned.changes.push(c);
            }
            // A repeated result of the attempt that ended the row: that attempt is on record.
            (None, true) if current.status.is_terminal() && result.attempt == current.attempt => {}
            (change, true) => {
                let a = attempt_of(row, result);
                if current.status == Status::Sending && result.attempt == current.attempt {
                    planned.fresh.push(a);
                } else {
                    planned.late.push(a);
                }
                planned.changes.extend(change);
            }
            (change, false) => planned.changes.extend(change),
        }
    }
    planned
}

/// The baseline row `row` leaves, having sent `sent`. A notification leaves what it stated and
/// until when, so that it can be withdrawn; a withdrawal leaves the value it reported under the
/// withdrawn trigger's key, and nothing left to withdraw.
pub(crate) fn advance<'r>(row: &'r Locked, sent: &Observation) -> baselines::Advance<'r> {
    let promise = match (row.trigger.withdrawal, row.valid_until) {
        (false, Some(valid_until)) => Some(Promise {
            outbox_id: row.id,
            dedup_day: row.dedup_day,
            observed_at: sent.observed_at,
            valid_until,
            decided_on: row.baseline(),
        }),
        _ => None,
    };
    baselines::Advance {
        watch_id: row.watch_id,
        trigger: &row.trigger.key,
        price: sent.price,
        in_stock: sent.in_stock,
        outbox_id: row.id,
        promise,
    }
}

/// What one result batch said about one endpoint.
#[derive(Default)]
pub(crate) struct Said {
    pub delivered: bool,
    pub failed: bool,
    /// The longest `Retry-After` of its answers that asked to slow down.
    pub slow_down: Option<Duration>,
}

impl Said {
    pub fn observed(&self) -> Observed {
        match (self.delivered, self.failed) {
            (true, _) => Observed::Delivered,
            (false, true) => Observed::Failed,
            (false, false) => Observed::SlowDown,
        }
    }
}
