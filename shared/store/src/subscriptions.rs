//! Push subscriptions as the pipeline changes them.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use tidings_domain::SubscriptionId;
use tidings_domain::receiver::{Circuit, Pace};

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
         SET active = false, deactivated_at = now(), deactivation_reason = $2
         WHERE id = ANY($1) AND active",
    )
    .bind(ids)
    .bind(tidings_domain::subscription::Deactivation::Gone)
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

/// Both counts are checked `>= 0` by the schema; a value outside `u32` fails the row's decoding
/// (`try_from`) rather than being bent to fit.
#[derive(sqlx::FromRow)]
struct HealthRow {
    id: SubscriptionId,
    #[sqlx(try_from = "i32")]
    consecutive_failures: u32,
    failing_since: Option<DateTime<Utc>>,
    #[sqlx(try_from = "i32")]
    circuit_opens: u32,
    circuit_open_until: Option<DateTime<Utc>>,
    circuit_probing: bool,
    pace_per_second: Option<f64>,
    paced_until: Option<DateTime<Utc>>,
}

impl HealthRow {
    fn health(&self) -> Health {
        Health {
            circuit: Circuit {
                failures: self.consecutive_failures,
                failing_since: self.failing_since,
                opens: self.circuit_opens,
                open_until: self.circuit_open_until,
                probing: self.circuit_probing,
            },
            pace: Pace {
                per_second: self.pace_per_second,
                until: self.paced_until,
            },
        }
    }
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
    let rows: Vec<HealthRow> = sqlx::query_as(
        "SELECT id, consecutive_failures, failing_since, circuit_opens, circuit_open_until,
                circuit_probing, pace_per_second, paced_until
         FROM push_subscriptions
         WHERE id = ANY($1) AND channel = 'webhook' AND active
         ORDER BY id FOR UPDATE",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.iter().map(|r| (r.id, r.health())).collect())
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
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let ids: Vec<SubscriptionId> = health.iter().map(|h| h.0).collect();
    let since: Vec<Option<DateTime<Utc>>> =
        health.iter().map(|h| h.1.circuit.failing_since).collect();
    let open_until: Vec<Option<DateTime<Utc>>> =
        health.iter().map(|h| h.1.circuit.open_until).collect();
    let probing: Vec<bool> = health.iter().map(|h| h.1.circuit.probing).collect();
    let failures: Vec<i32> = health.iter().map(|h| count(h.1.circuit.failures)).collect();
    let opens: Vec<i32> = health.iter().map(|h| count(h.1.circuit.opens)).collect();
    let rate: Vec<Option<f64>> = health.iter().map(|h| h.1.pace.per_second).collect();
    let paced: Vec<Option<DateTime<Utc>>> = health.iter().map(|h| h.1.pace.until).collect();
    sqlx::query(
        "UPDATE push_subscriptions s
         SET consecutive_failures = h.failures, failing_since = h.since, circuit_opens = h.opens,
             circuit_open_until = h.open_until, circuit_probing = h.probing,
             pace_per_second = h.rate, paced_until = h.paced
         FROM UNNEST($1::uuid[], $2::int[], $3::timestamptz[], $4::int[], $5::timestamptz[],
                     $6::bool[], $7::float8[], $8::timestamptz[])
              AS h(id, failures, since, opens, open_until, probing, rate, paced)
         WHERE s.id = h.id",
    )
    .bind(ids)
    .bind(failures)
    .bind(since)
    .bind(opens)
    .bind(open_until)
    .bind(probing)
    .bind(rate)
    .bind(paced)
    .execute(&mut *conn)
    .await?;
    if closed.is_empty() {
        return Ok(());
    }
    // Its rows' retries were backing off from the receiver's outage, not from their own: they
    // are due now too.
    sqlx::query(
        "UPDATE outbox o
         SET claimed_until = NULL, next_attempt_at = LEAST(o.next_attempt_at, now())
         FROM push_subscriptions s
         WHERE s.id = ANY($1) AND o.device_id = s.device_id AND o.status IN ('pending', 'retry')
           AND (o.claimed_until > now() OR o.next_attempt_at > now())",
    )
    .bind(closed)
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
    let (ids, until): (Vec<SubscriptionId>, Vec<DateTime<Utc>>) = probes.iter().copied().unzip();
    sqlx::query_scalar(
        "UPDATE push_subscriptions s SET circuit_open_until = o.until, circuit_probing = true
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS o(id, until)
         WHERE s.id = o.id AND s.circuit_opens > 0
           AND NOT COALESCE(s.circuit_open_until > now(), false)
         RETURNING s.id",
    )
    .bind(ids)
    .bind(until)
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
    let (ids, until): (Vec<SubscriptionId>, Vec<DateTime<Utc>>) = next.iter().copied().unzip();
    sqlx::query(
        "UPDATE push_subscriptions s SET paced_until = GREATEST(s.paced_until, o.until)
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS o(id, until)
         WHERE s.id = o.id AND s.pace_per_second IS NOT NULL",
    )
    .bind(ids)
    .bind(until)
    .execute(conn)
    .await?;
    Ok(())
}

/// Webhook endpoints' health across the deployment, for the dispatcher's gauges.
#[derive(Clone, Debug, Default, PartialEq, sqlx::FromRow)]
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
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.circuit_open_until > now()) AS open,
                count(*) FILTER (WHERE s.circuit_opens > 0
                                   AND NOT COALESCE(s.circuit_open_until > now(), false))
                    AS half_open,
                count(*) FILTER (WHERE s.pace_per_second IS NOT NULL) AS paced,
                COALESCE(EXTRACT(EPOCH FROM now() - min(s.failing_since)
                             FILTER (WHERE s.consecutive_failures >= $1))::float8, 0)
                    AS failing_seconds,
                COALESCE(EXTRACT(EPOCH FROM now() - min(s.failing_since)
                             FILTER (WHERE s.circuit_opens > 0))::float8, 0) AS open_seconds
         FROM devices d
         JOIN push_subscriptions s ON s.device_id = d.id AND s.active
         WHERE d.client_id IS NOT NULL AND s.channel = 'webhook'",
    )
    .bind(i32::try_from(failures.max(1)).unwrap_or(i32::MAX))
    .fetch_one(pool)
    .await
}
