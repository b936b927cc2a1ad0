//! The pusher's metric families: its pushes and their latency.

use tidings_domain::messages::PushResult;
use tidings_runtime::metrics::{
    Counter, Failure, Family, PushLabels, StatusLabels, TracedHist, exemplar, fast_latency,
    status_class,
};

tidings_runtime::families! {
    pub struct PusherMetrics {
        pushes: Family<PushLabels, Counter> = Family::default()
            => "tidings_push_requests",
            "Push requests by outcome, HTTP status class and push-service host";
        push_duration: TracedHist<StatusLabels> = Family::new_with_constructor(fast_latency)
            => "tidings_push_duration_seconds", "Push request latency by HTTP status class";
    }
}

/// At start: the latency by status class exists from the start; the request counts get their
/// series with their first push (a push host is not known before).
pub(crate) fn init() {
    tidings_runtime::metrics::metrics().may_fail(&[Failure::PublishResult]);
    for class in ["2xx", "4xx", "5xx"] {
        let _ = metrics().push_duration.get_or_create(&StatusLabels {
            status: class.to_owned(),
        });
    }
}

/// One push's outcome, by push-service `host` (`invalid` without one), and its latency when an
/// HTTP answer came, with the notification's trace as the exemplar.
pub(crate) fn record(result: &PushResult, host: Option<String>, trace_id: Option<String>) {
    let class = status_class(result.http_status);
    let host = host.unwrap_or_else(|| "invalid".to_owned());
    let m = metrics();
    m.pushes
        .get_or_create(&PushLabels {
            outcome: result.outcome.as_str().to_owned(),
            status_class: class.clone(),
            host,
        })
        .inc();
    if result.http_status.is_some() {
        m.push_duration
            .get_or_create(&StatusLabels { status: class })
            .observe(result.latency_ms as f64 / 1000.0, exemplar(trace_id), None);
    }
}
