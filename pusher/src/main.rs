//! `tidings-pusher`: reads config, connects, delivers until SIGTERM or Ctrl-C.
//! `tidings-pusher vapid-keygen` prints a new VAPID key pair.

use anyhow::Context;
use clap::Parser;
use tidings_shared::vapid::VapidKey;
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("vapid-keygen") {
        let (private, public) = VapidKey::generate().context("generating a VAPID key pair")?;
        println!("TIDINGS_VAPID_PRIVATE_KEY={private}");
        println!("TIDINGS_VAPID_PUBLIC_KEY={public}");
        return Ok(());
    }
    tidings_shared::service::init_logging();
    let config = Cli::parse().config;
    let settings = config.settings().context("invalid configuration")?;
    let nats = async_nats::connect(&config.nats.nats_url)
        .await
        .with_context(|| format!("connecting to NATS at {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats);
    let pusher = tidings_pusher::worker::Pusher::new(js, settings)
        .await
        .context("starting the pusher")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_shared::service::cancel_on_signal(shutdown.clone()));
    tracing::info!("pusher running");
    pusher.run(shutdown).await?;
    tracing::info!("pusher stopped");
    Ok(())
}
