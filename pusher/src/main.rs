//! `tidings-pusher`: reads config, serves the ops endpoint, waits for NATS, delivers until
//! SIGTERM or Ctrl-C. `tidings-pusher vapid-keygen` prints a new VAPID key pair.

use anyhow::Context;
use clap::Parser;
use std::time::Duration;
use tidings_bus::streams::wait_for_streams;
use tidings_domain::subjects::StreamKind;
use tidings_runtime::ops::OpsArgs;
use tidings_runtime::telemetry::Telemetry;
use tidings_runtime::{ops, startup};
use tidings_webpush::vapid::VapidKey;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "tidings-pusher",
    version,
    about,
    after_help = "`tidings-pusher vapid-keygen` prints a new VAPID key pair: the private key for \
                  TIDINGS_VAPID_PRIVATE_KEY and the public key browsers pass to \
                  pushManager.subscribe as applicationServerKey."
)]
struct Cli {
    #[command(flatten)]
    config: tidings_pusher::Config,
    #[command(flatten)]
    ops: OpsArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("vapid-keygen") {
        let (private, public) = VapidKey::generate().context("generating a VAPID key pair")?;
        println!("TIDINGS_VAPID_PRIVATE_KEY={private}");
        println!("TIDINGS_VAPID_PUBLIC_KEY={public}");
        return Ok(());
    }
    let _telemetry = Telemetry::init("tidings-pusher");
    let cli = Cli::parse();
    let config = cli.config;
    let settings = config.settings().context("invalid configuration")?;
    let nats = startup::nats(&config.nats.nats_url)
        .await
        .with_context(|| format!("NATS_URL {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats.clone());
    let stream = settings.subjects.stream(StreamKind::Push);
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_runtime::signals::cancel_on_signal(shutdown.clone()));
    let probes = ops::Probes::default().with_nats(nats.clone());
    ops::spawn(cli.ops.ops_listen, probes.clone(), shutdown.clone());
    let connected = wait_for_streams(
        &nats,
        &config.nats.nats_url,
        &settings.subjects,
        &settings.streams,
        &probes.starting,
        &shutdown,
    )
    .await;
    let pusher = match connected {
        Some(()) => {
            startup::retry(
                "NATS: delivery log and consumer",
                &probes.starting,
                &shutdown,
                || tidings_pusher::worker::Pusher::new(js.clone(), settings.clone()),
            )
            .await
        }
        None => None,
    };
    let Some(pusher) = pusher else {
        tracing::info!("stopped while starting");
        return Ok(());
    };
    probes.starting.done();
    tokio::spawn(ops::watch_consumers(
        js,
        vec![(stream, tidings_pusher::worker::CONSUMER.to_owned())],
        Duration::from_secs(10),
        shutdown.clone(),
    ));
    tracing::info!("pusher running");
    pusher.run(shutdown).await?;
    tracing::info!("pusher stopped");
    Ok(())
}
