//! The lease sweeper: `sending` rows whose lease ran out with no result.
//!
//! Before giving up on an attempt the sweeper asks the delivery log (written by the pusher right
//! after a push service accepts a request) whether the attempt was delivered:
//!
//! - delivered: the row ends `sent`, with its baseline, exactly as if the result had arrived
//!   (the result was lost, or a dispatcher died holding it); it is never pushed again;
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

use chrono::{NaiveDate, Utc};
use sqlx::PgPool;
use std::sync::Arc;
use tidings_bus::delivered::DeliveryLog;
use tidings_domain::OutboxId;
use tidings_domain::messages::{AttemptOutcome, Outcome, PushResult};
use tidings_domain::outbox::{self, Event, Row, Status};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::results;
use tidings_domain::SubscriptionId;
use tidings_store::attempts::{self, Attempt};
use tidings_store::transition::{self, Change, Ending};

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

#[derive(sqlx::FromRow)]
struct Expired {
    id: OutboxId,
    dedup_day: NaiveDate,
    attempt: i32,
    retry_count: i32,
    subscription_id: Option<SubscriptionId>,
}

/// Sweeps one batch.
pub async fn sweep_once(
    pool: &PgPool,
    settings: &Settings,
    log: &DeliveryLog,
) -> Result<SweepStats, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let expired: Vec<Expired> = sqlx::query_as(concat!(
        "SELECT id, dedup_day, attempt, retry_count, subscription_id FROM outbox
         WHERE status = ",
        tidings_store::status_sql!(sending),
        " AND lease_until < now()
         ORDER BY lease_until
         LIMIT $1
         FOR UPDATE SKIP LOCKED",
    ))
    .bind(SWEEP_BATCH)
    .fetch_all(&mut *tx)
    .await?;
    if expired.is_empty() {
        return Ok(SweepStats::default());
    }
    let lookups = futures::future::join_all(expired.iter().map(|e| log.lookup(e.id))).await;

    let mut stats = SweepStats::default();
    let mut delivered = Vec::new();
    let mut changes = Vec::new();
    let mut unknown = Vec::new();
    for (expired, lookup) in expired.into_iter().zip(lookups) {
        let (id, day) = (expired.id, expired.dedup_day);
        let row = Row {
            status: Status::Sending,
            retry_count: u32::try_from(expired.retry_count).unwrap_or(0),
            attempt: u32::try_from(expired.attempt).unwrap_or(0),
        };
        match lookup {
            // Delivered by this attempt (or an earlier one, whose push reached the user).
            Ok(Some(done)) if done.attempt <= row.attempt => {
                tracing::warn!(outbox_id = %id, attempt = row.attempt, delivered_by = done.attempt, "lease expired; the delivery log says it was delivered");
                delivered.push(PushResult {
                    message_id: done.message_id,
                    error: Some(format!(
                        "result lost; attempt {} found in the delivery log",
                        done.attempt
                    )),
                    dedup_day: Some(day),
                    ..PushResult::new(id, row.attempt, Outcome::Delivered)
                });
            }
            Ok(_) => {
                if let Ok(t) = outbox::apply(row, Event::Unknown, settings.retry.max_retries) {
                    let mut c = Change::new(id, day, row, t);
                    c.last_error = Some(LEASE_EXPIRED_ERROR.to_owned());
                    if t.to == Status::Retry {
                        c.next_attempt_at =
                            Some(Utc::now() + settings.retry.delay(row.retry_count, None));
                    }
                    tracing::warn!(outbox_id = %id, attempt = row.attempt, to = %t.to, "lease expired without a push result or a delivery on record");
                    // The attempt that ends the row (at the retry cap) is recorded on it; one
                    // that sends it back to retry is on record as `lease_expired` until (unless)
                    // its result turns up.
                    if t.to.is_terminal() {
                        c.ending = Some(Ending {
                            outcome: AttemptOutcome::LeaseExpired,
                            started_at: None,
                            push_host: None,
                            duration_ms: None,
                        });
                        changes.push(c);
                        continue;
                    }
                    changes.push(c);
                    unknown.push(Attempt {
                        outbox_id: id,
                        dedup_day: day,
                        attempt: expired.attempt,
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
            }
            // Logged and counted by the log.
            Err(_) => stats.deferred += 1,
        }
    }
    let refs: Vec<&PushResult> = delivered.iter().collect();
    let applied = results::apply_in(&mut tx, settings, &refs).await?;
    let won = transition::apply(&mut tx, &changes).await?;
    // The attempt is on record as `lease_expired` until (unless) its result turns up. The row
    // was `sending` with that attempt under our lock, so nothing recorded it yet.
    unknown.retain(|a| won.contains(&a.outbox_id));
    attempts::insert_new(&mut tx, &unknown).await?;
    tx.commit().await?;
    applied.record();
    transition::record(&changes, &won);
    stats.delivered = applied.count();
    stats.expired = won.len();
    Ok(stats)
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
                tidings_runtime::metrics::metrics().failed("sweep");
                tracing::error!(error = %e, "sweep failed");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
    }
}
