//! The Tidings detector: scans watches, evaluates triggers with the shared `evaluate`, and only
//! enqueues — the dispatcher decides, right before sending, whether a notification is still true.
//!
//! - [`scan`]: one scan of this shard's watches, and the loop.
//! - [`watchlist`]: the shard's watches and baselines in memory, refreshed by what changed.
//! - [`evaluate`]: what one watch's triggers say about one observation (pure).
//! - [`memory`]: what was enqueued today, so a condition that keeps holding is published once.
//! - [`hold`]: scans wait while dispatch is behind and the enqueue stream is deep.
//! - [`config`]: configuration, sharding.
//!
//! Scaling out: N replicas split the watches by a hash of the watch id (`TIDINGS_SHARD_COUNT`,
//! `TIDINGS_SHARD_INDEX` or the StatefulSet pod ordinal); each watch belongs to exactly one shard.

mod config;
mod evaluate;
pub mod hold;
mod memory;
pub mod scan;
mod watchlist;

pub use config::{Config, Settings};

use std::time::Duration;
use tidings_runtime::liveness::Progress;
use tidings_runtime::startup;
use tidings_source::{HttpSource, SourceConfigError};
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
    let source = HttpSource::new(settings.source.clone())?;
    let url = config.database.url().map_err(config::ConfigError::from)?;
    let pool = tidings_store::postgres(&url, config.db_pool).map_err(StartError::DatabaseUrl)?;
    let (nats, bus) = config
        .nats
        .connect(&settings.subjects, tidings_bus::streams::Streams::Await)
        .await?;
    let dependencies = vec![tidings_store::dependency(pool.clone()), bus];
    config.ops.apply();
    // `--once` is a command, not a service: no ops endpoint.
    let ops = (!config.once).then_some(config.ops.ops_listen);
    if startup::start(ops, dependencies, &shutdown).await.is_none() {
        return Ok(());
    }
    let interval = settings.scan_interval;
    tidings_runtime::metrics::metrics()
        .detector_shard_count
        .get_or_create(&tidings_runtime::metrics::ShardLabels {
            shard: settings.shard_index.to_string(),
        })
        .set(i64::from(settings.shard_count));
    tidings_runtime::metrics::metrics().may_fail(&[tidings_runtime::metrics::Failure::Scan]);
    tidings_runtime::metrics::at_zero(
        &tidings_runtime::metrics::metrics().detections,
        Detection::ALL.map(|result| tidings_runtime::metrics::ResultLabels {
            result: result.as_str().to_owned(),
        }),
    );
    let js = async_nats::jetstream::new(nats);
    // A dry run publishes nothing, so it has no backlog to wait for.
    let limit = if settings.dry_run {
        0
    } else {
        settings.hold_backlog
    };
    let hold = hold::Hold::new(js.clone(), &settings.subjects, limit)
        .counting_each_message_as(settings.publish_batch);
    let detector = scan::Detector::new(pool, js, source, settings);
    if config.once {
        let stats = detector.scan_once(chrono::Utc::now()).await?;
        tracing::info!(?stats, "scan finished");
        return Ok(());
    }
    detector.run(interval, hold, shutdown).await;
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
            match self.scan_within(chrono::Utc::now(), budget).await {
                Ok(stats) => {
                    record(&stats, started.elapsed(), self.is_dry_run());
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
                        took_ms = started.elapsed().as_millis() as u64,
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

/// A finished scan in the metrics. A dry run publishes nothing, so its detections are not counted.
fn record(stats: &scan::ScanStats, took: Duration, dry_run: bool) {
    let m = tidings_runtime::metrics::metrics();
    m.scans.inc();
    m.scan_duration.observe(took.as_secs_f64());
    m.detector_watches
        .set(i64::try_from(stats.watches).unwrap_or(i64::MAX));
    m.evaluated_watches.inc_by(stats.evaluated as u64);
    if dry_run {
        return;
    }
    for result in Detection::ALL {
        m.detections
            .get_or_create(&tidings_runtime::metrics::ResultLabels {
                result: result.as_str().to_owned(),
            })
            .inc_by(result.count(stats) as u64);
    }
}

/// What became of a trigger that held, as `tidings_detections_total{result}` counts it. An
/// enum, so every result's series exists from the start and a misspelt one cannot make its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detection {
    /// JetStream stored it.
    Published,
    /// JetStream's duplicate window already had its key.
    Duplicate,
    /// Publishing failed; the next scan tries again.
    PublishError,
    /// This detector had enqueued it today already.
    Remembered,
    /// Past the scan's budget; left for a later scan.
    Deferred,
}

impl Detection {
    pub const ALL: [Detection; 5] = [
        Detection::Published,
        Detection::Duplicate,
        Detection::PublishError,
        Detection::Remembered,
        Detection::Deferred,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Detection::Published => "published",
            Detection::Duplicate => "duplicate",
            Detection::PublishError => "publish_error",
            Detection::Remembered => "remembered",
            Detection::Deferred => "deferred",
        }
    }

    /// How many of a scan's triggers ended so.
    pub fn count(self, stats: &scan::ScanStats) -> usize {
        match self {
            Detection::Published => stats.published,
            Detection::Duplicate => stats.duplicates,
            Detection::PublishError => stats.publish_errors,
            Detection::Remembered => stats.remembered,
            Detection::Deferred => stats.deferred,
        }
    }
}
