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
    /// For a digest's row: the row the digest was sent for (its leader; the leader's own names
    /// itself).
    pub digest_of: Option<OutboxId>,
}

impl Expired {
    /// Whether the row leads a digest, whose other rows follow its outcome.
    pub fn leads(&self) -> bool {
        self.digest_of == Some(self.id)
    }
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
/// transaction holds. A digest's other rows are not among them while their leader is `sending`:
/// they follow it ([`members_of`]). One whose leader moved on without it (a result from a pusher
/// that did not hand the members back) is swept on its own.
pub async fn lock_expired(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<Expired>, sqlx::Error> {
    sqlx::query_as!(
        Expired,
        r#"SELECT id AS "id: OutboxId", dedup_day, attempt AS "attempt: Count",
                  retry_count AS "retry_count: Count",
                  subscription_id AS "subscription_id: SubscriptionId",
                  digest_of AS "digest_of: OutboxId"
           FROM outbox
           WHERE status = 'sending' /* status: sending */ AND lease_until < now()
             AND (digest_of IS NULL OR digest_of = id
                  OR NOT EXISTS (SELECT 1 FROM outbox l WHERE l.id = outbox.digest_of
                                   AND l.status = 'sending' /* status: sending */))
           ORDER BY lease_until
           LIMIT $1
           FOR UPDATE SKIP LOCKED"#,
        limit
    )
    .fetch_all(conn)
    .await
}

/// Locks the `sending` rows the digests `leaders` carry besides their leaders, which the sweeper
/// decides together with them. Marked `sending` with their leader, their leases ran out with
/// its lease.
pub async fn members_of(
    conn: &mut PgConnection,
    leaders: &[OutboxId],
) -> Result<Vec<Expired>, sqlx::Error> {
    if leaders.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<sqlx::types::Uuid> = leaders.iter().map(|l| l.0).collect();
    sqlx::query_as!(
        Expired,
        r#"SELECT id AS "id: OutboxId", dedup_day, attempt AS "attempt: Count",
                  retry_count AS "retry_count: Count",
                  subscription_id AS "subscription_id: SubscriptionId",
                  digest_of AS "digest_of: OutboxId"
           FROM outbox
           WHERE status = 'sending' /* status: sending */ AND lease_until < now()
             AND digest_of = ANY($1) AND digest_of <> id
           ORDER BY id
           FOR UPDATE"#,
        &ids
    )
    .fetch_all(conn)
    .await
}
