//! What every service binary shares: the NATS, source, endpoint and ops flags, and shutdown on
//! SIGTERM or Ctrl-C (logs and traces: [`crate::telemetry`]).

use crate::duration::parse_duration;
use crate::endpoint::EndpointPolicy;
use crate::source::SourceConfig;
use crate::streams::StreamSettings;
use crate::subjects::{InvalidPrefix, Subjects};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Where NATS is and how the streams are named and replicated.
#[derive(clap::Args, Clone, Debug)]
pub struct NatsArgs {
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Prefix of every subject and stream.
    #[arg(long, env = "TIDINGS_PREFIX", default_value = Subjects::DEFAULT_PREFIX)]
    pub prefix: String,
    /// JetStream replicas per stream (3 in production).
    #[arg(long, env = "TIDINGS_STREAM_REPLICAS", default_value_t = 1)]
    pub stream_replicas: usize,
    /// How long the delivery log remembers a delivered row, so a redelivered or retried push is
    /// not sent again (pusher and dispatcher read the same setting).
    #[arg(long, env = "TIDINGS_DELIVERY_LOG_TTL", default_value = "10m", value_parser = parse_duration)]
    pub delivery_log_ttl: Duration,
}

impl NatsArgs {
    pub fn subjects(&self) -> Result<Subjects, InvalidPrefix> {
        Subjects::new(&self.prefix)
    }

    pub fn streams(&self) -> StreamSettings {
        StreamSettings {
            replicas: self.stream_replicas,
            delivery_log_ttl: self.delivery_log_ttl,
            ..StreamSettings::default()
        }
    }
}

/// The HTTP/JSON source (see `source`).
#[derive(clap::Args, Clone, Debug)]
pub struct SourceArgs {
    /// Source URL template with {item}.
    #[arg(long, env = "TIDINGS_SOURCE_URL")]
    pub source_url: String,
    /// Optional batch URL template with {items} (comma-separated codes).
    #[arg(long, env = "TIDINGS_SOURCE_BATCH_URL")]
    pub source_batch_url: Option<String>,
    #[arg(long, env = "TIDINGS_SOURCE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub source_timeout: Duration,
    /// Source requests in flight per upstream host.
    #[arg(long, env = "TIDINGS_SOURCE_CONCURRENCY", default_value_t = 16)]
    pub source_concurrency: usize,
    /// Items per batch request.
    #[arg(long, env = "TIDINGS_SOURCE_BATCH_SIZE", default_value_t = 100)]
    pub source_batch_size: usize,
}

impl SourceArgs {
    pub fn config(&self) -> SourceConfig {
        let mut source = SourceConfig::new(self.source_url.clone());
        source.batch_url = self.source_batch_url.clone();
        source.timeout = self.source_timeout;
        source.max_concurrency_per_host = self.source_concurrency;
        source.batch_size = self.source_batch_size;
        source
    }
}

/// Where a worker service serves `/livez`, `/readyz` and `/metrics`.
#[derive(clap::Args, Clone, Debug)]
pub struct OpsArgs {
    #[arg(long, env = "TIDINGS_OPS_LISTEN", default_value = "0.0.0.0:9090")]
    pub ops_listen: std::net::SocketAddr,
}

/// Which push endpoints may be used: the pusher before each request and the api when a
/// subscription is registered read the same settings, so they cannot disagree.
#[derive(clap::Args, Clone, Debug)]
pub struct EndpointArgs {
    /// Allowed push-service hosts, comma-separated; `*.suffix` for subdomains.
    #[arg(long, env = "TIDINGS_PUSH_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,
    /// Allow private, loopback and link-local endpoint addresses (tests and local demos only).
    #[arg(long, env = "TIDINGS_PUSH_ALLOW_PRIVATE", default_value_t = false)]
    pub allow_private: bool,
}

impl EndpointArgs {
    pub fn policy(&self) -> EndpointPolicy {
        let mut policy = EndpointPolicy::default();
        if let Some(hosts) = &self.allowed_hosts {
            policy.allowed_hosts = hosts.clone();
        }
        policy.allow_private = self.allow_private;
        policy
    }
}

/// Cancels `shutdown` on SIGTERM (Kubernetes) or Ctrl-C.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: finishing in-flight work");
    shutdown.cancel();
}
