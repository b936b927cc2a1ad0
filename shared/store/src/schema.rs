//! The schema, embedded from `migrations/` so every binary (and the migration Job) carries it.

/// Apply with `MIGRATOR.run(&pool)`; sqlx takes an advisory lock, so concurrent runs are safe,
/// but deployments run it once from `tidings-api migrate` rather than from every replica.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");
