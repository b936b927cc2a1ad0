//! `tidings-api serve`: the HTTP API. `tidings-api migrate`: the one command that applies the
//! schema (once per deploy, e.g. as a Kubernetes Job). `tidings-api openapi`: the document.
//! Everything else is `tidings_api::run`.

use clap::Parser;
use tidings_runtime::{signals, telemetry::Telemetry};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-api", version, about)]
struct Cli {
    #[command(subcommand)]
    command: tidings_api::Command,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    let _telemetry = Telemetry::init("tidings-api");
    let shutdown = CancellationToken::new();
    tokio::spawn(signals::cancel_on_signal(shutdown.clone()));
    tidings_api::run(command, shutdown).await?;
    Ok(())
}
