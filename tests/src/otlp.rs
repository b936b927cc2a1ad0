//! Traces as a test reads them: a minimal OTLP/HTTP (JSON) receiver, the whole pipeline
//! exporting to it, and the attributes of the spans it collected.

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use serde_json::Value;
use std::sync::{Arc, Mutex};

use crate::harness::serve;
use crate::scenario::Scenario;
use crate::services::Pipeline;

/// The spans received so far, each with the `service` (its resource's `service.name`) added.
pub type Spans = Arc<Mutex<Vec<Value>>>;

/// A minimal OTLP/HTTP (JSON) trace receiver: its base URL and what it has received.
pub async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let store = spans.clone();
    let router = Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let store = store.clone();
            async move {
                if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                    for rs in v["resourceSpans"].as_array().into_iter().flatten() {
                        let service = rs["resource"]["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|a| a["key"] == "service.name")
                            .and_then(|a| a["value"]["stringValue"].as_str())
                            .unwrap_or("?")
                            .to_owned();
                        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                            for span in ss["spans"].as_array().into_iter().flatten() {
                                let mut span = span.clone();
                                span["service"] = Value::String(service.clone());
                                store.lock().unwrap().push(span);
                            }
                        }
                    }
                }
                "{}"
            }
        }),
    );
    (serve(router).await, spans)
}

/// Every service, exporting its spans (as JSON, to read them) to a receiver of the test's.
pub async fn traced_pipeline(s: &Scenario) -> (Pipeline, Spans) {
    traced_pipeline_with(s, &[]).await
}

/// [`traced_pipeline`] with more environment for every service.
pub async fn traced_pipeline_with(s: &Scenario, extra: &[(&str, &str)]) -> (Pipeline, Spans) {
    let (otlp, spans) = receiver().await;
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    env.extend_from_slice(extra);
    let p = Pipeline::start(s, &env).await;
    (p, spans)
}

/// A span's attribute as text (strings as they are, other values as JSON).
pub fn attr(span: &Value, key: &str) -> Option<String> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| {
            let v = &a["value"];
            v["stringValue"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string())
        })
}

/// An integer attribute (OTLP/JSON writes int64 as a number or a string); `None` if it is
/// missing or not an integer.
pub fn int_attr(span: &Value, key: &str) -> Option<i64> {
    let v = &span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?["value"]["intValue"];
    v.as_i64().or_else(|| v.as_str()?.parse().ok())
}
