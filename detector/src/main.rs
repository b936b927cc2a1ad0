//! `tidings-detector`: reads its configuration (flags and environment) and scans until SIGTERM
//! or Ctrl-C (or once, with `--once`); everything else is `tidings_detector::run`.

use clap::Parser;
use tidings_runtime::signals;

#[derive(Parser)]
#[command(name = "tidings-detector", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_detector::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Cli::parse().config;
    signals::serve("tidings-detector", |shutdown| {
        tidings_detector::run(config, shutdown)
    })
    .await?;
    Ok(())
}
