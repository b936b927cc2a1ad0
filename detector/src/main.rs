//! `tidings-detector`: reads its configuration (flags and environment) and scans until SIGTERM
//! or Ctrl-C (or once, with `--once`); everything else is `tidings_detector::run`.

use clap::Parser;
use tidings_runtime::signals;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = tidings_detector::Config::parse();
    Ok(signals::serve("tidings-detector", |s| tidings_detector::run(config, s)).await?)
}
