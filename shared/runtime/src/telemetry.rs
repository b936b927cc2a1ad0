//! Logs and traces, set up the same way by every service.
//!
//! Logs are JSON on stderr, always. Traces are exported over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (protocol from `OTEL_EXPORTER_OTLP_PROTOCOL`:
//! `http/protobuf`, the default, or `http/json`). A notification is one trace: each service
//! starts its span as a child of the span context that came with the message (`traceparent` in
//! NATS headers, or stored on the outbox row), and passes its own on.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
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
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let fmt = tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr);
        let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .ok()
            .filter(|e| !e.trim().is_empty());
        let (provider, build_error) = match endpoint {
            None => (None, None),
            Some(_) => match opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .build()
            {
                Ok(exporter) => (
                    Some(
                        SdkTracerProvider::builder()
                            .with_batch_exporter(exporter)
                            .with_resource(Resource::builder().with_service_name(service).build())
                            .build(),
                    ),
                    None,
                ),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        let otel = provider
            .as_ref()
            .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service)));
        tracing_subscriber::registry()
            .with(filter)
            .with(fmt)
            .with(otel)
            .init();
        if let Some(e) = build_error {
            tracing::error!(error = %e, "OTLP trace exporter could not be built; traces are not exported");
        }
        EXPORTING.store(provider.is_some(), Ordering::Relaxed);
        Telemetry { provider }
    }
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

/// Makes `span` a child of the W3C `traceparent` (when there is one and it parses).
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", tp);
    let cx = crate::trace_context::extract(Some(&headers));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
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
