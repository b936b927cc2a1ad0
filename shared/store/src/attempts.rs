//! Delivery attempts (migration 0012): one record per attempt, written in the transaction that
//! applies the attempt's result, read by the operator api and a device's history. The attempt
//! that ends a row is recorded on the row ([`crate::transition::Ending`]); earlier ones, whose
//! outcome sent the row back to `retry`, in `outbox_attempts` ([`insert_new`], [`record`]).
//! [`merged`] puts the two together.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgConnection;
use std::sync::LazyLock;
use tidings_domain::messages::AttemptOutcome;
use tidings_domain::outbox::Status;
use tidings_domain::{OutboxId, SubscriptionId};

crate::unnest::unnest_rows! {
    /// One attempt as recorded.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Attempt {
        outbox_id: OutboxId,
        dedup_day: NaiveDate,
        attempt: i32,
        started_at: Option<DateTime<Utc>>,
        subscription_id: Option<SubscriptionId>,
        push_host: Option<String>,
        outcome: AttemptOutcome,
        http_status: Option<i32>,
        error: Option<String>,
        duration_ms: Option<i64>,
        push_message_id: Option<String>,
    }
}

/// The insert of [`Attempt`]s; `then` follows it (a conflict clause).
fn insert_statement(then: &str) -> String {
    format!(
        "INSERT INTO outbox_attempts AS a (outbox_id, dedup_day, attempt, started_at,
             subscription_id, push_host, outcome, http_status, error, duration_ms, push_message_id)
         SELECT outbox_id, dedup_day, attempt, started_at, subscription_id, push_host, outcome,
                http_status, error, duration_ms, push_message_id
         FROM {} {then}",
        Attempt::table("u")
    )
}

static INSERT_NEW: LazyLock<String> = LazyLock::new(|| insert_statement(""));

static RECORD: LazyLock<String> = LazyLock::new(|| {
    insert_statement(
        "ON CONFLICT (outbox_id, dedup_day, attempt) DO UPDATE
         SET started_at = EXCLUDED.started_at, recorded_at = now(),
             subscription_id = COALESCE(EXCLUDED.subscription_id, a.subscription_id),
             push_host = EXCLUDED.push_host, outcome = EXCLUDED.outcome,
             http_status = EXCLUDED.http_status, error = EXCLUDED.error,
             duration_ms = EXCLUDED.duration_ms, push_message_id = EXCLUDED.push_message_id
         WHERE a.outcome = 'lease_expired' AND EXCLUDED.outcome <> 'lease_expired'",
    )
});

async fn insert(
    conn: &mut PgConnection,
    sql: &'static str,
    attempts: &[Attempt],
) -> Result<(), sqlx::Error> {
    if attempts.is_empty() {
        return Ok(());
    }
    Attempt::bind(attempts, sqlx::query(sql))
        .execute(conn)
        .await?;
    Ok(())
}

/// Records attempts that have no record yet, with a plain insert: the first outcome of a row's
/// current attempt, which the caller knows because the row is still `sending` with that attempt
/// under its lock (every record is written in the transaction that moves the row off it).
pub async fn insert_new(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    insert(conn, INSERT_NEW.as_str(), attempts).await
}

/// Records attempts that may be on record already (a late or repeated result): a recorded
/// attempt keeps its record, except a `lease_expired` placeholder, which the attempt's real
/// result replaces.
pub async fn record(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    insert(conn, RECORD.as_str(), attempts).await
}

/// One recorded attempt with when it was recorded.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub attempt: Attempt,
    pub recorded_at: DateTime<Utc>,
}

/// What a row says of the attempt that ended it (migration 0012's columns and its own).
#[derive(Clone, Debug)]
pub struct RowEnding {
    pub id: OutboxId,
    pub dedup_day: NaiveDate,
    pub attempt: i32,
    pub attempt_outcome: Option<AttemptOutcome>,
    pub attempt_started_at: Option<DateTime<Utc>>,
    pub attempt_push_host: Option<String>,
    pub attempt_ms: Option<i64>,
    pub http_status: Option<i32>,
    pub push_message_id: Option<String>,
    pub last_error: Option<String>,
    pub subscription_id: Option<SubscriptionId>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A [`RowEnding`] from a record of a statement that selects its columns (with the overrides
/// that type them: `o.id AS "id: OutboxId"`, `o.attempt_outcome AS "attempt_outcome:
/// AttemptOutcome"`, `o.subscription_id AS "subscription_id: SubscriptionId"`).
macro_rules! row_ending {
    ($r:ident) => {
        RowEnding {
            id: $r.id,
            dedup_day: $r.dedup_day,
            attempt: $r.attempt,
            attempt_outcome: $r.attempt_outcome,
            attempt_started_at: $r.attempt_started_at,
            attempt_push_host: $r.attempt_push_host,
            attempt_ms: $r.attempt_ms,
            http_status: $r.http_status,
            push_message_id: $r.push_message_id,
            last_error: $r.last_error,
            subscription_id: $r.subscription_id,
            finished_at: $r.finished_at,
        }
    };
}

impl RowEnding {
    /// The ending attempt as a record, if an attempt ended the row.
    pub fn attempt(&self) -> Option<Recorded> {
        let outcome = self.attempt_outcome?;
        // `last_error` is "<outcome>: <error>" (or the outcome alone) when this attempt set it; a
        // delivered attempt leaves an earlier attempt's error there.
        let error = (outcome != AttemptOutcome::Delivered)
            .then(|| {
                self.last_error.as_deref().and_then(|e| {
                    e.strip_prefix(outcome.as_str())
                        .map(|rest| rest.trim_start_matches(':').trim().to_owned())
                        .filter(|rest| !rest.is_empty())
                })
            })
            .flatten();
        Some(Recorded {
            attempt: Attempt {
                outbox_id: self.id,
                dedup_day: self.dedup_day,
                attempt: self.attempt,
                started_at: self.attempt_started_at,
                subscription_id: self.subscription_id,
                push_host: self.attempt_push_host.clone(),
                outcome,
                http_status: self.http_status,
                error,
                duration_ms: self.attempt_ms,
                push_message_id: self.push_message_id.clone(),
            },
            recorded_at: self.finished_at.unwrap_or_default(),
        })
    }
}

/// A row's attempts, first to last: the recorded ones, with the row's ending attempt in place
/// of any record of the same attempt (a `lease_expired` placeholder its late result ended).
pub fn merged(mut recorded: Vec<Recorded>, ending: &RowEnding) -> Vec<Recorded> {
    if let Some(last) = ending.attempt() {
        recorded.retain(|r| r.attempt.attempt != last.attempt.attempt);
        recorded.push(last);
    }
    recorded.sort_by_key(|r| r.attempt.attempt);
    recorded
}

/// The recorded attempts (not the rows' ending ones) of rows `ids` of days `days`.
pub async fn recorded<'c, E: sqlx::PgExecutor<'c>>(
    e: E,
    ids: &[OutboxId],
    days: &[NaiveDate],
) -> Result<Vec<Recorded>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT outbox_id AS "outbox_id: OutboxId", dedup_day, attempt, started_at,
                  subscription_id AS "subscription_id: SubscriptionId", push_host,
                  outcome AS "outcome: AttemptOutcome", http_status, error, duration_ms,
                  push_message_id, recorded_at
           FROM outbox_attempts WHERE outbox_id = ANY($1) AND dedup_day = ANY($2)
           ORDER BY outbox_id, attempt"#,
        ids as _,
        days
    )
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Recorded {
            attempt: Attempt {
                outbox_id: r.outbox_id,
                dedup_day: r.dedup_day,
                attempt: r.attempt,
                started_at: r.started_at,
                subscription_id: r.subscription_id,
                push_host: r.push_host,
                outcome: r.outcome,
                http_status: r.http_status,
                error: r.error,
                duration_ms: r.duration_ms,
                push_message_id: r.push_message_id,
            },
            recorded_at: r.recorded_at,
        })
        .collect())
}

/// A row's attempts, first to last, with its traceparent (every attempt continues the row's
/// trace); `None` if there is no such row.
pub async fn of_row(
    pool: &sqlx::PgPool,
    id: OutboxId,
) -> Result<Option<(Vec<Recorded>, Option<String>)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT o.id AS "id: OutboxId", o.dedup_day, o.attempt,
                  o.attempt_outcome AS "attempt_outcome: AttemptOutcome", o.attempt_started_at,
                  o.attempt_push_host, o.attempt_ms, o.http_status, o.push_message_id,
                  o.last_error, o.subscription_id AS "subscription_id: SubscriptionId",
                  o.finished_at, o.traceparent
           FROM outbox o WHERE o.id = $1"#,
        id.0
    )
    .fetch_optional(pool)
    .await?;
    let Some(r) = row else { return Ok(None) };
    let traceparent = r.traceparent.clone();
    let ending = row_ending!(r);
    let found = recorded(pool, &[id], &[ending.dedup_day]).await?;
    Ok(Some((merged(found, &ending), traceparent)))
}

/// How rows `ids` (of days `days`, which prune the read to their partitions) ended, as
/// [`RowEnding`]s.
pub async fn endings<'c, E: sqlx::PgExecutor<'c>>(
    e: E,
    ids: &[OutboxId],
    days: &[NaiveDate],
) -> Result<Vec<RowEnding>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT o.id AS "id: OutboxId", o.dedup_day, o.attempt,
                  o.attempt_outcome AS "attempt_outcome: AttemptOutcome", o.attempt_started_at,
                  o.attempt_push_host, o.attempt_ms, o.http_status, o.push_message_id,
                  o.last_error, o.subscription_id AS "subscription_id: SubscriptionId",
                  o.finished_at
           FROM outbox o WHERE o.id = ANY($1) AND o.dedup_day = ANY($2)"#,
        ids as _,
        days
    )
    .fetch_all(e)
    .await?;
    Ok(rows.into_iter().map(|r| row_ending!(r)).collect())
}

/// One row's attempts, as its device's client lists them.
pub struct RowAttempts {
    pub id: OutboxId,
    pub status: Status,
    /// First to last.
    pub attempts: Vec<Recorded>,
}

/// The attempts of device `device`'s rows that were attempted, newest row first: at most `rows`
/// rows whose ids are below `before` (a page's last id, for the next page).
pub async fn of_device(
    pool: &sqlx::PgPool,
    device: tidings_domain::DeviceId,
    before: Option<OutboxId>,
    rows: i64,
) -> Result<Vec<RowAttempts>, sqlx::Error> {
    let found: Vec<(RowEnding, Status)> = sqlx::query!(
        r#"SELECT o.id AS "id: OutboxId", o.dedup_day, o.attempt,
                  o.attempt_outcome AS "attempt_outcome: AttemptOutcome", o.attempt_started_at,
                  o.attempt_push_host, o.attempt_ms, o.http_status, o.push_message_id,
                  o.last_error, o.subscription_id AS "subscription_id: SubscriptionId",
                  o.finished_at, o.status AS "status: Status"
           FROM outbox o
           WHERE o.device_id = $1 AND ($2::uuid IS NULL OR o.id < $2) AND o.attempt > 0
           ORDER BY o.id DESC LIMIT $3"#,
        device.0,
        before.map(|b| b.0),
        rows
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        let status = r.status;
        (row_ending!(r), status)
    })
    .collect();
    let ids: Vec<OutboxId> = found.iter().map(|r| r.0.id).collect();
    let days: Vec<NaiveDate> = found.iter().map(|r| r.0.dedup_day).collect();
    let mut recorded_of: std::collections::HashMap<OutboxId, Vec<Recorded>> =
        std::collections::HashMap::new();
    for r in recorded(pool, &ids, &days).await? {
        recorded_of.entry(r.attempt.outbox_id).or_default().push(r);
    }
    Ok(found
        .into_iter()
        .map(|(ending, status)| RowAttempts {
            id: ending.id,
            status,
            attempts: merged(recorded_of.remove(&ending.id).unwrap_or_default(), &ending),
        })
        .collect())
}
