//! `tidings-dispatcher`: reads its configuration (flags and environment) and runs ingest,
//! dispatch, results and the sweeper until SIGTERM or Ctrl-C; everything else is
//! `tidings_dispatcher::run`.

use clap::Parser;
use tidings_runtime::signals;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = tidings_dispatcher::Config::parse();
    Ok(signals::serve("tidings-dispatcher", |s| tidings_dispatcher::run(config, s)).await?)
}
