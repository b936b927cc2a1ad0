//! Ingest's write: EnqueueRequests become pending outbox rows, one statement per batch, a
//! duplicate of the dedup key changing nothing.

use sqlx::PgPool;
use tidings_domain::OutboxId;
use tidings_domain::messages::EnqueueRequest;

/// Inserts a batch; returns how many rows were new (the rest were duplicates of the dedup key).
pub async fn insert(
    pool: &PgPool,
    requests: &[(&EnqueueRequest, Option<String>)],
) -> Result<usize, sqlx::Error> {
    let result = sqlx::query(concat!(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day, ",
        crate::snapshot_columns!(),
        ", traceparent, withdraws)
         SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::date[],
                              $7::timestamptz[], $8::bigint[], $9::text[], $10::bool[], $11::bool[],
                              $12::timestamptz[], $13::bigint[], $14::bigint[], $15::bool[], $16::text[],
                              $17::uuid[])
         ON CONFLICT (watch_id, trigger, dedup_day, channel) WHERE replay_of IS NULL DO NOTHING",
    ))
    .bind(requests.iter().map(|_| OutboxId::new()).collect::<Vec<_>>())
    .bind(column(requests, |r| r.watch_id))
    .bind(column(requests, |r| r.device_id))
    .bind(column(requests, |r| r.announces().key()))
    .bind(column(requests, |r| r.channel.as_str()))
    .bind(column(requests, |r| r.dedup_day))
    .bind(column(requests, |r| r.detected_at))
    .bind(column(requests, |r| r.detected.price))
    .bind(column(requests, |r| r.detected.currency.as_str()))
    .bind(column(requests, |r| r.detected.in_stock))
    .bind(column(requests, |r| r.detected.paused))
    .bind(column(requests, |r| r.detected.observed_at))
    .bind(column(requests, |r| r.baseline.price))
    .bind(column(requests, |r| r.baseline.reference))
    .bind(column(requests, |r| r.baseline.in_stock))
    .bind(requests.iter().map(|(_, tp)| tp.as_deref()).collect::<Vec<_>>())
    .bind(column(requests, |r| r.withdraws))
    .execute(pool)
    .await?;
    Ok(usize::try_from(result.rows_affected()).unwrap_or(0))
}

/// One column of the batch: `f` of each request.
fn column<'a, T>(
    requests: &'a [(&'a EnqueueRequest, Option<String>)],
    f: impl Fn(&'a EnqueueRequest) -> T,
) -> Vec<T> {
    requests.iter().map(|(r, _)| f(r)).collect()
}
