//! Push subscriptions as the pipeline changes them.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Uuid;
use tidings_domain::SubscriptionId;
use tidings_domain::receiver::{Circuit, Pace};
use tidings_domain::sql::Count;

/// Deactivates subscriptions the push service said are gone (404, 410), or whose mailbox the
/// relay refused (a 5xx to RCPT: `mailbox_rejected`).
pub async fn deactivate_gone(
    conn: &mut PgConnection,
    ids: &[SubscriptionId],
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query!(
        "UPDATE push_subscriptions
         SET active = false, deactivated_at = now(),
             deactivation_reason = CASE channel WHEN 'email' THEN $3 ELSE $2 END
         WHERE id = ANY($1) AND active",
        ids as _,
        tidings_domain::subscription::Deactivation::Gone.as_str(),
        tidings_domain::subscription::Deactivation::MailboxRejected.as_str()
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A webhook endpoint's health as stored with it: its circuit breaker and its pace
/// (`tidings_domain::receiver`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Health {
    pub circuit: Circuit,
    pub pace: Pace,
}

/// Locks the active webhook endpoints among `ids` (in id order, so concurrent result batches
/// lock them alike) and reads their health.
pub async fn lock_health(
    conn: &mut PgConnection,
    ids: &[SubscriptionId],
) -> Result<Vec<(SubscriptionId, Health)>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query!(
        r#"SELECT id AS "id: SubscriptionId", consecutive_failures AS "failures: Count",
                  failing_since, circuit_opens AS "opens: Count", circuit_open_until, circuit_probing, pace_per_second, paced_until
           FROM push_subscriptions
           WHERE id = ANY($1) AND channel = 'webhook' AND active
           ORDER BY id FOR UPDATE"#,
        ids as _
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let circuit = Circuit {
                failures: r.failures.0,
                failing_since: r.failing_since,
                opens: r.opens.0,
                open_until: r.circuit_open_until,
                probing: r.circuit_probing,
            };
            let pace = Pace {
                per_second: r.pace_per_second,
                until: r.paced_until,
            };
            (r.id, Health { circuit, pace })
        })
        .collect())
}

/// Writes endpoints' health back. Endpoints in `closed` had their circuit closed: the rows it
/// held (behind a probe, they wait up to a lease) and their retries are released at once,
/// re-checked as ever.
pub async fn write_health(
    conn: &mut PgConnection,
    health: &[(SubscriptionId, Health)],
    closed: &[SubscriptionId],
) -> Result<(), sqlx::Error> {
    if health.is_empty() {
        return Ok(());
    }
    // Counts far past `i32::MAX` failing batches say no more than `i32::MAX` does: the circuit
    // is open either way, so the column's limit is a fine place to stop counting.
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let ids: Vec<Uuid> = health.iter().map(|h| h.0.0).collect();
    let since: Vec<Option<DateTime<Utc>>> =
        health.iter().map(|h| h.1.circuit.failing_since).collect();
    let open_until: Vec<Option<DateTime<Utc>>> =
        health.iter().map(|h| h.1.circuit.open_until).collect();
    let probing: Vec<bool> = health.iter().map(|h| h.1.circuit.probing).collect();
    let failures: Vec<i32> = health.iter().map(|h| count(h.1.circuit.failures)).collect();
    let opens: Vec<i32> = health.iter().map(|h| count(h.1.circuit.opens)).collect();
    let rate: Vec<Option<f64>> = health.iter().map(|h| h.1.pace.per_second).collect();
    let paced: Vec<Option<DateTime<Utc>>> = health.iter().map(|h| h.1.pace.until).collect();
    sqlx::query!(
        "UPDATE push_subscriptions s
         SET consecutive_failures = h.failures, failing_since = h.since, circuit_opens = h.opens,
             circuit_open_until = h.open_until, circuit_probing = h.probing,
             pace_per_second = h.rate, paced_until = h.paced
         FROM UNNEST($1::uuid[], $2::int[], $3::timestamptz[], $4::int[], $5::timestamptz[],
                     $6::bool[], $7::float8[], $8::timestamptz[])
              AS h(id, failures, since, opens, open_until, probing, rate, paced)
         WHERE s.id = h.id",
        &ids,
        &failures,
        since as _,
        &opens,
        open_until as _,
        &probing,
        rate as _,
        paced as _
    )
    .execute(&mut *conn)
    .await?;
    if closed.is_empty() {
        return Ok(());
    }
    // Its rows' retries were backing off from the receiver's outage, not from their own: they
    // are due now too.
    sqlx::query!(
        "UPDATE outbox o
         SET claimed_until = NULL, next_attempt_at = LEAST(o.next_attempt_at, now())
         FROM push_subscriptions s
         WHERE s.id = ANY($1) AND o.device_id = s.device_id
           AND o.status IN ('pending', 'retry') /* status: due */
           AND (o.claimed_until > now() OR o.next_attempt_at > now())",
        closed as _
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks half-open endpoints' probes as out: each circuit is open again until its `until` (so
/// other cycles and replicas hold its rows too), and its next failure is the probe's answer.
/// Only an endpoint still half-open is marked, so of two dispatchers (or workers) that both
/// found it half-open one wins; returns the endpoints whose probe this caller won.
pub async fn probing(
    conn: &mut PgConnection,
    probes: &[(SubscriptionId, DateTime<Utc>)],
) -> Result<Vec<SubscriptionId>, sqlx::Error> {
    if probes.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, until): (Vec<Uuid>, Vec<DateTime<Utc>>) = probes.iter().map(|p| (p.0.0, p.1)).unzip();
    sqlx::query_scalar!(
        r#"UPDATE push_subscriptions s SET circuit_open_until = o.until, circuit_probing = true
           FROM UNNEST($1::uuid[], $2::timestamptz[]) AS o(id, until)
           WHERE s.id = o.id AND s.circuit_opens > 0
             AND NOT COALESCE(s.circuit_open_until > now(), false)
           RETURNING s.id AS "id: SubscriptionId""#,
        &ids,
        &until
    )
    .fetch_all(conn)
    .await
}

/// Paced endpoints' next slots: their rows wait until then. Another dispatcher replica may
/// have taken a slot meanwhile; the later one wins, so the pace errs towards slower.
pub async fn paced(
    conn: &mut PgConnection,
    next: &[(SubscriptionId, DateTime<Utc>)],
) -> Result<(), sqlx::Error> {
    if next.is_empty() {
        return Ok(());
    }
    let (ids, until): (Vec<Uuid>, Vec<DateTime<Utc>>) = next.iter().map(|p| (p.0.0, p.1)).unzip();
    sqlx::query!(
        "UPDATE push_subscriptions s SET paced_until = GREATEST(s.paced_until, o.until)
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS o(id, until)
         WHERE s.id = o.id AND s.pace_per_second IS NOT NULL",
        &ids,
        &until
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Webhook endpoints' health across the deployment, for the dispatcher's gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Unhealthy {
    pub open: i64,
    pub half_open: i64,
    pub paced: i64,
    /// The longest an endpoint with `failures` or more failing batches in a row has failed.
    pub failing_seconds: f64,
    /// The longest an endpoint's breaker has been open or half-open, from its first failure.
    pub open_seconds: f64,
}

/// Reads [`Unhealthy`], counting an endpoint as failing from `failures` failing batches in a
/// row. Only API clients' devices have endpoints, so their partial index finds them.
pub async fn unhealthy(pool: &sqlx::PgPool, failures: u32) -> Result<Unhealthy, sqlx::Error> {
    // A threshold beyond `i32` counts no endpoint as failing, as the largest `i32` would.
    let threshold = i32::try_from(failures.max(1)).unwrap_or(i32::MAX);
    sqlx::query_as!(
        Unhealthy,
        r#"SELECT count(*) FILTER (WHERE s.circuit_open_until > now()) AS "open!",
                  count(*) FILTER (WHERE s.circuit_opens > 0
                                     AND NOT COALESCE(s.circuit_open_until > now(), false))
                      AS "half_open!",
                  count(*) FILTER (WHERE s.pace_per_second IS NOT NULL) AS "paced!",
                  COALESCE(EXTRACT(EPOCH FROM now() - min(s.failing_since)
                               FILTER (WHERE s.consecutive_failures >= $1))::float8, 0)
                      AS "failing_seconds!",
                  COALESCE(EXTRACT(EPOCH FROM now() - min(s.failing_since)
                               FILTER (WHERE s.circuit_opens > 0))::float8, 0)
                      AS "open_seconds!"
           FROM devices d
           JOIN push_subscriptions s ON s.device_id = d.id AND s.active
           WHERE d.client_id IS NOT NULL AND s.channel = 'webhook'"#,
        threshold
    )
    .fetch_one(pool)
    .await
}
