//! Logs and traces, set up the same way by every service.
//!
//! Logs are JSON on stderr, always. Traces are exported over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (protocol from `OTEL_EXPORTER_OTLP_PROTOCOL`:
//! `http/protobuf`, the default, or `http/json`), with the resource [`resource`] describes. A notification is one trace: each service
//! starts its span as a child of the span context that came with the message (`traceparent` in
//! NATS headers, or stored on the outbox row), and passes its own on.

use opentelemetry::KeyValue;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::util::SubscriberInitExt;

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported. When not, services skip per-message spans and pass the upstream
/// `traceparent` along unchanged, so the cost of tracing is paid only when someone looks.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

static SERVICE: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// The name this process logs and traces as (`tidings-dispatcher`, …), also what it calls its
/// connections (NATS shows it in `nats server report connections`); `tidings` in a process
/// that never called [`Telemetry::init`] (tests).
pub fn service_name() -> &'static str {
    SERVICE.get().copied().unwrap_or("tidings")
}

/// Flushes and stops the trace exporter when dropped (end of `main`).
#[must_use = "dropping the guard flushes traces; keep it until main returns"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the global subscriber for `service` (e.g. `tidings-dispatcher`).
    pub fn init(service: &'static str) -> Telemetry {
        let _ = SERVICE.set(service);
        let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty());
        let env = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
        let sampling = crate::sampling::Sampling::from_env(env);
        let chosen = sampling.as_ref().copied().unwrap_or_default();
        crate::sampling::install(chosen);
        let (provider, build_error) = match endpoint {
            None => (None, None),
            Some(_) => match opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(protocol(env))
                .build()
            {
                Ok(exporter) => (
                    Some(
                        SdkTracerProvider::builder()
                            .with_batch_exporter(exporter)
                            .with_sampler(chosen.sampler())
                            .with_resource(resource(service, env))
                            .build(),
                    ),
                    None,
                ),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        let filter = || {
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        };
        let tracer = provider.as_ref().map(|p| p.tracer(service));
        tracing_subscriber::registry()
            .with(layers(filter, tracer, std::io::stderr))
            .init();
        let _ = DISPATCH.set(tracing::dispatcher::get_default(|d| d.downgrade()));
        if let Err(e) = &sampling {
            tracing::error!(error = %e, "trace sampling is left at parentbased_always_on");
        }
        if let Some(e) = build_error {
            tracing::error!(error = %e, "OTLP trace exporter could not be built; traces are not exported");
        }
        EXPORTING.store(provider.is_some(), Ordering::Relaxed);
        Telemetry { provider }
    }
}

/// The layers every service runs: JSON logs, the OpenTelemetry layer when there is a tracer, and
/// the pool-wait metric. One filter per layer (`filter()`, RUST_LOG) rather than one for all: the
/// pool-wait layer needs sqlx's per-acquire events, which the logs and traces do not want.
///
/// A list, not an `Option` layer: an absent `Option` layer counts as wanting every span, so
/// without an exporter the registry would create (and enter, on every poll) each trace-level
/// span of the HTTP/2 and NATS clients that no layer records.
fn layers<W>(
    filter: impl Fn() -> tracing_subscriber::EnvFilter,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    writer: W,
) -> Vec<Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer()
        .json()
        .event_format(JsonWithTraceIds(tracing_subscriber::fmt::format().json()))
        .with_writer(writer);
    let mut layers = vec![fmt.with_filter(filter()).boxed()];
    if let Some(tracer) = tracer {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(filter())
                .boxed(),
        );
    }
    layers.push(
        PoolWaits
            .with_filter(Targets::new().with_target(POOL_ACQUIRE_TARGET, tracing::Level::TRACE))
            .boxed(),
    );
    layers
}

/// Where sqlx reports each pool acquire, with `aquired_after_secs` (sic) (the pool's
/// `acquire_time_level`, set by the store).
const POOL_ACQUIRE_TARGET: &str = "sqlx::pool::acquire";

/// Feeds `tidings_db_pool_acquire_seconds` from sqlx's acquire events: sqlx counts no waits
/// itself, and timing every call site would miss the acquires inside `execute(&pool)`.
struct PoolWaits;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PoolWaits {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Waited(Option<f64>);
        impl tracing::field::Visit for Waited {
            fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
                if field.name() == "aquired_after_secs" {
                    self.0 = Some(value);
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        let mut waited = Waited(None);
        event.record(&mut waited);
        if let Some(secs) = waited.0 {
            crate::metrics::metrics().db_pool_acquire.observe(secs);
        }
    }
}

/// The subscriber [`Telemetry::init`] installed, for the log formatter to ask the OpenTelemetry
/// layer for a span's ids.
static DISPATCH: std::sync::OnceLock<tracing::dispatcher::WeakDispatch> =
    std::sync::OnceLock::new();

/// The JSON log line with `trace_id` and `span_id` first when the event happens inside an
/// exported span (its explicit parent or the current one), so a log line leads to its notification's trace (and a trace to its logs).
struct JsonWithTraceIds(Format<Json>);

impl<S, N> FormatEvent<S, N> for JsonWithTraceIds
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        // Without an exporter there are no trace ids to give.
        let ids = exporting()
            .then(|| ctx.parent_span())
            .flatten()
            .and_then(|span| {
                let dispatch = DISPATCH.get()?.upgrade()?;
                let cx = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)?;
                let span = cx.span();
                let sc = span.span_context();
                sc.is_valid()
                    .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
            });
        let Some((trace_id, span_id)) = ids else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}"
            ),
            None => writer.write_str(&line),
        }
    }
}

/// The OTLP encoding: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`,
/// else protobuf (the OpenTelemetry default; the exporter's own default with both encodings
/// built in would be JSON). Only the HTTP encodings are built in; anything else is protobuf.
fn protocol(env: impl Fn(&str) -> Option<String>) -> Protocol {
    let chosen =
        env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match chosen.as_deref().map(str::trim) {
        Some("http/json") => Protocol::HttpJson,
        _ => Protocol::HttpBinary,
    }
}

/// Who emits the spans: `service.name` (`OTEL_SERVICE_NAME` if set, else the binary's name),
/// `service.version`, `service.instance.id` (the pod's name, else the host's and the process id,
/// so replicas can be told apart), `k8s.pod.name` when the downward API gives `K8S_POD_NAME`,
/// and whatever `OTEL_RESOURCE_ATTRIBUTES` adds.
fn resource(service: &'static str, env: impl Fn(&str) -> Option<String>) -> Resource {
    // The builder reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
    let mut builder = Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        builder = builder.with_service_name(service);
    }
    builder.with_attributes(resource_attributes(env)).build()
}

/// This process among its service's replicas: the pod's name, else the host's, else the host
/// name read from the kernel with the process id.
fn instance_of(env: impl Fn(&str) -> Option<String>) -> String {
    env("K8S_POD_NAME")
        .or_else(|| env("HOSTNAME"))
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        })
}

/// This process's `service.instance.id`.
pub fn instance_id() -> String {
    instance_of(|key| std::env::var(key).ok())
}

fn resource_attributes(env: impl Fn(&str) -> Option<String>) -> Vec<KeyValue> {
    let pod = env("K8S_POD_NAME");
    let mut attributes = vec![
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", instance_of(&env)),
    ];
    if let Some(pod) = pod {
        attributes.push(KeyValue::new("k8s.pod.name", pod));
    }
    attributes
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("flushing traces failed: {e}");
        }
    }
}

/// Makes `span` a child of the W3C `traceparent` (when there is one and it parses), following
/// its sampled flag: for a `traceparent` from another Tidings service or an operator.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(cx) = remote(traceparent) {
        let _ = span.set_parent(cx);
    }
}

/// [`set_parent`] for a `traceparent` from outside: the trace goes on, but whether it is kept
/// is drawn here ([`crate::sampling::untrusted_parent`]), not taken from the caller.
pub fn set_untrusted_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(cx) = crate::sampling::untrusted_parent(traceparent) {
        let _ = span.set_parent(cx);
    }
}

/// Links `span` to the span a W3C `traceparent` names (another trace this one follows from,
/// e.g. the notification a replay repeats).
pub fn add_link(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(cx) = remote(traceparent) {
        span.add_link(cx.span().span_context().clone());
    }
}

/// The span context a W3C `traceparent` names, when there is one and it parses.
pub(crate) fn remote(traceparent: Option<&str>) -> Option<opentelemetry::Context> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", traceparent?);
    let cx = crate::trace_context::extract(Some(&headers));
    cx.span().span_context().is_valid().then_some(cx)
}

/// Marks `span` failed (status ERROR with `message`), so a trace shows where its notification's
/// step failed and span-error panels count it.
pub fn fail(span: &tracing::Span, message: &str) {
    span.set_status(opentelemetry::trace::Status::error(message.to_owned()));
}

/// [`fail`] for every span of a batch that failed as a whole.
pub fn fail_all<'a>(spans: impl IntoIterator<Item = &'a tracing::Span>, message: &str) {
    spans.into_iter().for_each(|span| fail(span, message));
}

/// The trace id `span` belongs to (32 hex digits), when it is being exported.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    if !exporting() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The trace id a W3C `traceparent` names, when it is well formed.
pub fn trace_id_of(traceparent: &str) -> Option<String> {
    remote(Some(traceparent)).map(|cx| cx.span().span_context().trace_id().to_string())
}

/// `span`'s own W3C `traceparent`, when it is being exported.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let mut headers = async_nats::HeaderMap::new();
    crate::trace_context::inject(&span.context(), &mut headers);
    headers.get("traceparent").map(|v| v.as_str().to_owned())
}

/// The `traceparent` to send on: this span's when exporting, else the one that came in.
pub fn forward(span: &tracing::Span, incoming: Option<&str>) -> Option<String> {
    if exporting() {
        traceparent(span).or_else(|| incoming.map(str::to_owned))
    } else {
        incoming.map(str::to_owned)
    }
}

/// An error with its causes on one line (`outer: inner: …`), as logs and rows' `last_error` keep
/// it: a `Display` alone often says only the outermost layer ("error sending request"). A cause
/// the text already ends with (a layer that prints its source too) is not told twice.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let told = c.to_string();
        if !text.ends_with(&told) {
            text.push_str(": ");
            text.push_str(&told);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn protobuf_unless_json_is_asked_for() {
        assert_eq!(protocol(env_of(&[])), Protocol::HttpBinary);
        let json = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
        assert_eq!(protocol(env_of(&json)), Protocol::HttpJson);
        let traces_wins = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ];
        assert_eq!(protocol(env_of(&traces_wins)), Protocol::HttpBinary);
    }

    fn pool_waits_counted() -> u64 {
        let text = crate::metrics::metrics().encode();
        text.lines()
            .find_map(|l| l.strip_prefix("tidings_db_pool_acquire_seconds_count "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Regression: with no exporter, the registry made every trace-level span of hyper, h2 and
    /// async-nats (an absent `Option` layer wanted them all), and entered it on every poll.
    #[test]
    fn a_span_no_layer_records_is_never_made_with_or_without_an_exporter() {
        let provider = SdkTracerProvider::builder().build();
        for tracer in [None, Some(provider.tracer("test"))] {
            let exporting = tracer.is_some();
            let subscriber = tracing_subscriber::registry().with(layers(
                || tracing_subscriber::EnvFilter::new("info"),
                tracer,
                std::io::sink,
            ));
            tracing::subscriber::with_default(subscriber, || {
                let poll = tracing::trace_span!(target: "h2::proto::connection", "poll");
                assert!(poll.is_disabled(), "exporting: {exporting}");
                let debug = tracing::debug_span!(target: "h2::proto::connection", "Connection");
                assert!(debug.is_disabled(), "exporting: {exporting}");
                let push = tracing::info_span!("push");
                assert!(!push.is_disabled(), "exporting: {exporting}");
                // The pool-wait layer still sees sqlx's trace-level acquire events.
                let before = pool_waits_counted();
                tracing::trace!(target: "sqlx::pool::acquire", aquired_after_secs = 0.002_f64);
                assert!(pool_waits_counted() > before, "exporting: {exporting}");
            });
        }
    }

    fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
        attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    #[test]
    fn replicas_are_told_apart_by_their_pod_or_host() {
        let pod = resource_attributes(env_of(&[("K8S_POD_NAME", "pusher-7d9f-x2x4z")]));
        assert_eq!(
            attribute(&pod, "service.instance.id").as_deref(),
            Some("pusher-7d9f-x2x4z")
        );
        assert_eq!(
            attribute(&pod, "k8s.pod.name").as_deref(),
            Some("pusher-7d9f-x2x4z")
        );
        assert!(attribute(&pod, "service.version").is_some());
        let host = resource_attributes(env_of(&[("HOSTNAME", "box-1")]));
        assert_eq!(
            attribute(&host, "service.instance.id").as_deref(),
            Some("box-1")
        );
        assert_eq!(attribute(&host, "k8s.pod.name"), None);
        let bare = resource_attributes(env_of(&[]));
        let id = attribute(&bare, "service.instance.id").unwrap();
        assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
    }

    #[test]
    fn an_error_is_told_with_its_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("sending")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("refused"));
        assert_eq!(with_causes(&e), "sending: refused");
    }

    #[test]
    fn a_cause_its_layer_already_prints_is_told_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("publishing to x: {0}")]
        struct Layer(#[source] std::io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("reporting")]
        struct Outer(#[source] Layer);
        let e = Outer(Layer(std::io::Error::other("timed out")));
        assert_eq!(with_causes(&e), "reporting: publishing to x: timed out");
    }
}
