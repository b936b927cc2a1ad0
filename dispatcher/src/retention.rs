//! Retention: the outbox is partitioned by week of its dedup day (migration 0010). Once an hour
//! one dispatcher (an advisory lock) makes the coming weeks' partitions and drops the weeks that
//! have wholly left `TIDINGS_RETENTION` once every row in them is decided; then whatever was
//! soft-deleted long enough ago that no retained row refers to it is purged (migration 0011).
//! Ingest makes a week on demand when a detection falls outside what exists
//! ([`tidings_store::partitions::Partitions::ensure`]). What to make and
//! drop is decided by [`tidings_domain::retention::plan`]; the database functions re-check every
//! drop, so a wrong plan cannot drop a week inside the window or with a row still to decide.

use chrono::{NaiveDate, Utc};
use sqlx::PgPool;
use std::time::Duration;
use tidings_domain::retention::{self, Partition, Retention};
use tidings_store::partitions::{self, DropError, DropOutcome};
use tidings_store::{DbError, db};
use tokio_util::sync::CancellationToken;

/// Only one dispatcher makes and drops partitions at a time.
const LOCK_KEY: &str = "tidings.outbox_retention";

/// What one round did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// False when another dispatcher held the lock: this one did nothing.
    pub ran: bool,
    pub created: Vec<NaiveDate>,
    pub dropped: Vec<NaiveDate>,
    /// Expired weeks kept because a row in them is still pending, retrying or sending.
    pub kept: Vec<NaiveDate>,
    /// Soft-deleted watches, deactivated subscriptions and removed devices deleted for good,
    /// now that no retained row can refer to them.
    pub purged: Purged,
    /// Devices' reports of what they showed, for notifications that left with their week.
    pub shown_purged: u64,
}

pub use tidings_store::partitions::Purged;

/// Rows of each kind one purge statement deletes: small enough to hold its locks briefly.
const PURGE_BATCH: i32 = 5_000;

/// Deletes everything removed long enough ago that no retained outbox row refers to it, a batch
/// at a time.
pub async fn purge_removed(pool: &PgPool) -> Result<Purged, DbError> {
    let mut total = Purged::default();
    loop {
        let p = partitions::purge_removed_batch(pool, PURGE_BATCH)
            .await
            .map_err(db("purging removed watches, subscriptions and devices"))?;
        total.watches += p.watches;
        total.subscriptions += p.subscriptions;
        total.devices += p.devices;
        let batch = i64::from(PURGE_BATCH);
        if p.watches < batch && p.subscriptions < batch && p.devices < batch {
            return Ok(total);
        }
    }
}

/// One round on `today`: make what is missing, drop what expired and is decided.
pub async fn run_once(
    pool: &PgPool,
    retention: Retention,
    today: NaiveDate,
) -> Result<Round, RetentionError> {
    let mut tx = pool
        .begin()
        .await
        .map_err(db("starting a retention round"))?;
    if !partitions::try_lock(&mut tx, LOCK_KEY)
        .await
        .map_err(db("taking the retention lock"))?
    {
        return Ok(Round::default());
    }
    let existing: Vec<Partition> =
        partitions::with_undecided_rows(&mut tx, |week| retention.expired(week, today))
            .await
            .map_err(db("listing the outbox partitions"))?
            .into_iter()
            .map(|(week, live)| Partition { week, live })
            .collect();
    let plan = retention::plan(today, retention, &existing);
    let mut round = Round {
        ran: true,
        kept: plan.kept,
        ..Round::default()
    };
    for week in plan.ensure {
        if partitions::create(&mut tx, week)
            .await
            .map_err(db("creating an outbox partition"))?
        {
            round.created.push(week);
        }
    }
    for week in plan.drop {
        match partitions::drop_expired(&mut tx, week, retention.in_days()).await? {
            DropOutcome::Dropped => round.dropped.push(week),
            // A row became undecided between the listing and the lock (a replay): next round.
            DropOutcome::Kept => round.kept.push(week),
            DropOutcome::Absent => {}
        }
    }
    tx.commit()
        .await
        .map_err(db("committing a retention round"))?;
    round.purged = purge_removed(pool).await?;
    if let Some(kept_from) = partitions::kept_from(pool)
        .await
        .map_err(db("reading the oldest outbox week"))?
    {
        round.shown_purged = tidings_store::shown::purge_before(pool, kept_from)
            .await
            .map_err(db("purging what devices showed"))?;
    }
    Ok(round)
}

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("dropping an expired outbox partition: {0}")]
    Drop(#[from] DropError),
}

/// Deletes the operators' audit actions from before `today` less `keep` (in the replica that
/// holds the retention lock this round).
pub async fn purge_audit(pool: &PgPool, keep: Retention, today: NaiveDate) -> Option<u64> {
    let from = today - chrono::Days::new(u64::from(keep.in_days()));
    let before = from.and_time(chrono::NaiveTime::MIN).and_utc();
    match tidings_store::audit::purge_before(pool, before).await {
        Ok(n) => {
            if n > 0 {
                tracing::info!(deleted = n, before = %before, "old operator actions left the audit trail");
            }
            Some(n)
        }
        Err(e) => {
            tidings_runtime::metrics::metrics()
                .failed(tidings_runtime::metrics::Failure::Retention);
            tracing::error!(error = %e, "purging the audit trail failed; the next round tries again");
            None
        }
    }
}

/// Rounds every `interval` until `shutdown` (the first at once).
pub async fn run(
    pool: PgPool,
    retention: Retention,
    audit_retention: Retention,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let progress = tidings_runtime::liveness::Progress::register("retention");
    loop {
        progress.idle_for(interval);
        let today = Utc::now().date_naive();
        match run_once(&pool, retention, today).await {
            Ok(round) if round.ran => {
                purge_audit(&pool, audit_retention, today).await;
                crate::metrics::metrics()
                    .expired_partitions_kept
                    // Gauges saturate at `i64::MAX`, which no count of weeks reaches.
                    .set(i64::try_from(round.kept.len()).unwrap_or(i64::MAX));
                if !round.created.is_empty() || !round.dropped.is_empty() {
                    tracing::info!(created = ?round.created, dropped = ?round.dropped, "outbox partitions");
                }
                if round.purged != Purged::default() {
                    tracing::info!(
                        watches = round.purged.watches,
                        subscriptions = round.purged.subscriptions,
                        devices = round.purged.devices,
                        "removed watches, subscriptions and devices purged"
                    );
                }
                if !round.kept.is_empty() {
                    tracing::warn!(weeks = ?round.kept, retention_days = retention.in_days(), "expired outbox weeks kept: a row in each is still pending, retrying or sending");
                }
            }
            Ok(_) => {}
            Err(e) => {
                tidings_runtime::metrics::metrics()
                    .failed(tidings_runtime::metrics::Failure::Retention);
                tracing::error!(error = %e, "retention round failed; the next one tries again");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
