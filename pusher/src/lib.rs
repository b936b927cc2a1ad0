//! The Tidings pusher: PushRequests from JetStream → encrypted (RFC 8291), VAPID-signed
//! (RFC 8292) HTTPS POSTs to push services → PushResults back to the dispatcher. It has no
//! database: a PushRequest carries everything needed to deliver it.
//!
//! - [`worker`]: the consume loop, result publishing, redelivery safety.
//! - [`deliver`]: one delivery: deadline, endpoint guard, encryption, VAPID, HTTP.
//! - [`config`]: configuration and validated settings.
//!
//! What a push service's answer means is `tidings_domain::push`, shared with the dispatcher,
//! which turns reported outcomes into outbox events. Encryption, VAPID and the endpoint guard
//! are `tidings_webpush`, where the api uses them too.

pub mod config;
pub mod deliver;
pub mod worker;

pub use config::{Config, Settings};

use std::time::Duration;
use tidings_bus::streams::wait_for_streams;
use tidings_domain::subjects::StreamKind;
use tidings_runtime::{ops, startup};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] config::ConfigError),
    #[error("NATS_URL {url}: {source}")]
    NatsUrl {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(transparent)]
    Pusher(#[from] worker::PusherError),
}

/// Runs the pusher as its binary does: serves the ops endpoint at once, waits for NATS
/// (unready, saying why, until it answers), then delivers until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), StartError> {
    let settings = config.settings()?;
    let url = &config.nats.nats_url;
    let nats = startup::nats(url)
        .await
        .map_err(|source| StartError::NatsUrl {
            url: url.clone(),
            source,
        })?;
    let js = async_nats::jetstream::new(nats.clone());
    let probes = ops::Probes::default().with_nats(nats.clone());
    ops::spawn(config.ops.ops_listen, probes.clone(), shutdown.clone());
    let starting = &probes.starting;
    let ready = async {
        let (subjects, streams) = (&settings.subjects, &settings.streams);
        wait_for_streams(&nats, url, subjects, streams, starting, &shutdown).await?;
        startup::retry(
            "NATS: delivery log and consumer",
            starting,
            &shutdown,
            || worker::Pusher::new(js.clone(), settings.clone()),
        )
        .await
    };
    let Some(pusher) = ready.await else {
        tracing::info!("stopped while starting");
        return Ok(());
    };
    starting.done();
    tokio::spawn(ops::watch_consumers(
        js,
        vec![(
            settings.subjects.stream(StreamKind::Push),
            worker::CONSUMER.to_owned(),
        )],
        Duration::from_secs(10),
        shutdown.clone(),
    ));
    tracing::info!("pusher running");
    pusher.run(shutdown).await?;
    tracing::info!("pusher stopped");
    Ok(())
}
