//! Detector configuration: every setting a flag and an environment variable.

use std::time::Duration;
use tidings_bus::NatsArgs;
use tidings_bus::streams::StreamSettings;
use tidings_domain::duration::parse_duration;
use tidings_domain::subjects::{InvalidPrefix, Subjects};
use tidings_runtime::flags;
use tidings_runtime::ops::OpsArgs;
use tidings_source::SourceArgs;
use tidings_source::SourceConfig;

#[derive(clap::Parser, Clone, Debug)]
#[command(name = "tidings-detector", version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: tidings_runtime::secrets::DatabaseArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub ops: OpsArgs,
    /// Postgres connections of each replica (a scan reads a page and writes its findings; the
    /// readiness check takes one).
    #[arg(long, env = "TIDINGS_DETECTOR_DB_POOL", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub db_pool: u32,
    /// Time between the starts of two scans.
    #[arg(long, env = "TIDINGS_SCAN_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub scan_interval: Duration,
    /// Share of the interval, in percent, over which a scan's pages start evenly, so the
    /// source is asked at a steady rate and findings reach the pipeline as they come, not in
    /// one burst a scan (0: one page after another).
    #[arg(long, env = "TIDINGS_SCAN_SPREAD", default_value_t = 80,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    pub scan_spread: u8,
    /// Watches read per page.
    #[arg(long, env = "TIDINGS_SCAN_PAGE", default_value_t = 5000)]
    pub page_size: i64,
    /// This replica's shard, 0-based. With a StatefulSet, leave it unset and set
    /// TIDINGS_SHARD_FROM_HOSTNAME=true to take the pod ordinal (detector-2 → 2).
    #[arg(long, env = "TIDINGS_SHARD_INDEX", default_value_t = 0)]
    pub shard_index: u32,
    #[arg(long, env = "TIDINGS_SHARD_FROM_HOSTNAME", default_value_t = false)]
    pub shard_from_hostname: bool,
    /// How many shards (replicas) split the watches.
    #[arg(long, env = "TIDINGS_SHARD_COUNT", default_value_t = 1)]
    pub shard_count: u32,
    /// Dedup keys remembered per day before the memory starts over.
    #[arg(long, env = "TIDINGS_DETECTOR_MEMORY", default_value_t = 1_000_000)]
    pub memory_capacity: usize,
    /// A trigger that still holds this long after it was enqueued is published again, in case
    /// JetStream lost the message (the duplicate window and the outbox key absorb repeats).
    #[arg(long, env = "TIDINGS_REPUBLISH_AFTER", default_value = "10m", value_parser = parse_duration)]
    pub republish_after: Duration,
    /// Scans wait while more than this many notifications wait in the enqueue stream for the
    /// dispatcher's ingest (dispatch is behind), until half as many do (0: never wait).
    #[arg(long, env = "TIDINGS_DETECTOR_HOLD_BACKLOG", default_value_t = 20_000)]
    pub hold_backlog: u64,
    /// Detections are published in `EnqueueRequests` messages of up to this many, so
    /// JetStream's cost per message is paid once per batch (one alone goes as an EnqueueRequest
    /// under its dedup key); 1 (one message per request) is what dispatchers older than batches can read:
    /// set it while such dispatchers run (docs/operations.md, "Upgrading").
    /// TIDINGS_DETECTOR_HOLD_BACKLOG counts each waiting message as this many notifications.
    #[arg(long, env = "TIDINGS_DETECTOR_PUBLISH_BATCH", default_value_t = 50)]
    pub publish_batch: usize,
    /// Print what would be enqueued (JSON lines on stdout) without publishing or writing.
    #[arg(long, env = "TIDINGS_DRY_RUN", default_value_t = false)]
    pub dry_run: bool,
    /// Scan once and exit (with --dry-run: a report of what would be sent now).
    #[arg(long, default_value_t = false)]
    pub once: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Secret(#[from] tidings_runtime::secrets::SecretError),
    #[error(transparent)]
    Source(#[from] tidings_source::SourceConfigError),
    #[error("shard index {index} is not below shard count {count}")]
    Shard { index: u32, count: u32 },
    #[error("TIDINGS_SHARD_FROM_HOSTNAME: hostname {0:?} does not end in -<ordinal>")]
    Hostname(String),
    #[error("TIDINGS_SCAN_PAGE must be at least 1")]
    Page,
    #[error(
        "TIDINGS_DETECTOR_PUBLISH_BATCH ({0}) must be 1 to {max}: an enqueue-stream message \
         carries at most that many requests",
        max = tidings_domain::messages::MAX_ENQUEUES_PER_MESSAGE
    )]
    PublishBatch(usize),
    #[error(
        "TIDINGS_REPUBLISH_AFTER ({republish:?}) must be shorter than TIDINGS_DUPLICATE_WINDOW \
         ({window:?}): otherwise every re-publish of a trigger that keeps holding is stored and \
         ingested again instead of being answered `duplicate`"
    )]
    RepublishOutsideWindow {
        republish: Duration,
        window: Duration,
    },
    #[error(transparent)]
    Prefix(#[from] InvalidPrefix),
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub subjects: Subjects,
    pub streams: StreamSettings,
    pub source: SourceConfig,
    pub scan_interval: Duration,
    /// Percent of the interval a scan's pages are spread over ([`Settings::spread`]).
    pub scan_spread: u8,
    pub page_size: i64,
    pub shard_index: u32,
    pub shard_count: u32,
    pub memory_capacity: usize,
    pub republish_after: Duration,
    pub hold_backlog: u64,
    pub publish_batch: usize,
    pub dry_run: bool,
}

impl Settings {
    /// Every setting at its flag's default but where things are: for tests and benchmarks.
    pub fn new(subjects: Subjects, source: SourceConfig) -> Self {
        let placeholders = ["--database-url", "-", "--source-url", "-"];
        flags::parsed_defaults::<Config>(&placeholders).settings_with(subjects, source)
    }

    /// The part of the interval a scan's pages are spread over.
    pub fn spread(&self) -> Duration {
        self.scan_interval * u32::from(self.scan_spread) / 100
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shard_count == 0 || self.shard_index >= self.shard_count {
            return Err(ConfigError::Shard {
                index: self.shard_index,
                count: self.shard_count,
            });
        }
        if self.page_size < 1 {
            return Err(ConfigError::Page);
        }
        if !(1..=tidings_domain::messages::MAX_ENQUEUES_PER_MESSAGE).contains(&self.publish_batch) {
            return Err(ConfigError::PublishBatch(self.publish_batch));
        }
        if self.republish_after >= self.streams.duplicate_window {
            return Err(ConfigError::RepublishOutsideWindow {
                republish: self.republish_after,
                window: self.streams.duplicate_window,
            });
        }
        Ok(())
    }
}

/// The ordinal at the end of a StatefulSet pod's hostname.
pub fn ordinal(hostname: &str) -> Option<u32> {
    hostname.rsplit_once('-')?.1.parse().ok()
}

impl Config {
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let mut s = self.settings_with(self.nats.subjects()?, self.source.config()?);
        if self.shard_from_hostname {
            let host = std::env::var("HOSTNAME").unwrap_or_default();
            s.shard_index = ordinal(&host).ok_or(ConfigError::Hostname(host))?;
        }
        s.validate()?;
        Ok(s)
    }

    fn settings_with(&self, subjects: Subjects, source: SourceConfig) -> Settings {
        Settings {
            subjects,
            streams: self.nats.streams(),
            source,
            scan_interval: self.scan_interval,
            scan_spread: self.scan_spread,
            page_size: self.page_size,
            shard_index: self.shard_index,
            shard_count: self.shard_count,
            memory_capacity: self.memory_capacity,
            republish_after: self.republish_after,
            hold_backlog: self.hold_backlog,
            publish_batch: self.publish_batch,
            dry_run: self.dry_run,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ordinals() {
        assert_eq!(ordinal("tidings-detector-2"), Some(2));
        assert_eq!(ordinal("detector"), None);
    }

    #[test]
    fn a_shard_outside_the_count_is_refused() {
        let mut s = Settings::new(
            Subjects::new("t").unwrap(),
            SourceConfig::new("http://x/{item}"),
        );
        s.shard_count = 2;
        s.shard_index = 2;
        assert!(s.validate().is_err());
        s.shard_index = 1;
        s.validate().unwrap();
    }

    #[test]
    fn a_publish_batch_outside_what_a_message_carries_is_refused() {
        let mut s = Settings::new(
            Subjects::new("t").unwrap(),
            SourceConfig::new("http://x/{item}"),
        );
        for ok in [1, 50, tidings_domain::messages::MAX_ENQUEUES_PER_MESSAGE] {
            s.publish_batch = ok;
            s.validate().unwrap();
        }
        for bad in [0, tidings_domain::messages::MAX_ENQUEUES_PER_MESSAGE + 1] {
            s.publish_batch = bad;
            let e = s.validate().unwrap_err();
            assert!(
                e.to_string().contains("TIDINGS_DETECTOR_PUBLISH_BATCH"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_republish_outside_the_duplicate_window_is_refused() {
        let mut s = Settings::new(
            Subjects::new("t").unwrap(),
            SourceConfig::new("http://x/{item}"),
        );
        s.validate().unwrap();
        s.republish_after = s.streams.duplicate_window;
        let e = s.validate().unwrap_err();
        assert!(e.to_string().contains("TIDINGS_DUPLICATE_WINDOW"), "{e}");
    }
}
