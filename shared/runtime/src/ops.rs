//! The operations endpoint every worker service serves on `TIDINGS_OPS_LISTEN`: `/livez` (the
//! process answers), `/readyz` (its Postgres and NATS connections work) and `/metrics`
//! (Prometheus text). The api serves the same paths on its own port.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One readiness check: `Ok` while the dependency answers, else what is wrong.
pub type Check = Arc<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// What readiness checks: the dependencies a service added ([`Probes::with_check`]; see
/// [`crate::startup::start`]) and whether start-up is done.
#[derive(Clone, Default)]
pub struct Probes {
    checks: Vec<Check>,
    /// While the service is starting: what it is waiting for (see [`crate::startup`]).
    pub starting: Starting,
}

/// What a starting service is waiting for; `/readyz` answers 503 with it until start-up is done.
#[derive(Clone, Default)]
pub struct Starting(Arc<std::sync::Mutex<Option<String>>>);

impl Starting {
    pub fn waiting_for(&self, what: String) {
        if let Ok(mut w) = self.0.lock() {
            *w = Some(what);
        }
    }

    pub fn done(&self) {
        if let Ok(mut w) = self.0.lock() {
            *w = None;
        }
    }

    pub fn current(&self) -> Option<String> {
        self.0.lock().ok().and_then(|w| w.clone())
    }
}

impl Probes {
    /// Adds a dependency check (e.g. `tidings_store::readiness(pool)`).
    pub fn with_check(mut self, check: Check) -> Self {
        self.checks.push(check);
        self
    }

    /// `Ok` when start-up is done and every dependency answers; otherwise what is missing.
    /// Also sets `tidings_ready`.
    pub async fn ready(&self) -> Result<(), String> {
        let result = self.evaluate().await;
        crate::metrics::metrics()
            .ready
            .set(i64::from(result.is_ok()));
        result
    }

    async fn evaluate(&self) -> Result<(), String> {
        if let Some(what) = self.starting.current() {
            return Err(format!("starting: {what}"));
        }
        for check in &self.checks {
            check().await?;
        }
        Ok(())
    }
}

/// The readiness check that a NATS connection is up.
pub fn nats_check(client: async_nats::Client) -> Check {
    Arc::new(move || {
        let connected = client.connection_state() == async_nats::connection::State::Connected;
        Box::pin(async move {
            if connected {
                Ok(())
            } else {
                Err("NATS is not connected".into())
            }
        })
    })
}

pub async fn metrics_text() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::metrics().encode(),
    )
}

/// The ops router (also merged into services that have their own HTTP server).
pub fn router(probes: Probes) -> Router {
    let probes_for_metrics = probes.clone();
    Router::new()
        .route("/livez", get(livez))
        .route(
            "/readyz",
            get(move || {
                let probes = probes.clone();
                async move {
                    match probes.ready().await {
                        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
                        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let probes = probes_for_metrics.clone();
                async move {
                    // A scrape sees readiness as a probe would (`tidings_ready`).
                    let _ = probes.ready().await;
                    metrics_text().await
                }
            }),
        )
}

/// `/livez`: 200 while every work loop makes progress ([`crate::liveness`]), else 503 naming
/// the loops that do not, so Kubernetes restarts a process whose loop hangs.
async fn livez() -> (StatusCode, String) {
    let stalled = crate::liveness::stalled();
    if stalled.is_empty() {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stalled: {}\n", stalled.join("; ")),
        )
    }
}

/// Where a worker service serves `/livez`, `/readyz` and `/metrics`, and when `/livez` fails.
#[derive(clap::Args, Clone, Debug)]
pub struct OpsArgs {
    #[arg(long, env = "TIDINGS_OPS_LISTEN", default_value = "0.0.0.0:9090")]
    pub ops_listen: std::net::SocketAddr,
    /// How long a work loop may go without progress (past a planned sleep) before `/livez`
    /// answers 503 and Kubernetes restarts the pod. Longer than the slowest round of work
    /// (a detector's full scan of its shard).
    #[arg(long, env = "TIDINGS_STALL_AFTER", default_value = "5m",
        value_parser = tidings_domain::duration::parse_duration)]
    pub stall_after: Duration,
}

impl OpsArgs {
    /// Makes [`OpsArgs::stall_after`] the stall bound of this process's loops (the listen
    /// address is used where the ops endpoint is served).
    pub fn set_stall_bound(&self) {
        crate::liveness::set_stall_after(self.stall_after);
    }
}

/// Serves the ops endpoints on `listen` until `shutdown`.
pub async fn serve(
    listen: SocketAddr,
    probes: Probes,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(listen = %listen, "ops endpoint (/livez /readyz /metrics) serving");
    axum::serve(listener, router(probes))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Polls JetStream for each `(stream, consumer)`'s backlog every `every` until `shutdown`:
/// `tidings_consumer_pending_messages` (lag) and `tidings_consumer_ack_pending_messages`; and,
/// when `dlq` names the dead-letter stream, its depth ([`measure_dlq`]).
pub async fn watch_consumers(
    js: async_nats::jetstream::Context,
    consumers: Vec<(String, String)>,
    dlq: Option<String>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let m = crate::metrics::metrics();
    loop {
        if let Some(stream) = &dlq
            && let Err(e) = measure_dlq(&js, stream).await
        {
            tracing::debug!(stream, error = %e, "dead-letter stream info unavailable");
        }
        for (stream, name) in &consumers {
            // One request: looking the consumer up returns its current info.
            let consumer = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    name, stream,
                )
                .await;
            match consumer {
                Ok(consumer) => {
                    let info = consumer.cached_info();
                    let labels = crate::metrics::ConsumerLabels {
                        consumer: name.clone(),
                    };
                    m.consumer_pending
                        .get_or_create(&labels)
                        // Gauges saturate at `i64::MAX`, which no message count reaches.
                        .set(i64::try_from(info.num_pending).unwrap_or(i64::MAX));
                    m.consumer_ack_pending
                        .get_or_create(&labels)
                        // Gauges saturate at `i64::MAX`, which no message count reaches.
                        .set(i64::try_from(info.num_ack_pending).unwrap_or(i64::MAX));
                }
                Err(e) => {
                    tracing::debug!(stream, consumer = name, error = %e, "consumer info unavailable")
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Sets `tidings_dlq_messages` from the dead-letter stream `stream`, once.
pub async fn measure_dlq(
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> Result<u64, async_nats::jetstream::context::GetStreamError> {
    let stream = js.get_stream(stream).await?;
    let messages = stream.cached_info().state.messages;
    crate::metrics::metrics()
        .dlq_messages
        // Gauges saturate at `i64::MAX`, which no message count reaches.
        .set(i64::try_from(messages).unwrap_or(i64::MAX));
    Ok(messages)
}

/// Serves the ops endpoints in the background until `shutdown`; a failure to serve is logged
/// with the address (the service goes on: probes failing is how Kubernetes will notice).
pub fn spawn(listen: SocketAddr, probes: Probes, shutdown: CancellationToken) {
    tokio::spawn(async move {
        if let Err(e) = serve(listen, probes, shutdown).await {
            tracing::error!(listen = %listen, error = %e, "ops endpoint failed");
        }
    });
}
