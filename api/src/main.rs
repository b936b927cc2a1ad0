//! `tidings-api serve`: the HTTP API. `tidings-api migrate`: the one command that applies the
//! schema (once per deploy, e.g. as a Kubernetes Job). `tidings-api openapi`: the document.
//! Everything else is `tidings_api::run`.

use clap::Parser;
use tidings_runtime::signals;

#[derive(Parser)]
#[command(name = "tidings-api", version, about)]
struct Cli {
    #[command(subcommand)]
    command: tidings_api::Command,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    signals::serve("tidings-api", |shutdown| {
        tidings_api::run(command, shutdown)
    })
    .await?;
    Ok(())
}
