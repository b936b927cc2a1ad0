//! `tidings-dispatcher`: reads config, serves the ops endpoint, waits for Postgres and NATS, runs
//! the loops until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use std::time::Duration;
use tidings_shared::service::OpsArgs;
use tidings_shared::subjects::StreamKind;
use tidings_shared::telemetry::Telemetry;
use tidings_shared::{ops, startup};
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
    let pool = startup::postgres(&config.database_url, connections).context("DATABASE_URL")?;
    let nats = startup::nats(&config.nats.nats_url)
        .await
        .with_context(|| format!("NATS_URL {}", config.nats.nats_url))?;
    let js = async_nats::jetstream::new(nats.clone());

    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_shared::service::cancel_on_signal(shutdown.clone()));
    let probes = ops::Probes {
        pool: Some(pool.clone()),
        nats: Some(nats.clone()),
        ..Default::default()
    };
    ops::spawn(cli.ops.ops_listen, probes.clone(), shutdown.clone());
    let ready = startup::wait_for_dependencies(
        &probes,
        &config.nats.nats_url,
        &settings.subjects,
        &settings.streams,
        &shutdown,
    );
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
