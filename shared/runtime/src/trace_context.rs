//! W3C trace context (`traceparent`, `tracestate`) carried in NATS headers, so one notification
//! is one trace from detection to its result.

use async_nats::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

/// Writes `cx`'s span context into `headers`.
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// Reads the remote span context from `headers`; an empty context when there is none.
pub fn extract(headers: Option<&HeaderMap>) -> Context {
    match headers {
        Some(h) => TraceContextPropagator::new().extract(&HeaderExtractor(h)),
        None => Context::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    #[test]
    fn a_span_context_survives_the_headers() {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::from_key_value([("tidings", "1")]).unwrap(),
        );
        let cx = Context::new().with_remote_span_context(sc.clone());
        let mut headers = HeaderMap::new();
        inject(&cx, &mut headers);
        assert_eq!(
            headers.get("traceparent").map(|v| v.as_str()),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let back = extract(Some(&headers));
        assert_eq!(back.span().span_context(), &sc);
    }

    #[test]
    fn missing_headers_give_an_empty_context() {
        assert!(!extract(None).span().span_context().is_valid());
        assert!(
            !extract(Some(&HeaderMap::new()))
                .span()
                .span_context()
                .is_valid()
        );
    }
}
