//! Delivery attempts (migration 0012): one record per attempt, written in the transaction that
//! applies the attempt's result, read by the operator api and a device's history. The attempt
//! that ends a row is recorded on the row ([`crate::transition::Ending`]); earlier ones, whose
//! outcome sent the row back to `retry`, in `outbox_attempts` ([`insert_new`], [`record`]).
//! [`merged`] puts the two together.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgConnection;
use tidings_domain::messages::AttemptOutcome;
use tidings_domain::{OutboxId, SubscriptionId};

/// One attempt as recorded.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Attempt {
    pub outbox_id: OutboxId,
    pub dedup_day: NaiveDate,
    pub attempt: i32,
    pub started_at: Option<DateTime<Utc>>,
    pub subscription_id: Option<SubscriptionId>,
    pub push_host: Option<String>,
    pub outcome: AttemptOutcome,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub push_message_id: Option<String>,
}

fn col<'a, T>(attempts: &'a [Attempt], f: impl Fn(&'a Attempt) -> T) -> Vec<T> {
    attempts.iter().map(f).collect()
}

/// The insert's columns, from `$1`…`$11` as an `UNNEST`.
macro_rules! insert_attempts {
    () => {
        "INSERT INTO outbox_attempts AS a (outbox_id, dedup_day, attempt, started_at,
             subscription_id, push_host, outcome, http_status, error, duration_ms, push_message_id)
         SELECT * FROM UNNEST($1::uuid[], $2::date[], $3::int[], $4::timestamptz[], $5::uuid[],
             $6::text[], $7::text[], $8::int[], $9::text[], $10::bigint[], $11::text[])"
    };
}

async fn insert(
    conn: &mut PgConnection,
    sql: &str,
    attempts: &[Attempt],
) -> Result<(), sqlx::Error> {
    if attempts.is_empty() {
        return Ok(());
    }
    sqlx::query(sql)
        .bind(col(attempts, |a| a.outbox_id))
        .bind(col(attempts, |a| a.dedup_day))
        .bind(col(attempts, |a| a.attempt))
        .bind(col(attempts, |a| a.started_at))
        .bind(col(attempts, |a| a.subscription_id))
        .bind(col(attempts, |a| a.push_host.as_deref()))
        .bind(col(attempts, |a| a.outcome.as_str()))
        .bind(col(attempts, |a| a.http_status))
        .bind(col(attempts, |a| a.error.as_deref()))
        .bind(col(attempts, |a| a.duration_ms))
        .bind(col(attempts, |a| a.push_message_id.as_deref()))
        .execute(conn)
        .await?;
    Ok(())
}

/// Records attempts that have no record yet, with a plain insert: the first outcome of a row's
/// current attempt, which the caller knows because the row is still `sending` with that attempt
/// under its lock (every record is written in the transaction that moves the row off it).
pub async fn insert_new(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    insert(conn, insert_attempts!(), attempts).await
}

/// Records attempts that may be on record already (a late or repeated result): a recorded
/// attempt keeps its record, except a `lease_expired` placeholder, which the attempt's real
/// result replaces.
pub async fn record(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    insert(
        conn,
        concat!(
            insert_attempts!(),
            " ON CONFLICT (outbox_id, dedup_day, attempt) DO UPDATE
             SET started_at = EXCLUDED.started_at, recorded_at = now(),
                 subscription_id = COALESCE(EXCLUDED.subscription_id, a.subscription_id),
                 push_host = EXCLUDED.push_host, outcome = EXCLUDED.outcome,
                 http_status = EXCLUDED.http_status, error = EXCLUDED.error,
                 duration_ms = EXCLUDED.duration_ms, push_message_id = EXCLUDED.push_message_id
             WHERE a.outcome = 'lease_expired' AND EXCLUDED.outcome <> 'lease_expired'"
        ),
        attempts,
    )
    .await
}

/// One recorded attempt with when it was recorded.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Recorded {
    #[sqlx(flatten)]
    pub attempt: Attempt,
    pub recorded_at: DateTime<Utc>,
}

/// What a row says of the attempt that ended it (migration 0012's columns and its own).
#[derive(Clone, Debug, sqlx::FromRow)]
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

/// The row's columns [`RowEnding`] reads, with the outbox as `o`.
pub const ROW_ENDING_COLUMNS: &str = "o.id, o.dedup_day, o.attempt, o.attempt_outcome, \
     o.attempt_started_at, o.attempt_push_host, o.attempt_ms, o.http_status, o.push_message_id, \
     o.last_error, o.subscription_id, o.finished_at";

impl RowEnding {
    /// The ending attempt as a record, if an attempt ended the row.
    pub fn record(&self) -> Option<Recorded> {
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
    if let Some(last) = ending.record() {
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
    sqlx::query_as(
        "SELECT outbox_id, dedup_day, attempt, started_at, subscription_id, push_host, outcome,
                http_status, error, duration_ms, push_message_id, recorded_at
         FROM outbox_attempts WHERE outbox_id = ANY($1) AND dedup_day = ANY($2)
         ORDER BY outbox_id, attempt",
    )
    .bind(ids)
    .bind(days)
    .fetch_all(e)
    .await
}

/// A row's attempts, first to last, with its traceparent (every attempt continues the row's
/// trace); `None` if there is no such row.
pub async fn of_row(
    pool: &sqlx::PgPool,
    id: OutboxId,
) -> Result<Option<(Vec<Recorded>, Option<String>)>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        ending: RowEnding,
        traceparent: Option<String>,
    }
    let row: Option<Row> = sqlx::query_as(&format!(
        "SELECT {ROW_ENDING_COLUMNS}, o.traceparent FROM outbox o WHERE o.id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let found = recorded(pool, &[id], &[row.ending.dedup_day]).await?;
    Ok(Some((merged(found, &row.ending), row.traceparent)))
}

/// How rows `ids` (of days `days`, which prune the read to their partitions) ended, as
/// [`RowEnding`]s.
pub async fn endings<'c, E: sqlx::PgExecutor<'c>>(
    e: E,
    ids: &[OutboxId],
    days: &[NaiveDate],
) -> Result<Vec<RowEnding>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {ROW_ENDING_COLUMNS} FROM outbox o WHERE o.id = ANY($1) AND o.dedup_day = ANY($2)"
    ))
    .bind(ids)
    .bind(days)
    .fetch_all(e)
    .await
}

/// One row's attempts, as its device's client lists them.
pub struct RowAttempts {
    pub id: OutboxId,
    pub status: tidings_domain::outbox::Status,
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
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        ending: RowEnding,
        status: tidings_domain::outbox::Status,
    }
    let found: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {ROW_ENDING_COLUMNS}, o.status FROM outbox o
         WHERE o.device_id = $1 AND ($2::uuid IS NULL OR o.id < $2) AND o.attempt > 0
         ORDER BY o.id DESC LIMIT $3"
    ))
    .bind(device)
    .bind(before)
    .bind(rows)
    .fetch_all(pool)
    .await?;
    let ids: Vec<OutboxId> = found.iter().map(|r| r.ending.id).collect();
    let days: Vec<NaiveDate> = found.iter().map(|r| r.ending.dedup_day).collect();
    let mut recorded_of: std::collections::HashMap<OutboxId, Vec<Recorded>> =
        std::collections::HashMap::new();
    for r in recorded(pool, &ids, &days).await? {
        recorded_of.entry(r.attempt.outbox_id).or_default().push(r);
    }
    Ok(found
        .into_iter()
        .map(|r| RowAttempts {
            id: r.ending.id,
            status: r.status,
            attempts: merged(
                recorded_of.remove(&r.ending.id).unwrap_or_default(),
                &r.ending,
            ),
        })
        .collect())
}
