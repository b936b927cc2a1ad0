//! Delivery attempts (migration 0012): one record per attempt, written in the transaction that
//! applies the attempt's result, read by the operator api and a device's history.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgConnection;
use tidings_domain::{OutboxId, SubscriptionId};

/// The outcome the lease sweeper records for an attempt that produced no result.
pub const LEASE_EXPIRED: &str = "lease_expired";

/// One attempt as recorded.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Attempt {
    pub outbox_id: OutboxId,
    pub dedup_day: NaiveDate,
    pub attempt: i32,
    pub started_at: Option<DateTime<Utc>>,
    pub subscription_id: Option<SubscriptionId>,
    pub push_host: Option<String>,
    pub outcome: String,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub push_message_id: Option<String>,
    pub trace_id: Option<String>,
}

/// Records `attempts` in one statement. An attempt already on record keeps its record (a
/// duplicate result changes nothing), except a `lease_expired` placeholder, which the attempt's
/// real result replaces when it turns up late.
pub async fn record(conn: &mut PgConnection, attempts: &[Attempt]) -> Result<(), sqlx::Error> {
    if attempts.is_empty() {
        return Ok(());
    }
    fn col<T>(attempts: &[Attempt], f: impl Fn(&Attempt) -> T) -> Vec<T> {
        attempts.iter().map(f).collect()
    }
    sqlx::query(
        "INSERT INTO outbox_attempts AS a (outbox_id, dedup_day, attempt, started_at,
             subscription_id, push_host, outcome, http_status, error, duration_ms, push_message_id,
             trace_id)
         SELECT * FROM UNNEST($1::uuid[], $2::date[], $3::int[], $4::timestamptz[], $5::uuid[],
             $6::text[], $7::text[], $8::int[], $9::text[], $10::bigint[], $11::text[], $12::text[])
         ON CONFLICT (outbox_id, dedup_day, attempt) DO UPDATE
         SET started_at = EXCLUDED.started_at, recorded_at = now(),
             subscription_id = COALESCE(EXCLUDED.subscription_id, a.subscription_id),
             push_host = EXCLUDED.push_host, outcome = EXCLUDED.outcome,
             http_status = EXCLUDED.http_status, error = EXCLUDED.error,
             duration_ms = EXCLUDED.duration_ms, push_message_id = EXCLUDED.push_message_id,
             trace_id = COALESCE(EXCLUDED.trace_id, a.trace_id)
         WHERE a.outcome = 'lease_expired' AND EXCLUDED.outcome <> 'lease_expired'",
    )
    .bind(col(attempts, |a| a.outbox_id))
    .bind(col(attempts, |a| a.dedup_day))
    .bind(col(attempts, |a| a.attempt))
    .bind(col(attempts, |a| a.started_at))
    .bind(col(attempts, |a| a.subscription_id))
    .bind(col(attempts, |a| a.push_host.clone()))
    .bind(col(attempts, |a| a.outcome.clone()))
    .bind(col(attempts, |a| a.http_status))
    .bind(col(attempts, |a| a.error.clone()))
    .bind(col(attempts, |a| a.duration_ms))
    .bind(col(attempts, |a| a.push_message_id.clone()))
    .bind(col(attempts, |a| a.trace_id.clone()))
    .execute(conn)
    .await?;
    Ok(())
}

/// A row's attempts, first to last, with when each was recorded.
pub async fn of_row<'c, E: sqlx::PgExecutor<'c>>(
    e: E,
    id: OutboxId,
) -> Result<Vec<(Attempt, DateTime<Utc>)>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Recorded {
        #[sqlx(flatten)]
        attempt: Attempt,
        recorded_at: DateTime<Utc>,
    }
    let rows: Vec<Recorded> = sqlx::query_as(
        "SELECT outbox_id, dedup_day, attempt, started_at, subscription_id, push_host, outcome,
                http_status, error, duration_ms, push_message_id, trace_id, recorded_at
         FROM outbox_attempts WHERE outbox_id = $1 ORDER BY attempt",
    )
    .bind(id)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.attempt, r.recorded_at))
        .collect())
}
