//! The schema, embedded from `migrations/` so every binary (and the migration Job) carries it,
//! and the check that the database has it.
//!
//! A build needs the highest migration it carries ([`needed`]). Until the database has it (the
//! migration Job has not run yet, or runs right now) a service is not ready: its `/readyz`
//! answers 503 with the reason, the workers' start-up waits, and the api answers its routes
//! with 503 instead of failing on a missing table. A database ahead of the build (a newer
//! release migrated first, during a rolling update) is fine: migrations only add.

use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Apply with [`migrate`] (`tidings-api migrate`), not sqlx's own `run`: it also tolerates a
/// newer release's migrations and builds what a migration leaves to it (invalid indexes rebuilt,
/// partitioned indexes completed). Deployments run it once, not from every replica.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// What [`migrate`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The highest migration this build carries, which the database now has.
    pub version: i64,
    /// Migrations the database had that this build does not know: a newer release applied them
    /// and this one is being rolled back to. They stay; this build runs on them (the rule in
    /// docs/operations.md, "Rolling back": a release's migrations only add what the previous
    /// release can ignore).
    pub newer: Vec<i64>,
}

/// Applies this build's migrations that the database lacks, tolerating migrations newer than the
/// build. sqlx's own `run` refuses those (`VersionMissing`), so the previous release's migrate
/// step would fail and crash-loop every pod it gates after a newer release had run: a rollback
/// would not come up. sqlx takes an advisory lock, so concurrent runs are safe.
pub async fn migrate(
    conn: &mut sqlx::PgConnection,
) -> Result<Migrated, sqlx::migrate::MigrateError> {
    let needed = needed();
    // undefined_table: a new database, nothing applied yet.
    let applied: Vec<i64> =
        sqlx::query_scalar!("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&mut *conn)
            .await
            .or_else(|e| match &e {
                sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => Ok(Vec::new()),
                _ => Err(e),
            })?;
    let applied_is_empty = applied.is_empty();
    let known: std::collections::BTreeSet<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    let newer: Vec<i64> = applied.into_iter().filter(|v| !known.contains(v)).collect();
    if !applied_is_empty {
        accept_rewrites(&mut *conn).await?;
    }
    let tolerant = sqlx::migrate::Migrator {
        migrations: MIGRATOR.migrations.clone(),
        ignore_missing: true,
        ..sqlx::migrate::Migrator::DEFAULT
    };
    tolerant.run(&mut *conn).await?;
    repair_indexes(&mut *conn).await?;
    complete_partitioned_indexes(&mut *conn).await?;
    Ok(Migrated {
        version: needed,
        newer,
    })
}

/// Unreleased migrations rewritten after some databases had applied them, with the SHA-384 of
/// the text they had, so those databases take the new text as the same migration instead of
/// failing sqlx's checksum check. 0019 built its index without `CONCURRENTLY` (blocking writes to
/// `devices` for the build); the rewrite builds the same index without that lock.
const REWRITTEN: &[(i64, &str)] = &[(
    19,
    "ffdea6f896df0ade45923c6110fc8c5ed6c4f95833197f43b2f188ca51b1bea22170addf32be9af33afa4fef8b3df9b1",
)];

async fn accept_rewrites(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    for (version, old) in REWRITTEN {
        let Some(now) = MIGRATOR.iter().find(|m| m.version == *version) else {
            continue;
        };
        sqlx::query!(
            "UPDATE _sqlx_migrations SET checksum = $2 WHERE version = $1 AND checksum = decode($3, 'hex')",
            version,
            &*now.checksum,
            old
        )
        .execute(&mut *conn)
        .await
        .map_err(sqlx::migrate::MigrateError::Execute)?;
    }
    Ok(())
}

/// Rebuilds the schema's invalid indexes: what a `CREATE INDEX CONCURRENTLY` leaves when it is
/// cut short (a lock timeout, a killed pod). Its `IF NOT EXISTS` passes over such an index on the
/// next try, so without this the migration would count as applied with an index Postgres keeps
/// updating but never uses.
pub async fn repair_indexes(
    conn: &mut sqlx::PgConnection,
) -> Result<Vec<String>, sqlx::migrate::MigrateError> {
    let invalid: Vec<String> = sqlx::query_scalar!(
        r#"SELECT format('%I.%I', n.nspname, c.relname) AS "index!" FROM pg_index i
           JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE NOT i.indisvalid AND c.relkind = 'i' AND n.nspname = current_schema()
           ORDER BY 1"#
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(sqlx::migrate::MigrateError::Execute)?;
    for index in &invalid {
        log::warn!("rebuilding {index}: an earlier concurrent build of it was cut short");
        // A quoted identifier from format('%I'), not input: it cannot carry a statement.
        sqlx::raw_sql(&format!("REINDEX INDEX CONCURRENTLY {index}"))
            .execute(&mut *conn)
            .await
            .map_err(sqlx::migrate::MigrateError::Execute)?;
    }
    Ok(invalid)
}

/// A partition's share of a partitioned index it lacks.
struct MissingPart {
    parent: String,
    partition: String,
    /// The partition's index: its bare name to create, qualified to attach.
    name: String,
    qualified: String,
    unique: bool,
    /// From ` USING …` on: the method, keys and predicate, as the parent has them.
    definition: String,
}

/// Completes the schema's partitioned indexes that a migration declared `ON ONLY` (as Postgres
/// builds an index on a partitioned table: in one transaction, blocking every write to it until
/// the end): each partition's index is built `CONCURRENTLY` and attached, one at a time, and the
/// last attach makes the parent valid. A build cut short is an invalid index, which
/// [`repair_indexes`] rebuilds on the next run before this attaches it. Returns what it built.
pub async fn complete_partitioned_indexes(
    conn: &mut sqlx::PgConnection,
) -> Result<Vec<String>, sqlx::migrate::MigrateError> {
    let missing = sqlx::query_as!(
        MissingPart,
        r#"SELECT format('%I.%I', n.nspname, pi.relname) AS "parent!",
                  format('%I.%I', n.nspname, part.relname) AS "partition!",
                  format('%I', name.of) AS "name!",
                  format('%I.%I', n.nspname, name.of) AS "qualified!",
                  i.indisunique AS "unique!",
                  substring(pg_get_indexdef(pi.oid) FROM ' USING .*$') AS "definition!"
           FROM pg_index i
           JOIN pg_class pi ON pi.oid = i.indexrelid AND pi.relkind = 'I'
           JOIN pg_class t ON t.oid = i.indrelid
           JOIN pg_namespace n ON n.oid = pi.relnamespace
           JOIN pg_inherits h ON h.inhparent = t.oid
           JOIN pg_class part ON part.oid = h.inhrelid
           CROSS JOIN LATERAL (SELECT left(part.relname || '_'
                  || regexp_replace(pi.relname, '^' || t.relname || '_', ''), 63) AS of) AS name
           WHERE NOT i.indisvalid AND n.nspname = current_schema()
             AND NOT EXISTS (SELECT 1 FROM pg_inherits hi
                             JOIN pg_index ci ON ci.indexrelid = hi.inhrelid
                             WHERE hi.inhparent = pi.oid AND ci.indrelid = part.oid)
           ORDER BY 1, 2"#
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(sqlx::migrate::MigrateError::Execute)?;
    for m in &missing {
        log::info!("building {} on {} for {}", m.name, m.partition, m.parent);
        let unique = if m.unique { "UNIQUE " } else { "" };
        // Identifiers quoted by format('%I') and the catalog's own definition, not input.
        let build = format!(
            "CREATE {unique}INDEX CONCURRENTLY IF NOT EXISTS {} ON {}{}",
            m.name, m.partition, m.definition
        );
        let attach = format!("ALTER INDEX {} ATTACH PARTITION {}", m.parent, m.qualified);
        for statement in [build, attach] {
            sqlx::raw_sql(&statement)
                .execute(&mut *conn)
                .await
                .map_err(sqlx::migrate::MigrateError::Execute)?;
        }
    }
    Ok(missing.into_iter().map(|m| m.qualified).collect())
}

/// How long `migrate` may wait, so a rollout never stalls writes behind its DDL: a DDL statement
/// queued behind a long transaction blocks every later query on its table for as long as it
/// waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest a statement waits for a lock (the advisory lock that keeps migrations one at
    /// a time included). Past it the migration is rolled back and tried again after a pause, so
    /// the queries queued behind it go on meanwhile.
    pub lock_timeout: Duration,
    /// The longest one statement runs.
    pub statement_timeout: Duration,
    /// Tries stop after this (and a wait for the advisory lock ends with it).
    pub deadline: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateFailed {
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("setting the migration's timeouts: {0}")]
    Timeouts(#[source] sqlx::Error),
    #[error(
        "the migrations did not get their locks within {0:?} (a long transaction holds a table they change): try again when it has ended"
    )]
    Deadline(Duration),
}

/// Whether a migration failed because a lock wait ran out (`lock_not_available`).
fn lock_timed_out(e: &sqlx::migrate::MigrateError) -> bool {
    match e {
        sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(d))
        | sqlx::migrate::MigrateError::ExecuteMigration(sqlx::Error::Database(d), _) => {
            d.code().as_deref() == Some("55P03")
        }
        _ => false,
    }
}

/// [`migrate`] within `limits`: each statement waits at most `lock_timeout` for a lock and runs
/// at most `statement_timeout`; a migration whose lock wait ran out is tried again after 1 s,
/// 2 s, 4 s … (at most 30 s), until `deadline`.
pub async fn migrate_within(
    conn: &mut sqlx::PgConnection,
    limits: Limits,
) -> Result<Migrated, MigrateFailed> {
    let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
    sqlx::query!(
        "SELECT set_config('lock_timeout', $1, false) AS lock,
                set_config('statement_timeout', $2, false) AS statement",
        ms(limits.lock_timeout),
        ms(limits.statement_timeout)
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(MigrateFailed::Timeouts)?;
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_secs(1);
    loop {
        let left = limits.deadline.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, migrate(&mut *conn)).await {
            Err(_) => return Err(MigrateFailed::Deadline(limits.deadline)),
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(e)) if lock_timed_out(&e) && started.elapsed() + pause < limits.deadline => {
                log::warn!(
                    "a migration waited {:?} for a lock and was rolled back; trying again in {pause:?}",
                    limits.lock_timeout
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
            Ok(Err(e)) if lock_timed_out(&e) => {
                return Err(MigrateFailed::Deadline(limits.deadline));
            }
            Ok(Err(e)) => return Err(e.into()),
        }
    }
}

/// The schema version this build needs: its highest migration.
pub fn needed() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the database has no Tidings schema (this build needs migration {needed}): run `tidings-api migrate`"
    )]
    Missing { needed: i64 },
    #[error(
        "the database schema is at migration {found}, this build needs {needed}: run `tidings-api migrate`"
    )]
    Behind { found: i64, needed: i64 },
    #[error("Postgres: {0}")]
    Db(#[from] sqlx::Error),
}

/// The database's schema version if it is at least [`needed`].
pub async fn check(pool: &PgPool) -> Result<i64, SchemaError> {
    let needed = needed();
    let found: Option<i64> =
        sqlx::query_scalar!("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await
            .map_err(|e| match &e {
                // undefined_table: nothing was ever migrated here.
                sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => {
                    SchemaError::Missing { needed }
                }
                _ => SchemaError::Db(e),
            })?;
    match found {
        None => Err(SchemaError::Missing { needed }),
        Some(found) if found < needed => Err(SchemaError::Behind { found, needed }),
        Some(found) => Ok(found),
    }
}

/// [`check`] until it passes once, then nothing: the schema does not go back. For the api,
/// which asks on each request while it is not ready.
#[derive(Clone)]
pub struct Gate {
    pool: PgPool,
    open: Arc<AtomicBool>,
}

impl Gate {
    pub fn new(pool: PgPool) -> Self {
        Gate {
            pool,
            open: Arc::new(AtomicBool::new(false)),
        }
    }

    pub async fn pass(&self) -> Result<(), SchemaError> {
        if self.open.load(Ordering::Relaxed) {
            return Ok(());
        }
        check(&self.pool).await?;
        self.open.store(true, Ordering::Relaxed);
        Ok(())
    }
}
