//! `tidings-dispatcher`: reads config, connects, runs the loops until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-dispatcher", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_dispatcher::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tidings_shared::service::init_logging();
    let config = Cli::parse().config;
    let settings = config.settings().context("invalid configuration")?;
    let pool = PgPoolOptions::new()
        .max_connections(
            u32::try_from(settings.dispatch_workers + 2 * settings.consumer_concurrency + 2)
                .unwrap_or(16),
        )
        .connect(&config.database_url)
        .await
        .context("connecting to Postgres (DATABASE_URL)")?;
    let nats = async_nats::connect(&config.nats.nats_url)
        .await
        .with_context(|| format!("connecting to NATS at {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats);

    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_shared::service::cancel_on_signal(shutdown.clone()));
    tidings_dispatcher::run(pool, js, settings, shutdown).await?;
    tracing::info!("dispatcher stopped");
    Ok(())
}
