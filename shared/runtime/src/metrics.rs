//! Prometheus metrics, one registry per process, served at `/metrics` by [`crate::ops`].
//!
//! Each crate declares the families it feeds with [`families!`] in its own `metrics` module
//! (this crate: health, the process, the pool, consumer lag) and registers them on first use.
//! [`FAMILIES`] lists every family with the services that export it; a service registers only
//! those ([`exports`]), so a panel never shows a service at a 0 it never moves. The dashboards
//! and alerts are checked against the list, and a test that the crates register exactly it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::registry::{Metric, Registry};

// What a crate's [`families!`] are made of, so that no other crate depends on the client.
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex};

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// The state a row moved to.
    pub to: String,
    /// Drop/failure reason, retry cause, or "" for sending/sent.
    pub reason: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// A sealing key's id (or what else kept a webhook secret shut), for
/// `tidings_webhook_secrets_unopened_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub key: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceRequestLabels {
    /// The source's name.
    pub source: String,
    /// fetched, not_modified or failed.
    pub result: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushLabels {
    /// web_push or webhook.
    pub channel: String,
    pub outcome: String,
    /// 2xx, 4xx, 5xx, or "none" when no HTTP answer came (timeout, refused, expired).
    pub status_class: String,
    /// The push service's host; `webhook` for every webhook (their hosts are as many as
    /// endpoints, too many for a label).
    pub host: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChannelStatusLabels {
    /// web_push or webhook.
    pub channel: String,
    /// 2xx, 4xx or 5xx.
    pub status: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabels {
    pub consumer: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub route: String,
    pub method: String,
    pub status: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

/// The services, by the names their metrics' owners are given in.
pub const SERVICES: &[&str] = &["api", "dispatcher", "pusher", "detector"];

/// Every metric family Tidings registers, with its type and the services that export it (only
/// those that feed it, so a dashboard never plots a service at a 0 it never moves). Dashboards
/// and alerts may use exactly the sample names [`sample_names`] derives from this (a test
/// checks it matches the registry).
pub const FAMILIES: &[(&str, &str, &[&str])] = &[
    (
        "tidings_outbox_transitions",
        "counter",
        &["dispatcher", "api"],
    ),
    ("tidings_outbox_rows", "gauge", &["dispatcher"]),
    ("tidings_outbox_held", "gauge", &["dispatcher"]),
    ("tidings_notifications_held", "counter", &["dispatcher"]),
    ("tidings_notifications_released", "counter", &["dispatcher"]),
    ("tidings_digest_members", "histogram", &["dispatcher"]),
    (
        "tidings_outbox_oldest_due_seconds",
        "gauge",
        &["dispatcher"],
    ),
    (
        "tidings_outbox_lease_overdue_seconds",
        "gauge",
        &["dispatcher"],
    ),
    ("tidings_ingested", "counter", &["dispatcher"]),
    ("tidings_webhook_endpoints", "gauge", &["dispatcher"]),
    ("tidings_webhook_failing_seconds", "gauge", &["dispatcher"]),
    (
        "tidings_webhook_breaker_open_seconds",
        "gauge",
        &["dispatcher"],
    ),
    (
        "tidings_webhook_secrets_unopened",
        "counter",
        &["dispatcher"],
    ),
    ("tidings_ingest_admitted", "gauge", &["dispatcher"]),
    (
        "tidings_dead_lettered",
        "counter",
        &["dispatcher", "pusher"],
    ),
    (
        "tidings_source_errors",
        "counter",
        &["dispatcher", "detector", "api"],
    ),
    (
        "tidings_source_requests",
        "counter",
        &["dispatcher", "detector", "api"],
    ),
    (
        "tidings_source_pages_too_complex",
        "counter",
        &["dispatcher", "detector", "api"],
    ),
    ("tidings_push_requests", "counter", &["pusher"]),
    ("tidings_push_duration_seconds", "histogram", &["pusher"]),
    (
        "tidings_detection_to_delivery_seconds",
        "histogram",
        &["dispatcher"],
    ),
    (
        "tidings_consumer_pending_messages",
        "gauge",
        &["dispatcher", "pusher"],
    ),
    (
        "tidings_consumer_ack_pending_messages",
        "gauge",
        &["dispatcher", "pusher"],
    ),
    ("tidings_detector_scans", "counter", &["detector"]),
    ("tidings_detector_held", "gauge", &["detector"]),
    ("tidings_detector_shard_count", "gauge", &["detector"]),
    (
        "tidings_detector_scan_duration_seconds",
        "histogram",
        &["detector"],
    ),
    ("tidings_detections", "counter", &["detector"]),
    ("tidings_detector_watches", "gauge", &["detector"]),
    (
        "tidings_detector_evaluated_watches",
        "counter",
        &["detector"],
    ),
    ("tidings_detector_hinted_items", "counter", &["detector"]),
    (
        "tidings_detector_last_scan_timestamp_seconds",
        "gauge",
        &["detector"],
    ),
    (
        "tidings_detector_scan_interval_seconds",
        "gauge",
        &["detector"],
    ),
    ("tidings_http_requests", "counter", &["api"]),
    (
        "tidings_http_request_duration_seconds",
        "histogram",
        &["api"],
    ),
    ("tidings_api_create_batch_size", "histogram", &["api"]),
    (
        "tidings_delivery_log_errors",
        "counter",
        &["dispatcher", "pusher"],
    ),
    ("tidings_api_rate_limited", "counter", &["api"]),
    ("tidings_api_hints", "counter", &["api"]),
    ("tidings_ready", "gauge", SERVICES),
    ("tidings_build_info", "gauge", SERVICES),
    ("tidings_dlq_messages", "gauge", &["dispatcher"]),
    (
        "tidings_outbox_expired_partitions_kept",
        "gauge",
        &["dispatcher"],
    ),
    (
        "tidings_failures",
        "counter",
        &["dispatcher", "pusher", "detector"],
    ),
    (
        "tidings_db_pool_connections",
        "gauge",
        &["api", "dispatcher", "detector"],
    ),
    (
        "tidings_db_pool_max_connections",
        "gauge",
        &["api", "dispatcher", "detector"],
    ),
    (
        "tidings_db_pool_acquire_seconds",
        "histogram",
        &["api", "dispatcher", "detector"],
    ),
    ("process_cpu_seconds", "counter", SERVICES),
    ("process_resident_memory_bytes", "gauge", SERVICES),
    ("process_open_fds", "gauge", SERVICES),
];

/// Whether `service` (a binary's name, e.g. `tidings-pusher`) exports `family`. A process that
/// is none of the services (a test, a tool) exports every family.
pub fn exports(service: &str, family: &str) -> bool {
    let name = service.strip_prefix("tidings-").unwrap_or(service);
    if !SERVICES.contains(&name) {
        return true;
    }
    FAMILIES
        .iter()
        .any(|(f, _, owners)| *f == family && owners.contains(&name))
}

/// Declares a crate's metric families: a struct of them, and `metrics()`, which creates each on
/// first use and registers it ([`register`]) under its family name and help, so a crate's
/// families are registered once, by the crate that feeds them.
#[macro_export]
macro_rules! families {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident: $ty:ty = $init:expr => $family:literal, $help:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        /// This process's families, created and registered on first use.
        $vis fn metrics() -> &'static $name {
            static METRICS: ::std::sync::LazyLock<$name> = ::std::sync::LazyLock::new(|| {
                let m = $name { $( $field: $init, )* };
                $( $crate::metrics::register($family, $help, m.$field.clone()); )*
                m
            });
            &METRICS
        }
    };
}

/// The process's registry. Each crate registers the families it feeds when its metrics are
/// first used (a service touches them all at start), so no crate holds another's families.
static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// Registers `metric` as family `name`. The exposition shows it if this process's service
/// exports it ([`exports`]), or once a code path fed it ([`exported_or_fed`]).
pub fn register(name: &str, help: &str, metric: impl Metric) {
    if let Ok(mut registry) = REGISTRY.lock() {
        registry.register(name, help, metric);
    }
}

/// The exposition `text` of `service` with only the families it exports, and any other that a
/// code path fed (a sample not 0): a family a service feeds but FAMILIES does not list for it is
/// shown, never silently left out, and the test over every service's exposition names it
/// (tests/tests/end_to_end.rs). A crate's families are registered together, so a service
/// registers some it never feeds (the api has the consumer gauges); those stay out.
pub fn exported_or_fed(text: &str, service: &str) -> String {
    fn flush(out: &mut String, block: &mut Vec<&str>, family: &str, service: &str) {
        let fed = || {
            (block.iter())
                .filter(|l| !l.starts_with('#'))
                .any(|l| sample_value(l).is_some_and(|v| v != 0.0))
        };
        if exports(service, family) || fed() {
            for l in block.iter() {
                out.push_str(l);
                out.push('\n');
            }
        }
        block.clear();
    }
    let mut out = String::with_capacity(text.len());
    let mut block: Vec<&str> = Vec::new();
    let mut family = "";
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(&mut out, &mut block, family, service);
            family = rest.split(' ').next().unwrap_or_default();
        } else if line == "# EOF" {
            flush(&mut out, &mut block, family, service);
            family = "";
            out.push_str(line);
            out.push('\n');
            continue;
        }
        block.push(line);
    }
    flush(&mut out, &mut block, family, service);
    out
}

/// A sample line's value: the first field after its name and labels.
fn sample_value(line: &str) -> Option<f64> {
    let after_labels = match line.find('{') {
        Some(_) => &line[line.find('}')? + 1..],
        None => line.split_once(' ')?.1,
    };
    after_labels.split_whitespace().next()?.parse().ok()
}

/// The names samples appear under in the exposition (`_total` for counters; `_bucket`, `_sum`,
/// `_count` for histograms).
pub fn sample_names() -> Vec<String> {
    FAMILIES
        .iter()
        .flat_map(|(name, kind, _)| match *kind {
            "counter" => vec![format!("{name}_total")],
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{name}{s}"))
                .collect(),
            _ => vec![(*name).to_owned()],
        })
        .collect()
}

/// A latency histogram whose buckets each keep the trace id of their last observation, so a
/// Grafana latency panel links a slow bucket to a trace that landed in it (OpenMetrics
/// exemplars).
pub type Traced = HistogramWithExemplars<TraceLabels>;

pub type TracedHist<L> = Family<L, Traced, fn() -> Traced>;

/// An exemplar's labels: the trace the observation belongs to.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabels {
    pub trace_id: String,
}

/// The exemplar for an observation in the trace `trace_id` (none without a trace).
pub fn exemplar(trace_id: Option<String>) -> Option<TraceLabels> {
    trace_id.map(|trace_id| TraceLabels { trace_id })
}

pub fn latency() -> Histogram {
    // 5 ms … ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

pub fn fast_latency() -> Traced {
    // 0.5 ms … ~4 s.
    Traced::new(exponential_buckets(0.0005, 2.0, 14))
}

families! {
    /// The families every service feeds through this crate: readiness, build, failures, consumer
    /// lag and the dead-letter depth (read by [`crate::ops`]), the Postgres pool and the process.
    pub struct Metrics {
        consumer_pending: Family<ConsumerLabels, Gauge> = Family::default()
            => "tidings_consumer_pending_messages",
            "JetStream messages not yet delivered to the consumer (lag)";
        consumer_ack_pending: Family<ConsumerLabels, Gauge> = Family::default()
            => "tidings_consumer_ack_pending_messages",
            "JetStream messages delivered and not yet acknowledged";
        /// 1 while the service is ready (what `/readyz` answers), else 0.
        ready: Gauge = Gauge::default()
            => "tidings_ready",
            "1 while the service is ready (what /readyz answers), else 0; evaluated on every \
             scrape";
        /// 1, labelled with the build's version.
        build_info: Family<VersionLabels, Gauge> = build_info()
            => "tidings_build_info", "1, labelled with the version of the running build";
        /// Messages in the dead-letter stream.
        dlq_messages: Gauge = Gauge::default()
            => "tidings_dlq_messages",
            "Messages in the dead-letter stream (kept 14 days), for an operator to read";
        /// Operations that failed and will be tried again, by `operation`.
        failures: Family<OperationLabels, Counter> = Family::default()
            => "tidings_failures",
            "Operations that failed and are tried again (a scan, a dispatch batch, a consumer's \
             batch, the sweep, a publish), by operation: while one keeps moving, work waits";
        /// The Postgres pool's open connections by `state` (`in_use`, `idle`), and its maximum.
        db_pool_connections: Family<StateLabels, Gauge> = Family::default()
            => "tidings_db_pool_connections",
            "Postgres connections the service's pool holds, by state (in_use, idle)";
        db_pool_max: Gauge = Gauge::default()
            => "tidings_db_pool_max_connections",
            "The most Postgres connections the service's pool opens";
        /// How long each connection took to get from the pool: above a millisecond, a query
        /// waited for a connection (the pool was full) or for a new one to be opened.
        // 0.1 ms … ~26 s (the pool gives up after 30 s).
        db_pool_acquire: Histogram = Histogram::new(exponential_buckets(0.0001, 4.0, 10))
            => "tidings_db_pool_acquire_seconds",
            "Time to get a connection from the Postgres pool (waits: the pool was full or \
             opening one)";
        process_cpu_seconds: Counter<f64, AtomicU64> = Counter::default()
            => "process_cpu_seconds", "CPU time the process has used (user and system)";
        process_rss_bytes: Gauge = Gauge::default()
            => "process_resident_memory_bytes", "Resident memory of the process";
        process_open_fds: Gauge = Gauge::default()
            => "process_open_fds", "File descriptors the process holds open";
    }
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: String,
}

/// Why a notification waited for its reader (`quiet_hours`, `cap`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldLabels {
    pub held: String,
}

/// A held notification at its release: why it was held, and what became of it.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReleaseLabels {
    pub held: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

/// An operation that fails and is tried again, as `tidings_failures_total` counts it. An enum,
/// so a misspelt operation cannot make a series of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure<'a> {
    /// A detector's scan.
    Scan,
    /// A dispatcher's claim-and-dispatch cycle.
    Dispatch,
    /// Publishing PushRequests.
    PublishPush,
    /// The lease sweeper.
    Sweep,
    /// The retention round.
    Retention,
    /// The pusher publishing results.
    PublishResult,
    /// A consumer's batch, by the consumer's durable name.
    Consumer(&'a str),
}

impl Failure<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            Failure::Scan => "scan",
            Failure::Dispatch => "dispatch",
            Failure::PublishPush => "publish_push",
            Failure::Sweep => "sweep",
            Failure::Retention => "retention",
            Failure::PublishResult => "publish_result",
            Failure::Consumer(name) => name,
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition of every metric, after reading what is read at scrape
    /// time (the process, and whatever [`on_scrape`] registered).
    pub fn encode(&self) -> String {
        self.read_process();
        if let Ok(hooks) = SCRAPE_HOOKS.lock() {
            for hook in hooks.iter() {
                hook();
            }
        }
        let mut out = String::new();
        match REGISTRY.lock() {
            Ok(registry) => {
                if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
                    tracing::error!(error = %e, "encoding metrics failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "the metrics registry is poisoned"),
        }
        exported_or_fed(&out, crate::telemetry::service_name())
    }

    /// CPU, resident memory and open files from `/proc/self` (Linux; elsewhere they stay 0).
    fn read_process(&self) {
        // Clock ticks and pages: 100 Hz and 4 KiB on the Linux targets the image runs on.
        const TICKS_PER_SECOND: f64 = 100.0;
        const PAGE_BYTES: i64 = 4096;
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            // utime and stime are the 14th and 15th fields; the 3rd is the first after ')'.
            let ticks: f64 = [11, 12]
                .iter()
                .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
                .sum();
            let seconds = ticks / TICKS_PER_SECOND;
            let counted = self.process_cpu_seconds.get();
            if seconds > counted {
                self.process_cpu_seconds.inc_by(seconds - counted);
            }
        }
        if let Some(pages) = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<i64>().ok())
        {
            self.process_rss_bytes.set(pages * PAGE_BYTES);
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.process_open_fds
                // Gauges saturate at `i64::MAX`, which no count of descriptors reaches.
                .set(i64::try_from(fds.count()).unwrap_or(i64::MAX));
        }
    }

    /// Counts a failed `operation` (see `tidings_failures_total`).
    pub fn failed(&self, operation: Failure<'_>) {
        self.failures
            .get_or_create(&OperationLabels {
                operation: operation.as_str().to_owned(),
            })
            .inc();
    }

    /// Creates the `tidings_failures_total` series of `operations` at 0.
    pub fn may_fail(&self, operations: &[Failure<'_>]) {
        at_zero(
            &self.failures,
            operations.iter().map(|o| OperationLabels {
                operation: o.as_str().to_owned(),
            }),
        );
    }
}

/// Creates each series of `family` at 0, so that `increase()` sees the first event after a
/// start (a series that appears with its first event has no earlier sample to rise from).
pub fn at_zero<L>(family: &Family<L, Counter>, labels: impl IntoIterator<Item = L>)
where
    L: Clone + std::hash::Hash + Eq,
{
    for l in labels {
        let _ = family.get_or_create(&l);
    }
}

/// [`KindLabels`] of each kind.
pub fn kinds<'a>(kinds: impl IntoIterator<Item = &'a str>) -> impl Iterator<Item = KindLabels> {
    kinds.into_iter().map(|k| KindLabels { kind: k.to_owned() })
}

type ScrapeHook = Box<dyn Fn() + Send + Sync>;
static SCRAPE_HOOKS: std::sync::Mutex<Vec<ScrapeHook>> = std::sync::Mutex::new(Vec::new());

/// Runs `hook` before every encoding of the metrics, to set gauges read at scrape time (e.g. a
/// connection pool's state).
pub fn on_scrape(hook: impl Fn() + Send + Sync + 'static) {
    if let Ok(mut hooks) = SCRAPE_HOOKS.lock() {
        hooks.push(Box::new(hook));
    }
}

/// `tidings_build_info`: one series, 1, labelled with this build's version.
fn build_info() -> Family<VersionLabels, Gauge> {
    let family = Family::<VersionLabels, Gauge>::default();
    family
        .get_or_create(&VersionLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
        })
        .set(1);
    family
}

/// "2xx", "4xx", "5xx"; "none" without an HTTP answer.
pub fn status_class(status: Option<u16>) -> String {
    match status {
        Some(s) => format!("{}xx", s / 100),
        None => "none".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The api shows the families it lists, and one it does not list only once fed.
    #[test]
    fn a_service_shows_its_listed_families_and_any_other_it_fed() {
        let text = "# HELP tidings_ready 1 while ready.\n# TYPE tidings_ready gauge\ntidings_ready 1\n\
            # HELP tidings_consumer_pending_messages Lag.\n# TYPE tidings_consumer_pending_messages gauge\n\
            # HELP tidings_ingested Ingested.\n# TYPE tidings_ingested counter\n\
            tidings_ingested_total{result=\"new\"} 0\n\
            # HELP tidings_outbox_oldest_due_seconds Age.\n# TYPE tidings_outbox_oldest_due_seconds gauge\n\
            tidings_outbox_oldest_due_seconds 2.5\n# EOF\n";
        let shown = exported_or_fed(text, "tidings-api");
        let families: Vec<&str> = (shown.lines())
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .collect();
        assert_eq!(
            families,
            ["tidings_ready", "tidings_outbox_oldest_due_seconds"]
        );
        assert!(shown.ends_with("# EOF\n"), "{shown}");
        assert_eq!(exported_or_fed(text, "something-else"), text);
    }

    /// The `# TYPE` lines of an exposition: (family, type).
    pub(crate) fn families_in(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter_map(|line| {
                let mut parts = line.strip_prefix("# TYPE ")?.split(' ');
                Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
            })
            .collect()
    }

    #[test]
    fn this_crates_families_are_listed_in_families() {
        let m = metrics();
        // A family shows up in the exposition once it has a series.
        macro_rules! touch {
            ($($family:ident),*) => { $( let _ = m.$family.get_or_create(&Default::default()); )* };
        }
        touch!(
            consumer_pending,
            consumer_ack_pending,
            db_pool_connections,
            failures
        );
        let registered = families_in(&m.encode());
        assert_eq!(registered.len(), 12, "{registered:?}");
        for (name, kind) in &registered {
            assert!(
                FAMILIES.iter().any(|(n, k, _)| n == name && k == kind),
                "{name} ({kind}) is not listed in FAMILIES"
            );
        }
        assert!(sample_names().contains(&"tidings_outbox_transitions_total".to_owned()));
        assert!(sample_names().contains(&"tidings_push_duration_seconds_bucket".to_owned()));
    }

    #[test]
    fn each_service_exports_the_families_it_feeds() {
        assert!(exports("tidings-dispatcher", "tidings_outbox_rows"));
        assert!(!exports("tidings-api", "tidings_outbox_rows"));
        assert!(exports("tidings-api", "tidings_http_requests"));
        assert!(!exports("tidings-pusher", "tidings_http_requests"));
        assert!(exports("tidings-pusher", "tidings_dead_lettered"));
        for service in SERVICES {
            assert!(exports(&format!("tidings-{service}"), "tidings_ready"));
        }
        // Tests and tools see everything.
        assert!(exports("tidings", "tidings_outbox_rows"));
        for (family, _, owners) in FAMILIES {
            assert!(!owners.is_empty(), "{family} has no owner");
            assert!(
                owners.iter().all(|o| SERVICES.contains(o)),
                "{family}: {owners:?}"
            );
        }
    }

    #[test]
    fn counters_show_up_in_the_exposition() {
        let m = metrics();
        m.failed(Failure::Sweep);
        m.failed(Failure::Sweep);
        let text = m.encode();
        assert!(
            text.contains(r#"tidings_failures_total{operation="sweep"} 2"#),
            "{text}"
        );
        assert!(text.contains(&format!(
            "tidings_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
        // The process, read at scrape: some memory, some files, and CPU that only grows.
        assert!(
            m.process_rss_bytes.get() > 1 << 20,
            "{}",
            m.process_rss_bytes.get()
        );
        assert!(m.process_open_fds.get() > 2);
        let before = m.process_cpu_seconds.get();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(300) {
            std::hint::black_box(0u64.wrapping_add(1));
        }
        let _ = m.encode();
        assert!(m.process_cpu_seconds.get() > before, "{before}");
        assert!(text.ends_with("# EOF\n"));
    }
}
