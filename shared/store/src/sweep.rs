//! The lease sweeper's read: `sending` rows whose lease ran out, locked so that concurrent
//! sweepers take disjoint rows.

use chrono::NaiveDate;
use sqlx::PgConnection;
use tidings_domain::outbox::{Row, Status};
use tidings_domain::sql::Count;
use tidings_domain::{OutboxId, SubscriptionId};

/// A `sending` row past its lease.
#[derive(Debug)]
pub struct Expired {
    pub id: OutboxId,
    pub dedup_day: NaiveDate,
    pub attempt: u32,
    pub retry_count: u32,
    pub subscription_id: Option<SubscriptionId>,
}

impl Expired {
    /// The row as the state machine sees it.
    pub fn row(&self) -> Row {
        Row {
            status: Status::Sending,
            retry_count: self.retry_count,
            attempt: self.attempt,
        }
    }
}

/// Locks up to `limit` expired `sending` rows, the longest expired first, skipping rows another
/// transaction holds.
pub async fn lock_expired(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<Expired>, sqlx::Error> {
    sqlx::query_as!(
        Expired,
        r#"SELECT id AS "id: OutboxId", dedup_day, attempt AS "attempt: Count",
                  retry_count AS "retry_count: Count",
                  subscription_id AS "subscription_id: SubscriptionId"
           FROM outbox
           WHERE status = 'sending' /* status: sending */ AND lease_until < now()
           ORDER BY lease_until
           LIMIT $1
           FOR UPDATE SKIP LOCKED"#,
        limit
    )
    .fetch_all(conn)
    .await
}
