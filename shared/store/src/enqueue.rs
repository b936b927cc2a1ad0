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
    let n = requests.len();
    let mut ids = Vec::with_capacity(n);
    let mut watch_ids = Vec::with_capacity(n);
    let mut device_ids = Vec::with_capacity(n);
    let mut triggers = Vec::with_capacity(n);
    let mut channels = Vec::with_capacity(n);
    let mut days = Vec::with_capacity(n);
    let mut detected_at = Vec::with_capacity(n);
    let mut price = Vec::with_capacity(n);
    let mut currency = Vec::with_capacity(n);
    let mut in_stock = Vec::with_capacity(n);
    let mut paused = Vec::with_capacity(n);
    let mut observed_at = Vec::with_capacity(n);
    let mut b_price = Vec::with_capacity(n);
    let mut b_reference = Vec::with_capacity(n);
    let mut b_in_stock = Vec::with_capacity(n);
    let mut traceparents = Vec::with_capacity(n);
    let mut withdraws = Vec::with_capacity(n);
    for (r, tp) in requests {
        ids.push(OutboxId::new());
        watch_ids.push(r.watch_id);
        device_ids.push(r.device_id);
        triggers.push(r.announces().key());
        channels.push(r.channel.as_str());
        days.push(r.dedup_day);
        detected_at.push(r.detected_at);
        price.push(r.detected.price);
        currency.push(r.detected.currency.as_str());
        in_stock.push(r.detected.in_stock);
        paused.push(r.detected.paused);
        observed_at.push(r.detected.observed_at);
        b_price.push(r.baseline.price);
        b_reference.push(r.baseline.reference);
        b_in_stock.push(r.baseline.in_stock);
        traceparents.push(tp.as_deref());
        withdraws.push(r.withdraws);
    }
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
    .bind(ids)
    .bind(watch_ids)
    .bind(device_ids)
    .bind(triggers)
    .bind(channels)
    .bind(days)
    .bind(detected_at)
    .bind(price)
    .bind(currency)
    .bind(in_stock)
    .bind(paused)
    .bind(observed_at)
    .bind(b_price)
    .bind(b_reference)
    .bind(b_in_stock)
    .bind(traceparents)
    .bind(withdraws)
    .execute(pool)
    .await?;
    Ok(usize::try_from(result.rows_affected()).unwrap_or(0))
}
