//! `tidings-detector`: reads config, connects, scans until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use sqlx::postgres::PgPoolOptions;
use tidings_shared::ops;
use tidings_shared::service::OpsArgs;
use tidings_shared::source::HttpSource;
use tidings_shared::streams::ensure_streams;
use tidings_shared::telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-detector", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_detector::Config,
    #[command(flatten)]
    ops: OpsArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = cli.config;
    let _telemetry = Telemetry::init("tidings-detector");
    let settings = config.settings().context("invalid configuration")?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&config.database_url)
        .await
        .context("connecting to Postgres (DATABASE_URL)")?;
    let nats = async_nats::connect(&config.nats.nats_url)
        .await
        .with_context(|| format!("connecting to NATS at {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats.clone());
    ensure_streams(&js, &settings.subjects, &settings.streams).await?;
    let source = HttpSource::new(settings.source.clone()).context("source configuration")?;
    let interval = settings.scan_interval;
    let probes = ops::Probes {
        pool: Some(pool.clone()),
        nats: Some(nats),
    };
    let detector = tidings_detector::scan::Detector::new(pool, js, source, settings);
    if config.once {
        let stats = detector.scan_once(chrono::Utc::now()).await?;
        tracing::info!(?stats, "scan finished");
        return Ok(());
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_shared::service::cancel_on_signal(shutdown.clone()));
    ops::spawn(cli.ops.ops_listen, probes, shutdown.clone());
    detector.run(interval, shutdown).await;
    tracing::info!("detector stopped");
    Ok(())
}
