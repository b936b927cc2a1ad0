//! `tidings-dispatcher`: reads its configuration (flags and environment) and runs until SIGTERM
//! or Ctrl-C; everything else is `tidings_dispatcher::run`.

use clap::Parser;
use tidings_runtime::{signals, telemetry::Telemetry};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-dispatcher", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_dispatcher::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = Telemetry::init("tidings-dispatcher");
    let config = Cli::parse().config;
    let shutdown = CancellationToken::new();
    tokio::spawn(signals::cancel_on_signal(shutdown.clone()));
    tidings_dispatcher::run(config, shutdown).await?;
    Ok(())
}
