//! Tidings in Postgres: the schema ([`schema`], the embedded migrations), the outbox's shared SQL
//! ([`outbox`]: the snapshot columns and status sets; [`transition`]: every state change, as
//! batches of compare-and-sets), row types several services read ([`baselines`]), and
//! connecting: a pool that can be built before the database is up, waiting for it (and for the
//! schema this build needs) at start-up, and the readiness check.
//!
//! **SQL is checked when it compiles.** Statements are `sqlx::query!` (and `query_as!`,
//! `query_scalar!`), checked against the query cache in `shared/store/.sqlx`: the columns they
//! name, their parameters' and results' types and nullability. Changing a statement or a migration:
//! run `deploy/local/stack sqlx prepare` (it migrates a fresh database and rewrites the cache) and
//! commit the cache with the change; CI's `deploy/local/stack sqlx check` fails on a stale one.
//! Three kinds of statement are built at run time instead, each said so where it is: the bulk
//! writes (the `unnest` module: one struct per row, bound field by field), the operators' filters
//! ([`history::deliveries`], [`bulk`]), and rebuilding an index by name
//! ([`schema::repair_indexes`]).

pub mod attempts;
pub mod audit;
pub mod backlog;
pub mod baselines;
pub mod bulk;
pub mod cancel;
pub mod claim;
pub mod counts;
pub mod devices;
pub mod endpoints;
pub mod enqueue;
pub mod history;
pub mod idempotency;
pub mod mailboxes;
mod outbox;
pub mod partitions;
pub mod planner;
pub mod replay;
pub mod rows;
pub mod scan;
pub mod schema;
pub mod shown;
pub mod subscriptions;
pub mod sweep;
pub mod transition;
mod unnest;
pub mod watch_creates;
pub mod watches;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use std::sync::Arc;
use std::time::Duration;
use tidings_runtime::ops::{Check, Starting};
use tidings_runtime::startup::{self, Dependency};
use tokio_util::sync::CancellationToken;

/// A statement that failed, named by what it was doing, e.g. `.map_err(db("claiming rows"))`.
#[derive(Debug, thiserror::Error)]
#[error("database error while {what}: {source}")]
pub struct DbError {
    pub what: &'static str,
    #[source]
    pub source: sqlx::Error,
}

/// `.map_err(db("reading watches"))`: a [`DbError`] that says what was being done.
pub fn db(what: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| DbError { what, source }
}

/// A pooled connection idle at least this long is pinged before it is handed out.
///
/// sqlx pings every connection when it goes back to the pool, and by default again when it is
/// taken out: for the services' loops, which take a connection milliseconds after it was
/// returned, that second round trip is a wake-up of the client and of its Postgres backend per
/// transaction and tells nothing new (docs/benchmarks.md). A connection that has sat idle longer
/// may have been closed behind the pool's back (Postgres restarted, a proxy timed it out), and is
/// still tested, and replaced if it fails, as before. The price: a server that drops connections
/// less than this after their release fails the next statement on each of them once; the pool
/// then discards it (its release ping fails) and the caller's retry gets a new one.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Whether a connection idle for `idle_for` is pinged before it is handed out.
pub fn needs_ping(idle_for: Duration) -> bool {
    idle_for >= PING_IF_IDLE_FOR
}

/// A pool that connects on first use, so it can be built before Postgres is up (only a
/// malformed URL fails here).
pub fn postgres(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if needs_ping(meta.idle_for) {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        // Every acquire is reported (at trace level, which no log shows by default) so the
        // runtime can time pool waits (`tidings_db_pool_acquire_seconds`).
        .acquire_time_level(log::LevelFilter::Trace)
        .connect_lazy(url)?;
    // What the pool holds, read at every scrape (`tidings_db_pool_*`).
    let watched = pool.clone();
    tidings_runtime::metrics::on_scrape(move || {
        let m = tidings_runtime::metrics::metrics();
        let open = i64::from(watched.size());
        // Idle connections are at most the pool's `u32` size, so the fallback is never taken.
        let idle = i64::try_from(watched.num_idle()).unwrap_or(open);
        for (state, n) in [("in_use", open - idle), ("idle", idle)] {
            m.db_pool_connections
                .get_or_create(&tidings_runtime::metrics::StateLabels {
                    state: state.to_owned(),
                })
                .set(n);
        }
        m.db_pool_max
            .set(i64::from(watched.options().get_max_connections()));
    });
    Ok(pool)
}

/// Waits until Postgres accepts a connection with the pool's settings. A connection of its own,
/// not one from the pool: the pool would keep retrying for its whole acquire timeout, hiding
/// the reason (refused, unknown database, bad password) that the log should show.
pub async fn wait_for_postgres(
    pool: &PgPool,
    starting: &Starting,
    shutdown: &CancellationToken,
) -> Option<()> {
    let options = pool.connect_options();
    startup::retry("Postgres (DATABASE_URL)", starting, shutdown, || async {
        let conn = PgConnection::connect_with(&options).await?;
        conn.close().await
    })
    .await
}

/// The readiness check: Postgres answers within 2 s and has the schema this build needs.
pub fn readiness(pool: PgPool) -> Check {
    Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            match tokio::time::timeout(Duration::from_secs(2), schema::check(&pool)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("Postgres did not answer within 2 s".into()),
            }
        })
    })
}

/// Postgres as a start-up dependency: ready while it answers with the schema this build needs;
/// start-up waits until it accepts a connection, then until the schema is there.
pub fn dependency(pool: PgPool) -> Dependency {
    Dependency {
        check: readiness(pool.clone()),
        wait: Box::new(move |starting, shutdown| {
            Box::pin(async move {
                wait_for_postgres(&pool, &starting, &shutdown).await?;
                startup::retry("the database schema", &starting, &shutdown, || {
                    schema::check(&pool)
                })
                .await
                .map(|_| ())
            })
        }),
    }
}
