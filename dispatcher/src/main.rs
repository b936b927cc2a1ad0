//! `tidings-dispatcher`: reads config, serves the ops endpoint, waits for Postgres and NATS, runs
//! the loops until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use std::time::Duration;
use tidings_bus::streams::wait_for_streams;
use tidings_domain::subjects::StreamKind;
use tidings_runtime::ops;
use tidings_runtime::ops::OpsArgs;
use tidings_runtime::telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-dispatcher", version, about)]
struct Cli {
    #[command(flatten)]
    config: tidings_dispatcher::Config,
    #[command(flatten)]
    ops: OpsArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = Telemetry::init("tidings-dispatcher");
    let cli = Cli::parse();
    let config = cli.config;
    let settings = config.settings().context("invalid configuration")?;
    let connections =
        u32::try_from(settings.dispatch_workers + 2 * settings.consumer_concurrency + 2)
            .unwrap_or(16);
    let pool =
        tidings_store::postgres(&config.database_url, connections).context("DATABASE_URL")?;
    let nats = tidings_runtime::startup::nats(&config.nats.nats_url)
        .await
        .with_context(|| format!("NATS_URL {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats.clone());

    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_runtime::signals::cancel_on_signal(shutdown.clone()));
    let probes = ops::Probes::default()
        .with_check(tidings_store::readiness(pool.clone()))
        .with_nats(nats.clone());
    ops::spawn(cli.ops.ops_listen, probes.clone(), shutdown.clone());
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
    let subjects = &settings.subjects;
    tokio::spawn(ops::watch_consumers(
        js.clone(),
        vec![
            (
                subjects.stream(StreamKind::Enqueue),
                tidings_dispatcher::ingest::CONSUMER.to_owned(),
            ),
            (
                subjects.stream(StreamKind::Result),
                tidings_dispatcher::results::CONSUMER.to_owned(),
            ),
        ],
        Duration::from_secs(10),
        shutdown.clone(),
    ));
    tidings_dispatcher::run(pool, js, settings, shutdown).await?;
    tracing::info!("dispatcher stopped");
    Ok(())
}
