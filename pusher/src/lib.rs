//! The Tidings pusher: PushRequests from JetStream → encrypted (RFC 8291), VAPID-signed
//! (RFC 8292) HTTPS POSTs to push services → PushResults back to the dispatcher. It has no
//! database: a PushRequest carries everything needed to deliver it.
//!
//! - [`worker`]: the consume loop, redelivery safety.
//! - [`report`]: results back to the dispatcher, batched.
//! - [`deliver`]: one delivery: deadline, endpoint guard, encryption, VAPID, HTTP.
//! - [`webhook`]: one signed webhook: endpoint guard, a slot among its host's, HTTP.
//! - [`email`]: one signed mail: a slot among its domain's, the relay.
//! - [`config`]: configuration and validated settings.
//!
//! What a push service's answer means is `tidings_domain::push`, shared with the dispatcher,
//! which turns reported outcomes into outbox events. Encryption, VAPID and the endpoint guard
//! are `tidings_webpush` and `tidings_endpoint_guard`, where the api uses them too.

pub mod config;
mod deliver;
mod email;
pub mod metrics;
pub mod report;
mod webhook;
pub mod worker;

pub use config::{Config, Settings};

/// A push request as the pusher reads it: its payload kept as the JSON it encrypts.
pub use tidings_domain::messages::RawPushRequest as Request;

use std::sync::Arc;
use std::time::Duration;
use tidings_bus::consume::Handler as _;
use tidings_domain::Channel;
use tidings_domain::subjects::StreamKind;
use tidings_runtime::{ops, startup};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Nats(#[from] tidings_bus::connection::ConnectionError),
    #[error(transparent)]
    Pusher(#[from] worker::PusherError),
}

/// Runs the pusher as its binary does: serves the ops endpoint at once, waits for NATS
/// (unready, saying why, until it answers), then delivers until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), StartError> {
    let settings = config.settings()?;
    let (nats, bus) = config
        .nats
        .connect(&settings.subjects, tidings_bus::streams::Streams::Await)
        .await?;
    // Answers the api's roll call with the VAPID key it signs with (`doctor`).
    tokio::spawn(tidings_bus::roll_call::answer(
        nats.clone(),
        settings.subjects.clone(),
        tidings_bus::roll_call::Present {
            instance: tidings_runtime::telemetry::instance_id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            vapid_public_key: settings.vapid.public_key().to_owned(),
        },
        shutdown.clone(),
    ));
    let js = async_nats::jetstream::new(nats);
    let dependencies = vec![bus];
    config.ops.set_stall_bound();
    // Built before start-up reports ready: nothing may stand between that report and the wait
    // for the consumers, or /readyz answers ready while they do not exist yet.
    let deliverer =
        Arc::new(deliver::Deliverer::new(&settings).map_err(worker::PusherError::from)?);
    let Some(probes) = startup::start(Some(config.ops.ops_listen), dependencies, &shutdown).await
    else {
        return Ok(());
    };
    // The delivery log and the consumers: ready only once they exist too.
    let starting = &probes.starting;
    let mut pushers = Vec::new();
    for channel in Channel::ALL {
        let pusher = startup::retry(
            "NATS: delivery log and consumer",
            starting,
            &shutdown,
            || {
                let deliverer = deliverer.clone();
                worker::Pusher::for_channel(js.clone(), settings.clone(), channel, deliverer)
            },
        )
        .await;
        let Some(pusher) = pusher else {
            tracing::info!("stopped while starting");
            return Ok(());
        };
        pushers.push(pusher);
    }
    starting.done();
    let watched = Channel::ALL.map(|c| {
        (
            settings.subjects.stream(StreamKind::Push),
            worker::consumer_for(c).to_owned(),
        )
    });
    tokio::spawn(ops::watch_consumers(
        js,
        watched.to_vec(),
        None,
        Duration::from_secs(10),
        shutdown.clone(),
    ));
    tracing::info!("pusher running");
    let running = pushers.into_iter().map(|p| p.run(shutdown.clone()));
    for stopped in futures::future::join_all(running).await {
        stopped?;
    }
    tracing::info!("pusher stopped");
    Ok(())
}
