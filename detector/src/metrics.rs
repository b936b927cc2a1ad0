//! The detector's metric families, and what a scan and a start feed them.

use crate::Settings;
use crate::scan::ScanStats;
use std::time::Duration;
use tidings_runtime::metrics::{
    Counter, Failure, Family, Gauge, Histogram, ResultLabels, ShardLabels, latency,
};

tidings_runtime::families! {
    pub struct DetectorMetrics {
        scans: Counter = Counter::default()
            => "tidings_detector_scans", "Completed detector scans";
        /// 1 while the detector holds its scans back because the enqueue stream is deep.
        held: Gauge = Gauge::default()
            => "tidings_detector_held",
            "1 while the detector holds its scans back because more than \
             TIDINGS_DETECTOR_HOLD_BACKLOG notifications wait in the enqueue stream for ingest";
        /// How many shards split the watches, labelled with this detector's own `shard`: the
        /// alerts compare the shards that report with the count they should be.
        shard_count: Family<ShardLabels, Gauge> = Family::default()
            => "tidings_detector_shard_count",
            "How many shards split the watches (TIDINGS_SHARD_COUNT), labelled with this \
             detector's shard";
        /// Unix time the last scan finished (the start, before the first): with the interval,
        /// what tells a detector that is behind from one that scans hourly on purpose.
        last_scan: Gauge = Gauge::default()
            => "tidings_detector_last_scan_timestamp_seconds",
            "Unix time the detector's last scan finished (its start, before the first)";
        scan_interval: Gauge = Gauge::default()
            => "tidings_detector_scan_interval_seconds",
            "The detector's scan interval (TIDINGS_SCAN_INTERVAL)";
        scan_duration: Histogram = latency()
            => "tidings_detector_scan_duration_seconds",
            "Time a detector scan spends scanning (its waits between pages not counted)";
        detections: Family<ResultLabels, Counter> = Family::default()
            => "tidings_detections",
            "Detections by result (published, duplicate, remembered, publish_error)";
        watches: Gauge = Gauge::default()
            => "tidings_detector_watches",
            "Active watches this detector holds in memory (its shard)";
        evaluated_watches: Counter = Counter::default()
            => "tidings_detector_evaluated_watches",
            "Watches evaluated by scans (those whose item value, watch or baseline changed)";
        hinted_items: Family<ResultLabels, Counter> = Family::default()
            => "tidings_detector_hinted_items",
            "Items named by change hints, by result (fetched, unwatched here, dropped past the \
             queue, invalid hint)";
    }
}

/// At start: the shard count, and every series a scan moves at 0.
pub(crate) fn init(settings: &Settings) {
    metrics()
        .shard_count
        .get_or_create(&ShardLabels {
            shard: settings.shard_index.to_string(),
        })
        .set(i64::from(settings.shard_count));
    metrics()
        .scan_interval
        // Gauges saturate at `i64::MAX`, which no interval or count reaches.
        .set(i64::try_from(settings.scan_interval.as_secs()).unwrap_or(i64::MAX));
    metrics().last_scan.set(chrono::Utc::now().timestamp());
    tidings_runtime::metrics::metrics().may_fail(&[Failure::Scan]);
    tidings_runtime::metrics::at_zero(
        &metrics().detections,
        Detection::ALL.map(|result| ResultLabels {
            result: result.as_str().to_owned(),
        }),
    );
    tidings_runtime::metrics::at_zero(
        &metrics().hinted_items,
        Hinted::ALL.map(|result| ResultLabels {
            result: result.as_str().to_owned(),
        }),
    );
}

/// What became of an item a change hint named (`tidings_detector_hinted_items_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hinted {
    /// Fetched and its watches evaluated.
    Fetched,
    /// No watch of this shard watches it.
    Unwatched,
    /// Its source already had the most items waiting, or prefixed it is no item code.
    Dropped,
    /// The hint could not be read, or named a source this detector does not know.
    Invalid,
    /// Prefixed with its hint's source, another source's prefix claims it: a source's hints
    /// speak for its own items only.
    Foreign,
}

impl Hinted {
    pub const ALL: [Hinted; 5] = [
        Hinted::Fetched,
        Hinted::Unwatched,
        Hinted::Dropped,
        Hinted::Invalid,
        Hinted::Foreign,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Hinted::Fetched => "fetched",
            Hinted::Unwatched => "unwatched",
            Hinted::Dropped => "dropped",
            Hinted::Invalid => "invalid",
            Hinted::Foreign => "foreign",
        }
    }
}

/// Counts `n` hinted items that ended as `result`.
pub(crate) fn hinted(result: Hinted, n: usize) {
    metrics()
        .hinted_items
        .get_or_create(&ResultLabels {
            result: result.as_str().to_owned(),
        })
        .inc_by(n as u64);
}

/// A hint-driven fetch round in the metrics: what it evaluated and detected (no scan counted).
pub(crate) fn observe_hinted(stats: &ScanStats, dry_run: bool) {
    let m = metrics();
    m.evaluated_watches.inc_by(stats.evaluated as u64);
    if !dry_run {
        count_detections(stats);
    }
}

fn count_detections(stats: &ScanStats) {
    for result in Detection::ALL {
        metrics()
            .detections
            .get_or_create(&ResultLabels {
                result: result.as_str().to_owned(),
            })
            .inc_by(result.count(stats) as u64);
    }
}

/// A finished scan in the metrics. A dry run publishes nothing, so its detections are not counted.
pub(crate) fn observe_scan(stats: &ScanStats, took: Duration, dry_run: bool) {
    let m = metrics();
    m.scans.inc();
    m.last_scan.set(chrono::Utc::now().timestamp());
    m.scan_duration.observe(took.as_secs_f64());
    m.watches
        // Gauges saturate at `i64::MAX`, which no interval or count reaches.
        .set(i64::try_from(stats.watches).unwrap_or(i64::MAX));
    m.evaluated_watches.inc_by(stats.evaluated as u64);
    if !dry_run {
        count_detections(stats);
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
    pub fn count(self, stats: &ScanStats) -> usize {
        match self {
            Detection::Published => stats.published,
            Detection::Duplicate => stats.duplicates,
            Detection::PublishError => stats.publish_errors,
            Detection::Remembered => stats.remembered,
            Detection::Deferred => stats.deferred,
        }
    }
}
