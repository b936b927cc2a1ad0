//! The outbox's undecided work: rows by state, the age of the oldest due row and how long the
//! oldest `sending` row has been past its lease. Each partial index answers its part; terminal
//! states are left out, since counting them would scan the whole history.

use sqlx::PgPool;
use tidings_domain::holding::Held;
use tidings_domain::outbox::Status;

/// One reading of the backlog.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    pub pending: i64,
    pub retry: i64,
    pub sending: i64,
    /// Seconds the oldest due row has waited (0: none).
    pub oldest_due_seconds: f64,
    /// Seconds the oldest `sending` row is past its lease (0: none).
    pub lease_overdue_seconds: f64,
    /// Of the pending and retrying rows, those waiting for their reader's release, by why.
    pub held: Vec<(Held, i64)>,
}

impl Backlog {
    pub fn rows(&self, status: Status) -> i64 {
        match status {
            Status::Pending => self.pending,
            Status::Retry => self.retry,
            Status::Sending => self.sending,
            Status::Sent | Status::Dropped | Status::Failed => 0,
        }
    }
}

/// Reads the backlog in two statements.
pub async fn read(pool: &PgPool) -> Result<Backlog, sqlx::Error> {
    let counts = sqlx::query!(
        r#"SELECT status AS "status!: Status", held AS "held?: Held", count(*) AS "n!",
                  count(*) FILTER (WHERE next_attempt_at > now()) AS "waiting!"
           FROM outbox
           WHERE status IN ('pending', 'retry') /* status: due */
           GROUP BY status, held
           UNION ALL
           SELECT 'sending' /* status: sending */, NULL, count(*), 0 FROM outbox
           WHERE status = 'sending' /* status: sending */"#
    )
    .fetch_all(pool)
    .await?;
    // Both ages in one round trip, each from its partial index.
    let ages = sqlx::query!(
        r#"SELECT
             COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8
                       FROM outbox WHERE status IN ('pending', 'retry') /* status: due */
                         AND next_attempt_at <= now()), 0) AS "oldest!",
             COALESCE((SELECT EXTRACT(EPOCH FROM now() - min(lease_until))::float8
                       FROM outbox WHERE status = 'sending' /* status: sending */
                         AND lease_until < now()), 0) AS "overdue!""#
    )
    .fetch_one(pool)
    .await?;
    let of = |s: Status| counts.iter().filter(|r| r.status == s).map(|r| r.n).sum();
    let held = |h: Held| {
        let rows = counts.iter().filter(|r| r.held == Some(h));
        (h, rows.map(|r| r.waiting).sum())
    };
    Ok(Backlog {
        pending: of(Status::Pending),
        retry: of(Status::Retry),
        sending: of(Status::Sending),
        oldest_due_seconds: ages.oldest,
        lease_overdue_seconds: ages.overdue,
        held: Held::ALL.into_iter().map(held).collect(),
    })
}

/// Rows due for the dispatcher now, and how long the oldest of them has waited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Due {
    pub rows: i64,
    /// Seconds (0: none is due).
    pub oldest_seconds: f64,
}

/// Reads the due backlog in one statement.
pub async fn due(pool: &PgPool) -> Result<Due, sqlx::Error> {
    let due = sqlx::query!(
        r#"SELECT count(*) AS "rows!",
                  COALESCE(EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8, 0)
                      AS "oldest!"
           FROM outbox
           WHERE status IN ('pending', 'retry') /* status: due */ AND next_attempt_at <= now()"#
    )
    .fetch_one(pool)
    .await?;
    Ok(Due {
        rows: due.rows,
        oldest_seconds: due.oldest,
    })
}
