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
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy, sqlx::FromRow)]
pub struct Purged {
    pub watches: i64,
    pub subscriptions: i64,
    pub devices: i64,
}

/// Rows of each kind one purge statement deletes: small enough to hold its locks briefly.
const PURGE_BATCH: i32 = 5_000;

/// Deletes everything removed long enough ago that no retained outbox row refers to it (the
/// database function decides, from the oldest week it holds).
pub async fn purge_removed(pool: &PgPool) -> Result<Purged, DbError> {
    let mut total = Purged::default();
    loop {
        let p: Purged = sqlx::query_as("SELECT * FROM tidings_purge_removed($1)")
            .bind(PURGE_BATCH)
            .fetch_one(pool)
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

/// The weekly partitions that exist, each with whether a row in it is still to be decided (asked
/// only of expired weeks: the others are kept whatever they hold).
async fn partitions(
    tx: &mut sqlx::PgConnection,
    retention: Retention,
    today: NaiveDate,
) -> Result<Vec<Partition>, sqlx::Error> {
    let weeks = tidings_store::partitions::weeks(&mut *tx).await?;
    let mut out = Vec::with_capacity(weeks.len());
    for week in weeks {
        let live = retention.expired(week, today)
            && sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE dedup_day >= $1 AND dedup_day < $1 + 7
                                AND status IN ('pending', 'retry', 'sending'))",
            )
            .bind(week)
            .fetch_one(&mut *tx)
            .await?;
        out.push(Partition { week, live });
    }
    Ok(out)
}

/// One round on `today`: make what is missing, drop what expired and is decided.
pub async fn run_once(
    pool: &PgPool,
    retention: Retention,
    today: NaiveDate,
) -> Result<Round, DbError> {
    let mut tx = pool
        .begin()
        .await
        .map_err(db("starting a retention round"))?;
    let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext($1))")
        .bind(LOCK_KEY)
        .fetch_one(&mut *tx)
        .await
        .map_err(db("taking the retention lock"))?;
    if !ours {
        return Ok(Round::default());
    }
    let existing = partitions(&mut tx, retention, today)
        .await
        .map_err(db("listing the outbox partitions"))?;
    let plan = retention::plan(today, retention, &existing);
    let mut round = Round {
        ran: true,
        ..Round::default()
    };
    for week in plan.ensure {
        let made: bool = sqlx::query_scalar("SELECT outbox_ensure_partition($1)")
            .bind(week)
            .fetch_one(&mut *tx)
            .await
            .map_err(db("creating an outbox partition"))?;
        if made {
            round.created.push(week);
        }
    }
    round.kept = plan.kept;
    for week in plan.drop {
        let done: String = sqlx::query_scalar("SELECT outbox_drop_partition($1, $2)")
            .bind(week)
            .bind(i32::try_from(retention.in_days()).unwrap_or(i32::MAX))
            .fetch_one(&mut *tx)
            .await
            .map_err(db("dropping an expired outbox partition"))?;
        match done.as_str() {
            "dropped" => round.dropped.push(week),
            // A row became live between the listing and the lock (a replay): next round.
            "kept" => round.kept.push(week),
            _ => {}
        }
    }
    tx.commit()
        .await
        .map_err(db("committing a retention round"))?;
    round.purged = purge_removed(pool).await?;
    Ok(round)
}

/// Rounds every `interval` until `shutdown` (the first at once).
pub async fn run(
    pool: PgPool,
    retention: Retention,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let progress = tidings_runtime::liveness::Progress::register("retention");
    loop {
        progress.idle_for(interval);
        let today = Utc::now().date_naive();
        match run_once(&pool, retention, today).await {
            Ok(round) if round.ran => {
                tidings_runtime::metrics::metrics()
                    .expired_partitions_kept
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
                tidings_runtime::metrics::metrics().failed("retention");
                tracing::error!(error = %e, "retention round failed; the next one tries again");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
