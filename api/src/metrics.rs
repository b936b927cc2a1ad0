//! The api's metric families: its requests, their latency, shared creates and abuse limits.

use tidings_runtime::metrics::{
    Counter, Family, Histogram, HttpLabels, KindLabels, ResultLabels, RouteLabels, TracedHist,
    exponential_buckets, fast_latency,
};

tidings_runtime::families! {
    pub struct ApiMetrics {
        http_requests: Family<HttpLabels, Counter> = Family::default()
            => "tidings_http_requests", "API requests by route template, method and status";
        http_duration: TracedHist<RouteLabels> = Family::new_with_constructor(fast_latency)
            => "tidings_http_request_duration_seconds", "API request latency by route template";
        // 1 … 128 creates per statement.
        create_batch_size: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 8))
            => "tidings_api_create_batch_size",
            "Watch creates per insert statement (the api shares statements under load)";
        /// Requests refused by an abuse limit, by which (`register`, `watches_per_address`,
        /// `watches_per_device`).
        rate_limited: Family<KindLabels, Counter> = Family::default()
            => "tidings_api_rate_limited", "API requests refused by an abuse limit (429), by limit";
        /// Change hints by result: `taken`, or why not (`malformed`, `stale`, `unsigned`,
        /// `replayed`, `invalid`).
        hints: Family<ResultLabels, Counter> = Family::default()
            => "tidings_api_hints", "Change hints (POST /v1/items/changed) by result";
    }
}

/// Counts a change hint's `result`.
pub fn hint(result: &str) {
    metrics()
        .hints
        .get_or_create(&ResultLabels {
            result: result.to_owned(),
        })
        .inc();
}
