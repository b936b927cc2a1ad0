//! A device's or a watch's notifications counted by state, for the operator routes.

use sqlx::PgPool;
use tidings_domain::outbox::Status;
use tidings_domain::{DeviceId, WatchId};

/// The outbox rows `$condition` (on `$1`) picks, counted by state.
macro_rules! by_state {
    ($pool:expr, $condition:tt, $id:expr) => {{
        let rows = sqlx::query!(
            r#"SELECT status AS "status: Status", count(*) AS "n!" FROM outbox WHERE "#
                + $condition
                + " GROUP BY status",
            $id
        )
        .fetch_all($pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.status, r.n)).collect())
    }};
}

/// Device `id`'s outbox rows by state.
pub async fn of_device(pool: &PgPool, id: DeviceId) -> Result<Vec<(Status, i64)>, sqlx::Error> {
    by_state!(pool, "device_id = $1", id.0)
}

/// Watch `id`'s outbox rows by state.
pub async fn of_watch(pool: &PgPool, id: WatchId) -> Result<Vec<(Status, i64)>, sqlx::Error> {
    by_state!(pool, "watch_id = $1", id.0)
}
