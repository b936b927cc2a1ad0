//! The Tidings detector: scans watches, evaluates triggers with the shared `evaluate`, and only
//! enqueues — the dispatcher decides, right before sending, whether a notification is still true.
//!
//! - [`scan`]: one scan of this shard's watches; the loop of scans is here, in [`run`].
//! - [`watchlist`]: the shard's watches and baselines in memory, refreshed by what changed.
//! - [`evaluate`]: what one watch's triggers say about one observation (pure).
//! - [`memory`]: what was enqueued today, so a condition that keeps holding is published once.
//! - [`hold`]: scans wait while dispatch is behind and the enqueue stream is deep.
//! - [`hints`]: change hints make it fetch the items they name now, not at the next scan.
//! - [`config`]: configuration, sharding.
//!
//! Scaling out: N replicas split the watches by a hash of the watch id (`TIDINGS_SHARD_COUNT`,
//! `TIDINGS_SHARD_INDEX` or the StatefulSet pod ordinal); each watch belongs to exactly one shard.

mod config;
mod evaluate;
pub mod hints;
pub mod hold;
mod memory;
pub mod metrics;
pub mod scan;
mod watchlist;

pub use config::{Config, Settings};

use std::time::Duration;
use tidings_runtime::liveness::Progress;
use tidings_runtime::startup;
use tidings_source::{SourceConfigError, Sources};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] config::ConfigError),
    #[error("source: {0}")]
    Source(#[from] SourceConfigError),
    #[error("DATABASE_URL: {0}")]
    DatabaseUrl(#[source] sqlx::Error),
    #[error(transparent)]
    Nats(#[from] tidings_bus::connection::ConnectionError),
    #[error(transparent)]
    Scan(#[from] scan::ScanError),
}

/// Runs the detector as its binary does: serves the ops endpoint at once (not with `--once`),
/// waits for Postgres and NATS (unready, saying why, until they answer), then scans every
/// interval until `shutdown` — or once, with `--once`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), StartError> {
    let settings = config.settings()?;
    let source = Sources::new(settings.source.clone())?;
    let url = config.database.url().map_err(config::ConfigError::from)?;
    let pool = tidings_store::postgres(&url, config.db_pool).map_err(StartError::DatabaseUrl)?;
    let (nats, bus) = config
        .nats
        .connect(&settings.subjects, tidings_bus::streams::Streams::Await)
        .await?;
    let dependencies = vec![tidings_store::dependency(pool.clone()), bus];
    config.ops.set_stall_bound();
    // `--once` is a command, not a service: no ops endpoint.
    let ops = (!config.once).then_some(config.ops.ops_listen);
    if startup::start(ops, dependencies, &shutdown).await.is_none() {
        return Ok(());
    }
    let interval = settings.scan_interval;
    metrics::init(&settings);
    let js = async_nats::jetstream::new(nats.clone());
    // A dry run publishes nothing, so it has no backlog to wait for.
    let limit = if settings.dry_run {
        0
    } else {
        settings.hold_backlog
    };
    let hold = hold::Hold::new(js.clone(), &settings.subjects, limit)
        .counting_each_message_as(settings.publish_batch);
    let (subjects, sources) = (settings.subjects.clone(), settings.source.clone());
    let detector = scan::Detector::new(pool, js, source, settings);
    if config.once {
        let stats = detector.scan_once(chrono::Utc::now()).await?;
        tracing::info!(?stats, "scan finished");
        return Ok(());
    }
    let hints = hints::listen(&detector, nats, &subjects, &sources, shutdown.clone());
    tokio::join!(detector.run(interval, hold, shutdown), hints);
    tracing::info!("detector stopped");
    Ok(())
}

impl scan::Detector {
    /// Scans every `scan_interval` until `shutdown`; a scan in progress finishes first. While
    /// `hold` says dispatch is behind, scans wait, looking again every [`hold::RECHECK`].
    pub async fn run(&self, interval: Duration, mut hold: hold::Hold, shutdown: CancellationToken) {
        let progress = Progress::register("scan");
        loop {
            let budget = match hold.check().await {
                hold::Gate::Scan { budget } => budget,
                hold::Gate::Wait => {
                    progress.idle_for(hold::RECHECK.min(interval));
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(hold::RECHECK.min(interval)) => continue,
                    }
                }
            };
            let started = tokio::time::Instant::now();
            // A scan spreads its pages over part of the interval: waiting for the next is planned.
            progress.idle_for(self.spread());
            match self
                .scan_within(chrono::Utc::now(), budget, self.spread(), &shutdown)
                .await
            {
                Ok(stats) => {
                    let took = started.elapsed().saturating_sub(stats.waited);
                    metrics::observe_scan(&stats, took, self.is_dry_run());
                    tracing::info!(
                        watches = stats.watches,
                        rows_read = stats.rows_read,
                        items = stats.items,
                        evaluated = stats.evaluated,
                        source_errors = stats.source_errors,
                        holding = stats.holding,
                        published = stats.published,
                        remembered = stats.remembered,
                        duplicates = stats.duplicates,
                        publish_errors = stats.publish_errors,
                        deferred = stats.deferred,
                        took_ms = took.as_millis() as u64,
                        waited_ms = stats.waited.as_millis() as u64,
                        "scan finished"
                    )
                }
                Err(e) => {
                    tidings_runtime::metrics::metrics()
                        .failed(tidings_runtime::metrics::Failure::Scan);
                    tracing::error!(error = %e, "scan failed");
                }
            }
            progress.idle_for(
                (started + interval).saturating_duration_since(tokio::time::Instant::now()),
            );
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(started + interval) => {}
            }
        }
    }
}
