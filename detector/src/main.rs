//! `tidings-detector`: reads config, connects, scans until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use sqlx::postgres::PgPoolOptions;
use tidings_shared::source::HttpSource;
use tidings_shared::streams::ensure_streams;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-detector", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_detector::Config,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Cli::parse().config;
    tidings_shared::service::init_logging();
    let settings = config.settings().context("invalid configuration")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&config.database_url)
        .await
        .context("connecting to Postgres (DATABASE_URL)")?;
    let nats = async_nats::connect(&config.nats.nats_url)
        .await
        .with_context(|| format!("connecting to NATS at {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats);
    ensure_streams(&js, &settings.subjects, &settings.streams).await?;
    let source = HttpSource::new(settings.source.clone()).context("source configuration")?;
    let interval = settings.scan_interval;
    let detector = tidings_detector::scan::Detector::new(pool, js, source, settings);
    if config.once {
        let stats = detector.scan_once(chrono::Utc::now()).await?;
        tracing::info!(?stats, "scan finished");
        return Ok(());
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_shared::service::cancel_on_signal(shutdown.clone()));
    detector.run(interval, shutdown).await;
    Ok(())
}
