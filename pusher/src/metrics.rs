//! The pusher's metric families: its requests (push services' and webhook receivers') and their
//! latency, by channel.

use tidings_domain::Channel;
use tidings_domain::messages::PushResult;
use tidings_runtime::metrics::{
    ChannelStatusLabels, Counter, Failure, Family, PushLabels, TracedHist, exemplar, fast_latency,
    status_class,
};

tidings_runtime::families! {
    pub struct PusherMetrics {
        pushes: Family<PushLabels, Counter> = Family::default()
            => "tidings_push_requests",
            "Push, webhook and mail requests by channel, outcome, HTTP status class and push-service host";
        push_duration: TracedHist<ChannelStatusLabels> = Family::new_with_constructor(fast_latency)
            => "tidings_push_duration_seconds",
            "Push and webhook request latency by channel and HTTP status class";
    }
}

/// At start: the latency of this pusher's channel by status class exists from the start; the
/// request counts get their series with their first push (a push host is not known before).
pub(crate) fn init(channel: Channel) {
    tidings_runtime::metrics::metrics().may_fail(&[Failure::PublishResult]);
    for class in ["2xx", "4xx", "5xx"] {
        let _ = metrics().push_duration.get_or_create(&ChannelStatusLabels {
            channel: channel.to_string(),
            status: class.to_owned(),
        });
    }
}

/// One request's outcome, by `host` (`invalid` without one), and its latency when an HTTP answer
/// came, with the notification's trace as the exemplar.
pub(crate) fn observe(
    channel: Channel,
    result: &PushResult,
    host: Option<String>,
    trace_id: Option<String>,
) {
    let class = status_class(result.http_status);
    let host = host.unwrap_or_else(|| "invalid".to_owned());
    let m = metrics();
    m.pushes
        .get_or_create(&PushLabels {
            channel: channel.to_string(),
            outcome: result.outcome().as_str().to_owned(),
            status_class: class.clone(),
            host,
        })
        .inc();
    if result.http_status.is_some() {
        let labels = ChannelStatusLabels {
            channel: channel.to_string(),
            status: class,
        };
        (m.push_duration.get_or_create(&labels)).observe(
            result.latency_ms as f64 / 1000.0,
            exemplar(trace_id),
            None,
        );
    }
}
