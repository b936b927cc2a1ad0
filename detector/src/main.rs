//! `tidings-detector`: reads config, serves the ops endpoint, waits for Postgres and NATS, scans
//! until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use tidings_bus::streams::wait_for_streams;
use tidings_runtime::ops;
use tidings_runtime::ops::OpsArgs;
use tidings_runtime::telemetry::Telemetry;
use tidings_source::HttpSource;
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
    let source = HttpSource::new(settings.source.clone()).context("source configuration")?;
    let pool = tidings_store::postgres(&config.database_url, 4).context("DATABASE_URL")?;
    let nats = tidings_runtime::startup::nats(&config.nats.nats_url)
        .await
        .with_context(|| format!("NATS_URL {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats.clone());
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_runtime::signals::cancel_on_signal(shutdown.clone()));
    let probes = ops::Probes::default()
        .with_check(tidings_store::readiness(pool.clone()))
        .with_nats(nats.clone());
    if !config.once {
        ops::spawn(cli.ops.ops_listen, probes.clone(), shutdown.clone());
    }
    let starting = &probes.starting;
    let ready = async {
        tidings_store::wait_for_postgres(&pool, starting, &shutdown).await?;
        let url = &config.nats.nats_url;
        let (subjects, streams) = (&settings.subjects, &settings.streams);
        wait_for_streams(&nats, url, subjects, streams, starting, &shutdown).await
    };
    if ready.await.is_none() {
        tracing::info!("stopped while starting");
        return Ok(());
    }
    probes.starting.done();
    let interval = settings.scan_interval;
    let detector = tidings_detector::scan::Detector::new(pool, js, source, settings);
    if config.once {
        let stats = detector.scan_once(chrono::Utc::now()).await?;
        tracing::info!(?stats, "scan finished");
        return Ok(());
    }
    detector.run(interval, shutdown).await;
    tracing::info!("detector stopped");
    Ok(())
}
