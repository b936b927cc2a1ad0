//! The lease sweeper: `sending` rows whose lease ran out with no result.
//!
//! Before giving up on an attempt the sweeper asks the delivery log (written by the pusher right
//! after a push service accepts a request) whether the attempt was delivered:
//!
//! - delivered: the row ends `sent`, with its baseline, exactly as if the result had arrived
//!   (the result was lost, or a dispatcher died holding it); it is never pushed again;
//! - a digest's other rows are not swept on their own: they share their leader's one message, so
//!   whatever is decided for the leader is decided for them in the same transaction (one whose
//!   leader moved on without it, by a pusher that did not hand the members back, is an unknown
//!   outcome: retried, maybe delivered);
//! - not on record: the outcome is unknown (the pusher may have died between its POST and the
//!   record, or never got the request), so the row goes back to `retry` (or `failed` at the cap),
//!   recording `lease_expired`, and is marked *maybe delivered*. If the attempt's result still
//!   turns up before the next attempt starts, it is honoured (see `results`);
//! - the log cannot be asked: the row is left `sending` for the next sweep. Retrying without
//!   knowing could send a delivered notification twice; waiting costs only time.
//!
//! Safe against a push still in flight because the lease outlives every push that can still
//! start for the row (config refuses a lease shorter than push deadline + HTTP timeout + result
//! ack wait + margin, and the pusher refuses requests past their deadline). Rows are selected
//! with `FOR UPDATE SKIP LOCKED` and changed by compare-and-set on (status, attempt) in the same
//! transaction, so a result that is being applied right now wins and the sweeper leaves that
//! row alone.

use chrono::Utc;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use tidings_bus::delivered::{Delivery, DeliveryLog};
use tidings_domain::OutboxId;
use tidings_domain::messages::{AttemptOutcome, Ended, Member, PushResult};
use tidings_domain::outbox::{self, Event, Status};
use tidings_store::attempts::{self, Attempt};
use tidings_store::sweep::{self, Expired};
use tidings_store::transition::{self, Change, Ending};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::{digest, results};

pub const LEASE_EXPIRED_ERROR: &str = "lease_expired: no push result before the lease ran out";

/// Rows the sweeper looks at per transaction.
const SWEEP_BATCH: i64 = 1000;

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepStats {
    /// Rows whose delivery was on record: now `sent`.
    pub delivered: usize,
    /// Rows with no delivery on record: back to `retry` (or `failed` at the cap).
    pub expired: usize,
    /// Rows left `sending` because the delivery log could not be asked.
    pub deferred: usize,
}

impl SweepStats {
    pub fn moved(&self) -> usize {
        self.delivered + self.expired
    }
}

/// What one batch of expired rows comes to, before it is written.
#[derive(Default)]
struct Planned {
    /// Rows the delivery log says were delivered: applied as results.
    delivered: Vec<PushResult>,
    /// Rows with no delivery on record: to `retry` (or `failed` at the cap).
    changes: Vec<Change>,
    /// The attempts of rows going back to `retry`, on record as `lease_expired`.
    unknown: Vec<Attempt>,
    deferred: usize,
}

/// A result for a row the delivery log says was delivered (by this attempt or an earlier one,
/// whose push reached the user).
fn found_delivered(expired: &Expired, done: Delivery) -> PushResult {
    let row = expired.row();
    tracing::warn!(outbox_id = %expired.id, attempt = row.attempt, delivered_by = done.attempt, "lease expired; the delivery log says it was delivered");
    let delivered = Ended::Delivered {
        message_id: done.message_id,
    };
    PushResult {
        error: Some(format!(
            "result lost; attempt {} found in the delivery log",
            done.attempt
        )),
        dedup_day: Some(expired.dedup_day),
        ..PushResult::new(expired.id, row.attempt, delivered)
    }
}

/// A row whose attempt nobody knows the outcome of: retried (or failed at the cap) and marked
/// maybe delivered. The attempt that ends the row is recorded on it; one that sends it back to
/// retry is on record as `lease_expired` until (unless) its result turns up.
fn outcome_unknown(expired: &Expired, settings: &Settings, plan: &mut Planned) {
    let row = expired.row();
    let Ok(t) = outbox::apply(row, Event::Unknown, settings.retry.max_retries) else {
        return;
    };
    let mut c = Change::new(expired.id, expired.dedup_day, row, t);
    c.last_error = Some(LEASE_EXPIRED_ERROR.to_owned());
    if t.to == Status::Retry {
        c.next_attempt_at = Some(Utc::now() + settings.retry.delay(row.retry_count, None));
    }
    tracing::warn!(outbox_id = %expired.id, attempt = row.attempt, to = %t.to, "lease expired without a push result or a delivery on record");
    if t.to.is_terminal() {
        c.ending = Some(Ending {
            outcome: AttemptOutcome::LeaseExpired,
            started_at: None,
            push_host: None,
            duration_ms: None,
        });
    } else {
        plan.unknown.push(Attempt {
            outbox_id: expired.id,
            dedup_day: expired.dedup_day,
            // Read from the row's `int` column, so it fits.
            attempt: i32::try_from(expired.attempt).unwrap_or(i32::MAX),
            started_at: None,
            subscription_id: expired.subscription_id,
            push_host: None,
            outcome: AttemptOutcome::LeaseExpired,
            http_status: None,
            error: Some(LEASE_EXPIRED_ERROR.to_owned()),
            duration_ms: None,
            push_message_id: None,
        });
    }
    plan.changes.push(c);
}

/// Sweeps one batch.
pub async fn sweep_once(
    pool: &PgPool,
    settings: &Settings,
    log: &DeliveryLog,
) -> Result<SweepStats, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let expired = sweep::lock_expired(&mut tx, SWEEP_BATCH).await?;
    if expired.is_empty() {
        return Ok(SweepStats::default());
    }
    let leaders: Vec<OutboxId> = expired.iter().filter(|e| e.leads()).map(|e| e.id).collect();
    let mut members: HashMap<OutboxId, Vec<Expired>> = HashMap::new();
    for m in sweep::members_of(&mut tx, &leaders).await? {
        if let Some(leader) = m.digest_of {
            members.entry(leader).or_default().push(m);
        }
    }
    let lookups = futures::future::join_all(expired.iter().map(|e| log.lookup(e.id))).await;
    let mut plan = Planned::default();
    for (expired, lookup) in expired.iter().zip(lookups) {
        // A digest's other rows share its one message, so its fate.
        let carried = members.get(&expired.id).map_or(&[][..], Vec::as_slice);
        // A member swept without its leader: whether the leader's delivery carried it cannot be
        // told (the leader may have gone out again without it), so it is an unknown outcome.
        if expired.digest_of.is_some_and(|l| l != expired.id) {
            outcome_unknown(expired, settings, &mut plan);
            continue;
        }
        match lookup {
            Ok(Some(done)) if done.attempt <= expired.row().attempt => {
                let mut result = found_delivered(expired, done);
                result.members = carried
                    .iter()
                    .map(|m| Member {
                        id: m.id,
                        attempt: m.attempt,
                        day: m.dedup_day,
                    })
                    .collect();
                plan.delivered.push(result);
            }
            Ok(_) => {
                for row in std::iter::once(expired).chain(carried) {
                    outcome_unknown(row, settings, &mut plan);
                }
            }
            // Logged and counted by the log.
            Err(_) => plan.deferred += 1 + carried.len(),
        }
    }
    let carried_by = digest::leaders(
        (members.iter()).map(|(leader, rows)| (*leader, rows.iter().map(|m| m.id))),
    );
    digest::retry_together(&mut plan.changes, |id| carried_by.get(&id));
    let refs: Vec<&PushResult> = plan.delivered.iter().collect();
    let applied = results::apply_in(&mut tx, settings, &refs).await?;
    let won = transition::apply(&mut tx, &plan.changes).await?;
    // The row was `sending` with that attempt under our lock, so nothing recorded it yet.
    plan.unknown.retain(|a| won.contains(&a.outbox_id));
    attempts::insert_new(&mut tx, &plan.unknown).await?;
    tx.commit().await?;
    applied.observe();
    transition::observe(&plan.changes, &won);
    Ok(SweepStats {
        delivered: applied.count(),
        expired: won.len(),
        deferred: plan.deferred,
    })
}

pub async fn run(
    pool: PgPool,
    settings: Arc<Settings>,
    log: Arc<DeliveryLog>,
    shutdown: CancellationToken,
) {
    let progress = tidings_runtime::liveness::Progress::register("sweep");
    loop {
        progress.idle_for(settings.sweep_interval);
        match sweep_once(&pool, &settings, &log).await {
            Ok(s) if s.moved() > 0 || s.deferred > 0 => {
                tracing::info!(
                    delivered = s.delivered,
                    expired = s.expired,
                    deferred = s.deferred,
                    "sweeper handled expired leases"
                )
            }
            Ok(_) => {}
            Err(e) => {
                tidings_runtime::metrics::metrics()
                    .failed(tidings_runtime::metrics::Failure::Sweep);
                tracing::error!(error = %e, "sweep failed");
            }
        }
        // The pusher may not make the delivery log: a bucket lost outright (a broker that lost
        // its storage) is made again here, within a sweep interval.
        if let Err(e) = log.restore_if_lost().await {
            tracing::error!(error = %e, "the delivery log is gone and could not be made again");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
    }
}
