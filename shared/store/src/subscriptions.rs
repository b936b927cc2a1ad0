//! Push subscriptions as the pipeline changes them.

use sqlx::PgConnection;
use tidings_domain::SubscriptionId;

/// Deactivates subscriptions the push service said are gone (404, 410).
pub async fn deactivate_gone(
    conn: &mut PgConnection,
    ids: &[SubscriptionId],
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE push_subscriptions
         SET active = false, deactivated_at = now(), deactivation_reason = 'gone'
         WHERE id = ANY($1) AND active",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// Counts attempts' results on webhook endpoints (other subscriptions are left alone): a
/// delivery closes an endpoint's circuit and clears its count; a batch with failures adds one,
/// however many it holds (one observation of the endpoint, not N failures in a row). Returns
/// the endpoints that failed with their count of failures in a row now, for the caller to open
/// their circuits ([`open_circuits`]).
pub async fn count_webhook_results(
    conn: &mut PgConnection,
    delivered: &[SubscriptionId],
    failed: &[SubscriptionId],
) -> Result<Vec<(SubscriptionId, i32)>, sqlx::Error> {
    if !delivered.is_empty() {
        // A circuit that closes releases the rows it held (behind a probe, they wait up to a
        // lease): they go at once, re-checked as ever.
        sqlx::query(
            "WITH closed AS (
                 UPDATE push_subscriptions SET consecutive_failures = 0, circuit_open_until = NULL
                 WHERE id = ANY($1) AND channel = 'webhook'
                   AND (consecutive_failures > 0 OR circuit_open_until IS NOT NULL)
                 RETURNING device_id)
             UPDATE outbox o SET claimed_until = NULL
             FROM closed c
             WHERE o.device_id = c.device_id AND o.status IN ('pending', 'retry')
               AND o.claimed_until > now()",
        )
        .bind(delivered)
        .execute(&mut *conn)
        .await?;
    }
    if failed.is_empty() {
        return Ok(Vec::new());
    }
    // One row per endpoint, in id order, so concurrent result batches lock them alike.
    sqlx::query_as(
        "UPDATE push_subscriptions s SET consecutive_failures = s.consecutive_failures + 1
         FROM (SELECT DISTINCT id FROM UNNEST($1::uuid[]) AS id ORDER BY id) f
         WHERE s.id = f.id AND s.channel = 'webhook' AND s.active
         RETURNING s.id, s.consecutive_failures",
    )
    .bind(failed)
    .fetch_all(conn)
    .await
}

/// Holds each endpoint's rows back until its time.
pub async fn open_circuits(
    conn: &mut PgConnection,
    open: &[(SubscriptionId, chrono::DateTime<chrono::Utc>)],
) -> Result<(), sqlx::Error> {
    if open.is_empty() {
        return Ok(());
    }
    let (ids, until): (Vec<SubscriptionId>, Vec<chrono::DateTime<chrono::Utc>>) =
        open.iter().copied().unzip();
    sqlx::query(
        "UPDATE push_subscriptions s SET circuit_open_until = o.until
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS o(id, until)
         WHERE s.id = o.id",
    )
    .bind(ids)
    .bind(until)
    .execute(conn)
    .await?;
    Ok(())
}
