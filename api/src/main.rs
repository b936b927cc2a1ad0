//! `tidings-api serve`: the HTTP API. `tidings-api migrate`: the one command that applies the
//! schema (once per deploy, e.g. as a Kubernetes Job). `tidings-api openapi`: the document.
//! `tidings-api reseal`: webhook secrets sealed under the first key (docs/security.md).
//! Everything else is `tidings_api::run`.

use clap::Parser;
use tidings_runtime::signals;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let command = tidings_api::Command::parse();
    Ok(signals::serve("tidings-api", |s| tidings_api::run(command, s)).await?)
}
