//! A device's or a watch's notifications counted by state, for the operator routes.

use sqlx::PgPool;
use tidings_domain::outbox::Status;
use tidings_domain::{DeviceId, WatchId};

/// Device `id`'s outbox rows by state.
pub async fn of_device(pool: &PgPool, id: DeviceId) -> Result<Vec<(Status, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT status AS "status: Status", count(*) AS "n!"
           FROM outbox WHERE device_id = $1 GROUP BY status"#,
        id.0
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.status, r.n)).collect())
}

/// Watch `id`'s outbox rows by state.
pub async fn of_watch(pool: &PgPool, id: WatchId) -> Result<Vec<(Status, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT status AS "status: Status", count(*) AS "n!"
           FROM outbox WHERE watch_id = $1 GROUP BY status"#,
        id.0
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.status, r.n)).collect())
}
