//! `tidings-detector`: reads its configuration (flags and environment) and scans until SIGTERM
//! or Ctrl-C (or once, with `--once`); everything else is `tidings_detector::run`.

use clap::Parser;
use tidings_runtime::{signals, telemetry::Telemetry};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-detector", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_detector::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = Telemetry::init("tidings-detector");
    let config = Cli::parse().config;
    let shutdown = CancellationToken::new();
    tokio::spawn(signals::cancel_on_signal(shutdown.clone()));
    tidings_detector::run(config, shutdown).await?;
    Ok(())
}
