//! A device's or a watch's notifications counted by state, for the operator routes.

use sqlx::PgPool;
use tidings_domain::outbox::Status;
use tidings_domain::{DeviceId, WatchId};

/// Device `id`'s outbox rows by state.
pub async fn of_device(pool: &PgPool, id: DeviceId) -> Result<Vec<(Status, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT status, count(*) FROM outbox WHERE device_id = $1 GROUP BY status")
        .bind(id)
        .fetch_all(pool)
        .await
}

/// Watch `id`'s outbox rows by state.
pub async fn of_watch(pool: &PgPool, id: WatchId) -> Result<Vec<(Status, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT status, count(*) FROM outbox WHERE watch_id = $1 GROUP BY status")
        .bind(id)
        .fetch_all(pool)
        .await
}
