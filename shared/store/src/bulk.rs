//! Selecting the rows of an operator's bulk replay or cancel: counting and sampling what a
//! filter matches, and locking one batch of it. The changes themselves go through
//! [`crate::replay`] and [`crate::cancel`], like a single row's. These statements are built at
//! run time (not checked when they compile), since the filter decides their conditions.

use crate::history::Filter;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::{PgConnection, PgPool, Postgres, QueryBuilder};
use tidings_domain::outbox::{Reason, Status};
use tidings_domain::{DeviceId, OutboxId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Replay,
    Cancel,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Replay => "replay",
            Operation::Cancel => "cancel",
        }
    }

    /// SQL deciding whether row `o` is one this operation changes.
    fn eligible(self) -> &'static str {
        match self {
            Operation::Replay => concat!(
                "o.status IN ",
                crate::status_sql!(replayable),
                " AND o.replay_of IS NULL
                 AND NOT EXISTS (SELECT 1 FROM outbox r WHERE r.replay_of = o.id AND r.dedup_day = o.dedup_day)"
            ),
            Operation::Cancel => concat!("o.status IN ", crate::status_sql!(cancellable)),
        }
    }
}

/// `select` over the rows `filter` matches that are older than `up_to`.
fn matching<'a>(select: &str, filter: &Filter, up_to: OutboxId) -> QueryBuilder<'a, Postgres> {
    let mut q = QueryBuilder::new(select);
    q.push(" FROM outbox o LEFT JOIN watches w ON w.id = o.watch_id WHERE o.id < ");
    q.push_bind(up_to);
    filter.push(&mut q);
    q
}

/// How many rows `filter` matches below `up_to`, and how many of them `op` would change.
pub async fn count(
    pool: &PgPool,
    op: Operation,
    filter: &Filter,
    up_to: OutboxId,
) -> Result<(i64, i64), sqlx::Error> {
    let select = format!("SELECT count(*), count(*) FILTER (WHERE {})", op.eligible());
    matching(&select, filter, up_to)
        .build_query_as()
        .fetch_one(pool)
        .await
}

/// A matching row, as a dry run samples it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Sampled {
    pub id: OutboxId,
    pub status: Status,
    pub reason: Option<Reason>,
    pub item_code: Option<String>,
    pub device_id: DeviceId,
    pub detected_at: DateTime<Utc>,
    pub http_status: Option<i32>,
    pub replay_of: Option<OutboxId>,
}

/// Up to 10 of the rows `op` would change, oldest first.
pub async fn sample(
    pool: &PgPool,
    op: Operation,
    filter: &Filter,
    up_to: OutboxId,
) -> Result<Vec<Sampled>, sqlx::Error> {
    let mut q = matching(
        "SELECT o.id, o.status, o.reason, w.item_code, o.device_id, o.detected_at,
                o.http_status, o.replay_of",
        filter,
        up_to,
    );
    q.push(" AND ")
        .push(op.eligible())
        .push(" ORDER BY o.id LIMIT 10");
    q.build_query_as().fetch_all(pool).await
}

/// A row a batch looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Candidate {
    pub id: OutboxId,
    pub dedup_day: NaiveDate,
    pub is_replay: bool,
    pub replayed: bool,
    /// Whether the operation changes it.
    pub eligible: bool,
}

/// The batch of matching rows after `cursor`, in id order, locked in `conn`'s transaction so a
/// dispatcher's claim or a concurrent bulk call cannot interleave.
pub async fn lock_batch(
    conn: &mut PgConnection,
    op: Operation,
    filter: &Filter,
    up_to: OutboxId,
    cursor: Option<OutboxId>,
    batch: i64,
) -> Result<Vec<Candidate>, sqlx::Error> {
    let select = format!(
        "SELECT o.id, o.dedup_day, o.replay_of IS NOT NULL AS is_replay,
                EXISTS (SELECT 1 FROM outbox r WHERE r.replay_of = o.id AND r.dedup_day = o.dedup_day)
                    AS replayed,
                {} AS eligible",
        op.eligible()
    );
    let mut q = matching(&select, filter, up_to);
    if let Some(c) = cursor {
        q.push(" AND o.id > ").push_bind(c);
    }
    q.push(" ORDER BY o.id LIMIT ")
        .push_bind(batch)
        .push(" FOR UPDATE OF o");
    q.build_query_as().fetch_all(conn).await
}
