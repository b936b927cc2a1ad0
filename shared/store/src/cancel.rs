//! An operator's cancel. Due rows end `dropped`/`cancelled` through the same compare-and-set as
//! every other state change ([`crate::transition`]), so the claim lease is cleared, the change is
//! counted, and the state machine decides which rows may be cancelled.

use crate::transition::{self, Change};
use crate::{DbError, db};
use chrono::NaiveDate;
use sqlx::PgConnection;
use sqlx::types::Uuid;
use std::collections::HashSet;
use tidings_domain::OutboxId;
use tidings_domain::outbox::{self, Event, Row, Status};
use tidings_domain::sql::Count;

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error(transparent)]
    Db(#[from] DbError),
}

/// What a cancel changed. Count it with [`Cancelled::observe`] once the transaction commits.
#[derive(Debug, Default)]
pub struct Cancelled {
    changes: Vec<Change>,
    pub won: HashSet<OutboxId>,
}

impl Cancelled {
    pub fn count(&self) -> u64 {
        self.won.len() as u64
    }

    /// Counts the cancelled rows in `tidings_outbox_transitions_total`.
    pub fn observe(&self) {
        transition::observe(&self.changes, &self.won);
    }
}

/// Ends each of `rows` (id and dedup day) that is still pending or retrying as
/// `dropped`/`cancelled`. A row that is `sending` (a push may be out) or has ended is left as it
/// is, also when it got there after it was read.
pub async fn cancel(
    conn: &mut PgConnection,
    rows: &[(OutboxId, NaiveDate)],
) -> Result<Cancelled, CancelError> {
    let ids: Vec<Uuid> = rows.iter().map(|r| r.0.0).collect();
    let days: Vec<NaiveDate> = rows.iter().map(|r| r.1).collect();
    let found = sqlx::query!(
        r#"SELECT o.id AS "id: OutboxId", o.dedup_day, o.status AS "status: Status",
                  o.retry_count AS "retry_count: Count", o.attempt AS "attempt: Count"
           FROM outbox o JOIN UNNEST($1::uuid[], $2::date[]) AS u(id, day)
             ON o.id = u.id AND o.dedup_day = u.day"#,
        &ids,
        &days
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("reading outbox rows to cancel"))?;
    let mut changes = Vec::new();
    for r in found {
        let (id, day) = (r.id, r.dedup_day);
        let row = Row {
            status: r.status,
            retry_count: r.retry_count.0,
            attempt: r.attempt.0,
        };
        // The state machine refuses a cancel of a row whose push may be out or that has ended.
        if let Ok(t) = outbox::apply(row, Event::Cancelled, u32::MAX) {
            let mut change = Change::new(id, day, row, t);
            change.last_error = Some("cancelled by an operator".to_owned());
            changes.push(change);
        }
    }
    let won = apply(conn, &changes)
        .await
        .map_err(db("cancelling outbox rows"))?;
    Ok(Cancelled { changes, won })
}

/// Writes cancels by compare-and-set on state and attempt, setting only the columns the api's
/// role may update (migrations 0013 and 0022: status, reason, last_error, finished_at and the
/// claim), not the whole transition `transition::apply` writes. Regression: through it, every operator cancel failed
/// with "permission denied for table outbox" wherever the api runs as its own role.
async fn apply(
    conn: &mut PgConnection,
    changes: &[Change],
) -> Result<std::collections::HashSet<OutboxId>, sqlx::Error> {
    if changes.is_empty() {
        return Ok(Default::default());
    }
    let ids: Vec<Uuid> = changes.iter().map(|c| c.id.0).collect();
    let days: Vec<NaiveDate> = changes.iter().map(|c| c.day).collect();
    let from: Vec<&str> = changes.iter().map(|c| c.from.as_str()).collect();
    // An attempt beyond `i32` matches no stored row (the schema's column is an `int`), so the
    // saturated value loses the race as it should.
    let attempts: Vec<i32> = (changes.iter())
        .map(|c| i32::try_from(c.from_attempt).unwrap_or(i32::MAX))
        .collect();
    let errors: Vec<Option<&str>> = changes.iter().map(|c| c.last_error.as_deref()).collect();
    let won = sqlx::query_scalar!(
        r#"UPDATE outbox o
           SET status = 'dropped', reason = 'cancelled', last_error = u.error,
               finished_at = now(), claimed_until = NULL
           FROM UNNEST($1::uuid[], $2::date[], $3::text[], $4::int[], $5::text[])
                AS u(id, day, from_status, from_attempt, error)
           WHERE o.id = u.id AND o.dedup_day = u.day
             AND o.status = u.from_status AND o.attempt = u.from_attempt
           RETURNING o.id AS "id: OutboxId""#,
        &ids,
        &days,
        &from as _,
        &attempts,
        errors as _
    )
    .fetch_all(conn)
    .await?;
    Ok(won.into_iter().collect())
}
