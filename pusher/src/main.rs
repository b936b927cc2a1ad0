//! `tidings-pusher` delivers until SIGTERM (`tidings_pusher::run`); `vapid-keygen`: a key pair.

use clap::Parser;
use tidings_pusher::config::{KEYGEN_HELP, vapid_keygen};
use tidings_runtime::signals;

#[derive(Parser)]
#[command(name = "tidings-pusher", version, about, after_help = KEYGEN_HELP)]
struct Cli {
    #[command(flatten)]
    config: tidings_pusher::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("vapid-keygen") {
        print!("{}", vapid_keygen()?);
        return Ok(());
    }
    let config = Cli::parse().config;
    signals::serve("tidings-pusher", |shutdown| {
        tidings_pusher::run(config, shutdown)
    })
    .await?;
    Ok(())
}
