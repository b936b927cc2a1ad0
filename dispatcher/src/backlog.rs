//! The outbox backlog as gauges: non-terminal rows by state, the age of the oldest due row and
//! how long the oldest `sending` row has been past its lease.
//! Terminal states are counted by `tidings_outbox_transitions_total` instead: counting them
//! here would scan the whole history.

use sqlx::PgPool;
use std::time::Duration;
use tidings_domain::outbox::Status;
use tidings_runtime::metrics::{StatusLabels, metrics};
use tokio_util::sync::CancellationToken;

/// Reads the backlog once (each partial index answers its part) and sets the gauges.
pub async fn measure(pool: &PgPool) -> Result<(), sqlx::Error> {
    let counts: Vec<(String, i64)> = sqlx::query_as(concat!(
        "SELECT status, count(*) FROM outbox WHERE status IN ",
        tidings_store::status_sql!(due),
        " GROUP BY status
         UNION ALL
         SELECT ",
        tidings_store::status_sql!(sending),
        ", count(*) FROM outbox WHERE status = ",
        tidings_store::status_sql!(sending),
    ))
    .fetch_all(pool)
    .await?;
    // Both ages in one round trip, each from its partial index.
    let (oldest, overdue): (f64, f64) = sqlx::query_as(concat!(
        "SELECT
           COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8
                     FROM outbox WHERE status IN ",
        tidings_store::status_sql!(due),
        " AND next_attempt_at <= now()), 0),
           COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(lease_until))::float8
                     FROM outbox WHERE status = ",
        tidings_store::status_sql!(sending),
        " AND lease_until < now()), 0)",
    ))
    .fetch_one(pool)
    .await?;
    let m = metrics();
    for status in [Status::Pending, Status::Retry, Status::Sending] {
        let n = counts
            .iter()
            .find(|(s, _)| s == status.as_str())
            .map_or(0, |(_, n)| *n);
        m.outbox_rows
            .get_or_create(&StatusLabels {
                status: status.as_str().to_owned(),
            })
            .set(n);
    }
    m.oldest_due_seconds.set(oldest);
    m.lease_overdue_seconds.set(overdue);
    Ok(())
}

/// Measures every `every` until `shutdown`.
pub async fn run(pool: PgPool, every: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = measure(&pool).await {
            tracing::warn!(error = %e, "measuring the outbox backlog failed");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}
