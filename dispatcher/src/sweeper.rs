//! The lease sweeper: `sending` rows whose lease ran out with no result go back to `retry`
//! (or `failed` at the cap), recording `lease_expired`.
//!
//! Safe because the lease outlives every push that can still start for the row (config refuses
//! a lease shorter than push deadline + HTTP timeout + margin, and the pusher refuses requests
//! past their deadline). Rows are selected with `FOR UPDATE SKIP LOCKED` and changed by
//! compare-and-set on (status, attempt) in the same transaction, so a result that is being
//! applied right now wins and the sweeper leaves that row alone.

use chrono::Utc;
use sqlx::PgPool;
use std::sync::Arc;
use tidings_shared::OutboxId;
use tidings_shared::outbox::{self, Event, Row, Status};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::transition::{self, Change};

pub const LEASE_EXPIRED: &str = "lease_expired: no push result before the lease ran out";

/// Sweeps one batch; returns how many rows it moved.
pub async fn sweep_once(pool: &PgPool, settings: &Settings) -> Result<usize, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let expired: Vec<(OutboxId, i32, i32)> = sqlx::query_as(
        "SELECT id, attempt, retry_count FROM outbox
         WHERE status = 'sending' AND lease_until < now()
         ORDER BY lease_until
         LIMIT 1000
         FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut changes = Vec::with_capacity(expired.len());
    for (id, attempt, retry_count) in expired {
        let row = Row {
            status: Status::Sending,
            retry_count: u32::try_from(retry_count).unwrap_or(0),
            attempt: u32::try_from(attempt).unwrap_or(0),
        };
        if let Ok(t) = outbox::apply(row, Event::Transient, settings.retry.max_retries) {
            let mut c = Change::new(id, row, t);
            c.last_error = Some(LEASE_EXPIRED.to_owned());
            if t.to == Status::Retry {
                c.next_attempt_at = Some(Utc::now() + settings.retry.delay(row.retry_count, None));
            }
            tracing::warn!(outbox_id = %id, attempt = row.attempt, to = %t.to, "lease expired without a push result");
            changes.push(c);
        }
    }
    let won = transition::apply(&mut tx, &changes).await?;
    tx.commit().await?;
    transition::record(&changes, &won);
    Ok(won.len())
}

pub async fn run(pool: PgPool, settings: Arc<Settings>, shutdown: CancellationToken) {
    loop {
        match sweep_once(&pool, &settings).await {
            Ok(n) if n > 0 => tracing::info!(rows = n, "sweeper moved expired leases to retry"),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "sweep failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
    }
}
