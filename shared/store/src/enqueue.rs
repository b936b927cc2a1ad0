//! Ingest's write: EnqueueRequests become pending outbox rows, one statement per batch, a
//! duplicate of the dedup key changing nothing.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;
use std::sync::LazyLock;
use tidings_domain::messages::EnqueueRequest;
use tidings_domain::withdrawal::Announces;
use tidings_domain::{Channel, DeviceId, OutboxId, WatchId};

crate::unnest::unnest_rows! {
    /// A new outbox row: its keys, what it announces, and its detection snapshot (the columns
    /// the database guard in `migrations/0001_init.sql` keeps immutable).
    struct NewRow<'a> {
        id: OutboxId,
        watch_id: WatchId,
        device_id: DeviceId,
        trigger: Announces,
        channel: Channel,
        dedup_day: NaiveDate,
        detected_at: DateTime<Utc>,
        detected_price: i64,
        detected_currency: &'a str,
        detected_in_stock: bool,
        detected_paused: bool,
        detected_observed_at: DateTime<Utc>,
        baseline_price: Option<i64>,
        baseline_reference: Option<i64>,
        baseline_in_stock: Option<bool>,
        traceparent: Option<&'a str>,
        withdraws: Option<OutboxId>,
    }
}

static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day, {snapshot},
                             traceparent, withdraws)
         SELECT id, watch_id, device_id, trigger, channel, dedup_day, {snapshot},
                traceparent, withdraws
         FROM {rows}
         ON CONFLICT (watch_id, trigger, dedup_day, channel) WHERE replay_of IS NULL DO NOTHING",
        snapshot = crate::snapshot_columns!(),
        rows = NewRow::table("u"),
    )
});

/// Inserts a batch; returns how many rows were new (the rest were duplicates of the dedup key).
pub async fn insert(
    pool: &PgPool,
    requests: &[(&EnqueueRequest, Option<String>)],
) -> Result<usize, sqlx::Error> {
    let rows: Vec<NewRow<'_>> = requests
        .iter()
        .map(|(r, traceparent)| NewRow {
            id: OutboxId::new(),
            watch_id: r.watch_id,
            device_id: r.device_id,
            trigger: r.announces(),
            channel: r.channel,
            dedup_day: r.dedup_day,
            detected_at: r.detected_at,
            detected_price: r.detected.price,
            detected_currency: &r.detected.currency,
            detected_in_stock: r.detected.in_stock,
            detected_paused: r.detected.paused,
            detected_observed_at: r.detected.observed_at,
            baseline_price: r.baseline.price,
            baseline_reference: r.baseline.reference,
            baseline_in_stock: r.baseline.in_stock,
            traceparent: traceparent.as_deref(),
            withdraws: r.withdraws,
        })
        .collect();
    let result = NewRow::bind(&rows, sqlx::query(INSERT.as_str()))
        .execute(pool)
        .await?;
    // A batch is far smaller than `usize::MAX` rows.
    Ok(usize::try_from(result.rows_affected()).unwrap_or(usize::MAX))
}
