//! Prometheus metrics, one registry per process, served at `/metrics` by [`crate::ops`].
//!
//! [`FAMILIES`] lists every family with the services that feed it; each service registers only
//! those ([`exports`]), so a panel never shows a service at a 0 it never moves. The dashboards
//! and alerts are checked against the list.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

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

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushLabels {
    pub outcome: String,
    /// 2xx, 4xx, 5xx, or "none" when no HTTP answer came (timeout, refused, expired).
    pub status_class: String,
    pub host: String,
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
    ("tidings_outbox_transitions", "counter", &["dispatcher"]),
    ("tidings_outbox_rows", "gauge", &["dispatcher"]),
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
    ("tidings_ingest_admitted", "gauge", &["dispatcher"]),
    (
        "tidings_dead_lettered",
        "counter",
        &["dispatcher", "pusher"],
    ),
    (
        "tidings_source_errors",
        "counter",
        &["dispatcher", "detector"],
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

/// Registers `metric` if this process's service exports `name` ([`exports`]).
fn register(registry: &mut Registry, name: &str, help: &str, metric: impl Metric) {
    if exports(crate::telemetry::service_name(), name) {
        registry.register(name, help, metric);
    }
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

type TracedHist<L> = Family<L, Traced, fn() -> Traced>;

/// An exemplar's labels: the trace the observation belongs to.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabels {
    pub trace_id: String,
}

/// The exemplar for an observation in the trace `trace_id` (none without a trace).
pub fn exemplar(trace_id: Option<String>) -> Option<TraceLabels> {
    trace_id.map(|trace_id| TraceLabels { trace_id })
}

fn latency() -> Histogram {
    // 5 ms … ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn fast_latency() -> Traced {
    // 0.5 ms … ~4 s.
    Traced::new(exponential_buckets(0.0005, 2.0, 14))
}

pub struct Metrics {
    pub registry: Registry,
    pub transitions: Family<TransitionLabels, Counter>,
    pub outbox_rows: Family<StatusLabels, Gauge>,
    pub oldest_due_seconds: Gauge<f64, AtomicU64>,
    /// How long the oldest `sending` row has been past its lease (0: none is).
    pub lease_overdue_seconds: Gauge<f64, AtomicU64>,
    pub ingested: Family<ResultLabels, Counter>,
    /// 1 while ingest takes new notifications, 0 while dispatch is behind and it holds them.
    pub ingest_admitted: Gauge,
    pub dead_lettered: Family<KindLabels, Counter>,
    pub source_errors: Family<KindLabels, Counter>,
    pub pushes: Family<PushLabels, Counter>,
    pub push_duration: TracedHist<StatusLabels>,
    pub detection_to_delivery: Traced,
    pub consumer_pending: Family<ConsumerLabels, Gauge>,
    pub consumer_ack_pending: Family<ConsumerLabels, Gauge>,
    pub scans: Counter,
    /// 1 while the detector holds its scans back because the enqueue stream is deep.
    pub detector_held: Gauge,
    /// How many shards split the watches, labelled with this detector's own `shard`: the
    /// alerts compare the shards that report with the count they should be.
    pub detector_shard_count: Family<ShardLabels, Gauge>,
    pub scan_duration: Histogram,
    pub detections: Family<ResultLabels, Counter>,
    pub detector_watches: Gauge,
    pub evaluated_watches: Counter,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: TracedHist<RouteLabels>,
    pub create_batch_size: Histogram,
    pub delivery_log_errors: Family<OperationLabels, Counter>,
    /// Requests refused by an abuse limit, by which (`register`, `watches_per_address`,
    /// `watches_per_device`).
    pub rate_limited: Family<KindLabels, Counter>,
    /// 1 while the service is ready (what `/readyz` answers), else 0.
    pub ready: Gauge,
    /// 1, labelled with the build's version.
    pub build_info: Family<VersionLabels, Gauge>,
    /// Messages in the dead-letter stream.
    pub dlq_messages: Gauge,
    /// Outbox weeks past the retention kept because a row in them is still to be decided.
    pub expired_partitions_kept: Gauge,
    /// Operations that failed and will be tried again, by `operation`.
    pub failures: Family<OperationLabels, Counter>,
    /// The Postgres pool's open connections by `state` (`in_use`, `idle`), and its maximum.
    pub db_pool_connections: Family<StateLabels, Gauge>,
    pub db_pool_max: Gauge,
    /// How long each connection took to get from the pool: above a millisecond, a query waited
    /// for a connection (the pool was full) or for a new one to be opened.
    pub db_pool_acquire: Histogram,
    pub process_cpu_seconds: Counter<f64, AtomicU64>,
    pub process_rss_bytes: Gauge,
    pub process_open_fds: Gauge,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: String,
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
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            transitions: Family::default(),
            outbox_rows: Family::default(),
            oldest_due_seconds: Gauge::default(),
            lease_overdue_seconds: Gauge::default(),
            ingested: Family::default(),
            ingest_admitted: Gauge::default(),
            dead_lettered: Family::default(),
            source_errors: Family::default(),
            pushes: Family::default(),
            push_duration: Family::new_with_constructor(fast_latency as fn() -> Traced),
            // 10 ms … ~2.9 h: a notification retried on the longest schedule (8 retries from
            // 30 s, capped at 30 min, ~1.5 h) still lands in a bucket, so p99 does not clip.
            detection_to_delivery: Traced::new(exponential_buckets(0.01, 2.0, 21)),
            consumer_pending: Family::default(),
            consumer_ack_pending: Family::default(),
            scans: Counter::default(),
            detector_held: Gauge::default(),
            detector_shard_count: Family::default(),
            scan_duration: latency(),
            detections: Family::default(),
            detector_watches: Gauge::default(),
            evaluated_watches: Counter::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(fast_latency as fn() -> Traced),
            // 1 … 128 creates per statement.
            create_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 8)),
            delivery_log_errors: Family::default(),
            rate_limited: Family::default(),
            ready: Gauge::default(),
            build_info: Family::default(),
            dlq_messages: Gauge::default(),
            expired_partitions_kept: Gauge::default(),
            failures: Family::default(),
            db_pool_connections: Family::default(),
            db_pool_max: Gauge::default(),
            // 0.1 ms … ~26 s (the pool gives up after 30 s).
            db_pool_acquire: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
            process_cpu_seconds: Counter::default(),
            process_rss_bytes: Gauge::default(),
            process_open_fds: Gauge::default(),
            registry: Registry::default(),
        };
        m.register_outbox(&mut registry);
        m.register_detector(&mut registry);
        m.register_pusher(&mut registry);
        m.register_api(&mut registry);
        m.register_health(&mut registry);
        m.build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        Metrics { registry, ..m }
    }

    /// The outbox and the pipeline between the services: states, backlog, ingest, dead letters,
    /// source errors, consumers.
    fn register_outbox(&self, registry: &mut Registry) {
        register(
            registry,
            "tidings_outbox_transitions",
            "Outbox state changes by target state and reason (dropped = correctly withheld)",
            self.transitions.clone(),
        );
        register(
            registry,
            "tidings_outbox_rows",
            "Non-terminal outbox rows by state (pending, retry, sending)",
            self.outbox_rows.clone(),
        );
        register(
            registry,
            "tidings_outbox_oldest_due_seconds",
            "Age of the oldest due outbox row",
            self.oldest_due_seconds.clone(),
        );
        register(
            registry,
            "tidings_ingest_admitted",
            "1 while ingest takes new notifications; 0 while dispatch is behind (its oldest \
             claimed row was due longer than TIDINGS_INGEST_ADMISSION_LAG) and they wait in the \
             enqueue stream",
            self.ingest_admitted.clone(),
        );
        register(
            registry,
            "tidings_outbox_lease_overdue_seconds",
            "How long the oldest sending row has been past its lease (0: none is); the lease \
             sweeper takes such rows back, so this stays near 0 while it works",
            self.lease_overdue_seconds.clone(),
        );
        register(
            registry,
            "tidings_ingested",
            "EnqueueRequests ingested by result (new; duplicate: absorbed by the dedup key)",
            self.ingested.clone(),
        );
        register(
            registry,
            "tidings_dead_lettered",
            "Messages sent to the dead-letter stream, by stream kind",
            self.dead_lettered.clone(),
        );
        register(
            registry,
            "tidings_source_errors",
            "Source (catalog) errors by kind",
            self.source_errors.clone(),
        );
        register(
            registry,
            "tidings_consumer_pending_messages",
            "JetStream messages not yet delivered to the consumer (lag)",
            self.consumer_pending.clone(),
        );
        register(
            registry,
            "tidings_consumer_ack_pending_messages",
            "JetStream messages delivered and not yet acknowledged",
            self.consumer_ack_pending.clone(),
        );
    }

    /// The detector's scans.
    fn register_detector(&self, registry: &mut Registry) {
        register(
            registry,
            "tidings_detector_scans",
            "Completed detector scans",
            self.scans.clone(),
        );
        register(
            registry,
            "tidings_detector_held",
            "1 while the detector holds its scans back because more than \
             TIDINGS_DETECTOR_HOLD_BACKLOG notifications wait in the enqueue stream for ingest",
            self.detector_held.clone(),
        );
        register(
            registry,
            "tidings_detector_shard_count",
            "How many shards split the watches (TIDINGS_SHARD_COUNT), labelled with this \
             detector's shard",
            self.detector_shard_count.clone(),
        );
        register(
            registry,
            "tidings_detector_scan_duration_seconds",
            "Duration of a full detector scan",
            self.scan_duration.clone(),
        );
        register(
            registry,
            "tidings_detections",
            "Detections by result (published, duplicate, remembered, publish_error)",
            self.detections.clone(),
        );
        register(
            registry,
            "tidings_detector_watches",
            "Active watches this detector holds in memory (its shard)",
            self.detector_watches.clone(),
        );
        register(
            registry,
            "tidings_detector_evaluated_watches",
            "Watches evaluated by scans (those whose item value, watch or baseline changed)",
            self.evaluated_watches.clone(),
        );
    }

    /// The pusher's pushes, their latency, detection to delivery, and its delivery log.
    fn register_pusher(&self, registry: &mut Registry) {
        register(
            registry,
            "tidings_push_requests",
            "Push requests by outcome, HTTP status class and push-service host",
            self.pushes.clone(),
        );
        register(
            registry,
            "tidings_push_duration_seconds",
            "Push request latency by HTTP status class",
            self.push_duration.clone(),
        );
        register(
            registry,
            "tidings_detection_to_delivery_seconds",
            "Time from detection to the push service accepting the notification",
            self.detection_to_delivery.clone(),
        );
        register(
            registry,
            "tidings_delivery_log_errors",
            "Delivery-log operations (record, lookup) that failed even after recreating the bucket: \
             while this moves, a redelivered push may be sent twice",
            self.delivery_log_errors.clone(),
        );
    }

    /// The api's requests.
    fn register_api(&self, registry: &mut Registry) {
        register(
            registry,
            "tidings_http_requests",
            "API requests by route template, method and status",
            self.http_requests.clone(),
        );
        register(
            registry,
            "tidings_http_request_duration_seconds",
            "API request latency by route template",
            self.http_duration.clone(),
        );
        register(
            registry,
            "tidings_api_create_batch_size",
            "Watch creates per insert statement (the api shares statements under load)",
            self.create_batch_size.clone(),
        );
        register(
            registry,
            "tidings_api_rate_limited",
            "API requests refused by an abuse limit (429), by limit",
            self.rate_limited.clone(),
        );
    }

    /// Health every service reports: readiness, build, failures, the Postgres pool and the process.
    fn register_health(&self, registry: &mut Registry) {
        register(
            registry,
            "tidings_ready",
            "1 while the service is ready (what /readyz answers), else 0; evaluated on every \
             scrape",
            self.ready.clone(),
        );
        register(
            registry,
            "tidings_build_info",
            "1, labelled with the version of the running build",
            self.build_info.clone(),
        );
        register(
            registry,
            "tidings_dlq_messages",
            "Messages in the dead-letter stream (kept 14 days), for an operator to read",
            self.dlq_messages.clone(),
        );
        register(
            registry,
            "tidings_outbox_expired_partitions_kept",
            "Outbox weeks wholly older than TIDINGS_RETENTION that are kept because a row in \
             them is still pending, retrying or sending (0 normally)",
            self.expired_partitions_kept.clone(),
        );
        register(
            registry,
            "tidings_failures",
            "Operations that failed and are tried again (a scan, a dispatch batch, a consumer's \
             batch, the sweep, a publish), by operation: while one keeps moving, work waits",
            self.failures.clone(),
        );
        register(
            registry,
            "tidings_db_pool_connections",
            "Postgres connections the service's pool holds, by state (in_use, idle)",
            self.db_pool_connections.clone(),
        );
        register(
            registry,
            "tidings_db_pool_max_connections",
            "The most Postgres connections the service's pool opens",
            self.db_pool_max.clone(),
        );
        register(
            registry,
            "tidings_db_pool_acquire_seconds",
            "Time to get a connection from the Postgres pool (waits: the pool was full or \
             opening one)",
            self.db_pool_acquire.clone(),
        );
        register(
            registry,
            "process_cpu_seconds",
            "CPU time the process has used (user and system)",
            self.process_cpu_seconds.clone(),
        );
        register(
            registry,
            "process_resident_memory_bytes",
            "Resident memory of the process",
            self.process_rss_bytes.clone(),
        );
        register(
            registry,
            "process_open_fds",
            "File descriptors the process holds open",
            self.process_open_fds.clone(),
        );
    }

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
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
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

    pub fn transition(&self, to: &str, reason: &str, n: u64) {
        self.transitions
            .get_or_create(&TransitionLabels {
                to: to.to_owned(),
                reason: reason.to_owned(),
            })
            .inc_by(n);
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

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
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

    #[test]
    fn every_registered_family_is_listed_in_families() {
        let m = metrics();
        // A family shows up in the exposition once it has a series.
        m.transition("sent", "", 0);
        macro_rules! touch {
            ($($family:ident),*) => { $( let _ = m.$family.get_or_create(&Default::default()); )* };
        }
        touch!(
            outbox_rows,
            ingested,
            dead_lettered,
            source_errors,
            pushes,
            push_duration,
            consumer_pending,
            consumer_ack_pending,
            detections,
            http_requests,
            http_duration,
            delivery_log_errors,
            rate_limited,
            db_pool_connections,
            detector_shard_count,
            failures
        );
        let mut registered: Vec<(String, String)> = m
            .encode()
            .lines()
            .filter_map(|line| {
                let mut parts = line.strip_prefix("# TYPE ")?.split(' ');
                Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
            })
            .collect();
        registered.sort();
        let mut listed: Vec<(String, String)> = FAMILIES
            .iter()
            .map(|(n, k, _)| ((*n).to_owned(), (*k).to_owned()))
            .collect();
        listed.sort();
        assert_eq!(registered, listed);
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
        m.transition("dropped", "condition_lost", 2);
        let text = m.encode();
        assert!(
            text.contains(
                r#"tidings_outbox_transitions_total{to="dropped",reason="condition_lost"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE tidings_detection_to_delivery_seconds histogram"));
        // The longest retry schedule (~1.5 h) fits below the last finite bucket.
        let buckets: Vec<f64> = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("tidings_detection_to_delivery_seconds_bucket{le=\"")?
                    .split('"')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        let last = buckets
            .iter()
            .copied()
            .filter(|b| b.is_finite())
            .fold(0.0, f64::max);
        assert!(last >= 2.0 * 3600.0, "{buckets:?}");
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
