//! `tidings-dispatcher`: reads its configuration (flags and environment) and runs until SIGTERM
//! or Ctrl-C; everything else is `tidings_dispatcher::run`.

use clap::Parser;
use tidings_runtime::signals;

#[derive(Parser)]
#[command(name = "tidings-dispatcher", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_dispatcher::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Cli::parse().config;
    signals::serve("tidings-dispatcher", |shutdown| {
        tidings_dispatcher::run(config, shutdown)
    })
    .await?;
    Ok(())
}
