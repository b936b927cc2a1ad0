//! The Tidings dispatcher: several loops in one binary, each its own module, each safe to run as N
//! replicas at once.
//!
//! - [`ingest`]: EnqueueRequests → outbox rows (batch insert, `ON CONFLICT DO NOTHING`, ack after
//!   commit, undecodable messages dead-lettered), paused by [`admission`] while dispatch is
//!   behind.
//! - [`dispatch`]: claim due rows (`tidings_store::claim`) → pre-guards and re-check ([`plan`], [`recheck`];
//!   pure) → `sending` → PushRequest; rows their reader's quiet hours, cap or digest make wait
//!   go back to the outbox ([`holding`]), and at a reader's digest time its held rows go out
//!   together ([`digest`]).
//! - [`results`]: PushResults → `sent` (baseline advanced in the same transaction), `retry`,
//!   `dropped` or `failed`, as [`resolve`] (pure) decides.
//! - [`sweeper`]: `sending` rows whose lease ran out → `sent` if the delivery log has them,
//!   else `retry` (marked maybe delivered).
//! - [`backlog`]: the outbox backlog as metrics.
//!
//! Every state change goes through `tidings_store::transition::apply`, a batch of
//! compare-and-sets.

pub mod admission;
pub mod backlog;
mod config;
pub mod digest;
pub mod dispatch;
mod holding;
pub mod ingest;
pub mod metrics;
mod plan;
mod recheck;
mod resolve;
pub mod results;
pub mod retention;
mod stage;
pub mod sweeper;

use async_nats::jetstream;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tidings_bus::consume::Handler as _;
use tidings_bus::delivered::DeliveryLog;
use tidings_bus::streams::{StreamError, ensure_streams};
use tidings_domain::subjects::StreamKind;
use tidings_runtime::{ops, startup};
use tidings_source::{SourceConfigError, Sources};
use tokio_util::sync::CancellationToken;

pub use config::{Config, Settings};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("source: {0}")]
    Source(#[from] SourceConfigError),
    #[error(transparent)]
    Streams(#[from] StreamError),
    #[error("ingest: {0}")]
    Ingest(#[from] ingest::IngestError),
    #[error("results: {0}")]
    Results(#[from] results::ResultsError),
    #[error("DATABASE_URL: {0}")]
    DatabaseUrl(#[source] sqlx::Error),
    #[error(transparent)]
    Nats(#[from] tidings_bus::connection::ConnectionError),
}

/// Runs the dispatcher as its binary does: serves the ops endpoint at once, waits for Postgres
/// and NATS (unready, saying why, until they answer), then runs every loop until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), StartError> {
    let settings = config.settings()?;
    let url = config.database.url().map_err(config::ConfigError::from)?;
    let pool = tidings_store::postgres(&url, settings.db_pool).map_err(StartError::DatabaseUrl)?;
    let (nats, bus) = config
        .nats
        .connect(&settings.subjects, tidings_bus::streams::Streams::Create)
        .await?;
    let dependencies = vec![tidings_store::dependency(pool.clone()), bus];
    config.ops.set_stall_bound();
    if startup::start(Some(config.ops.ops_listen), dependencies, &shutdown)
        .await
        .is_none()
    {
        return Ok(());
    }
    let js = jetstream::new(nats);
    let subjects = &settings.subjects;
    tokio::spawn(ops::watch_consumers(
        js.clone(),
        vec![
            (
                subjects.stream(StreamKind::Enqueue),
                ingest::CONSUMER.to_owned(),
            ),
            (
                subjects.stream(StreamKind::Result),
                results::CONSUMER.to_owned(),
            ),
        ],
        Some(subjects.stream(StreamKind::Dlq)),
        Duration::from_secs(10),
        shutdown.clone(),
    ));
    run_with(pool, js, settings, shutdown).await?;
    tracing::info!("dispatcher stopped");
    Ok(())
}

/// How often a dispatcher makes the coming weeks' partitions and drops expired ones.
const RETENTION_INTERVAL: Duration = Duration::from_secs(3600);

/// Creates at 0 the series this service's alerts take the `increase()` of, and the backlog's
/// gauges.
fn init_metrics() {
    use tidings_runtime::metrics::Failure;
    tidings_store::transition::init_metrics();
    backlog::init_metrics();
    tidings_runtime::metrics::metrics().may_fail(&[
        Failure::Dispatch,
        Failure::PublishPush,
        Failure::Sweep,
        Failure::Retention,
    ]);
}

/// The loops beside the notifications' own: retention (with the audit trail's), the lease
/// sweeper (which also makes a lost delivery log again), and operators' redrives of dead letters,
/// asked by the api (which may not publish them).
fn spawn_upkeep(
    tasks: &mut tokio::task::JoinSet<()>,
    pool: &PgPool,
    js: &jetstream::Context,
    settings: &Arc<Settings>,
    shutdown: &CancellationToken,
) {
    let log =
        Arc::new(DeliveryLog::new(js.clone(), &settings.subjects, &settings.streams).creating());
    tasks.spawn(retention::run(
        pool.clone(),
        settings.retention,
        settings.audit_retention,
        RETENTION_INTERVAL,
        shutdown.clone(),
    ));
    tasks.spawn(sweeper::run(
        pool.clone(),
        settings.clone(),
        log,
        shutdown.clone(),
    ));
    tasks.spawn(tidings_bus::redrive::serve(
        js.client(),
        settings.subjects.clone(),
        shutdown.clone(),
    ));
}

/// Runs every loop on connections made elsewhere (tests and benchmarks make their own) until
/// `shutdown`, then lets each finish (and ack) its batch in flight.
pub async fn run_with(
    pool: PgPool,
    js: jetstream::Context,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    settings.validate()?;
    let settings = Arc::new(settings);
    init_metrics();
    ensure_streams(&js, &settings.subjects, &settings.streams).await?;
    let source = Arc::new(Sources::new(settings.source.clone())?);
    let admission = Arc::new(admission::Admission::new(settings.admission_lag));
    metrics::metrics().ingest_admitted.set(1);
    metrics::init_webhook_labels();
    let wake = Arc::new(tokio::sync::Notify::new());
    let ingest = ingest::Ingest::new(pool.clone(), js.clone(), settings.clone())
        .await?
        .with_gate(admission.gate())
        .with_wake(wake.clone());
    let results = results::Results::new(pool.clone(), js.clone(), settings.clone()).await?;

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(backlog::run(
        pool.clone(),
        settings.webhook_breaker.failures,
        std::time::Duration::from_secs(10),
        shutdown.clone(),
    ));
    {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = ingest.run(shutdown).await {
                tracing::error!(error = %e, "ingest stopped");
            }
        });
    }
    {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = results.run(shutdown).await {
                tracing::error!(error = %e, "results stopped");
            }
        });
    }
    let readings = Arc::new(dispatch::PushReadings::default());
    for _ in 0..settings.dispatch_workers {
        let d =
            dispatch::Dispatcher::new(pool.clone(), js.clone(), source.clone(), settings.clone())
                .with_admission(admission.clone())
                .with_wake(wake.clone())
                .with_push_readings(readings.clone());
        let shutdown = shutdown.clone();
        tasks.spawn(async move { d.run(shutdown).await });
    }
    let digests =
        dispatch::Dispatcher::new(pool.clone(), js.clone(), source.clone(), settings.clone());
    let stopping = shutdown.clone();
    tasks.spawn(async move { digests.run_digests(stopping).await });
    spawn_upkeep(&mut tasks, &pool, &js, &settings, &shutdown);
    tracing::info!(
        prefix = settings.subjects.prefix(),
        workers = settings.dispatch_workers,
        "dispatcher running"
    );
    // A loop that stops on its own (its consumer vanished) stops the process, so the
    // orchestrator restarts it rather than leaving half a dispatcher running.
    let _ = tasks.join_next().await;
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    Ok(())
}
