//! An operator's replay: a `failed` or `dropped` row that is not itself a replay, and was not
//! replayed before, becomes a new `pending` row linked to it (`replay_of`), with the same
//! detection snapshot and dedup day. The dispatcher re-checks it like any row, so a replay never
//! sends something that is no longer true; the original is never edited.

use chrono::NaiveDate;
use sqlx::types::Uuid;
use sqlx::{PgConnection, PgPool};
use tidings_domain::OutboxId;
use tidings_domain::outbox::Status;

/// Replays row `original` as row `new`; false if it is not replayable (its state, a replay, or
/// replayed already).
pub async fn one(
    pool: &PgPool,
    original: OutboxId,
    new: OutboxId,
    traceparent: Option<String>,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query!(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day,
                             detected_at, detected_price, detected_currency, detected_in_stock,
                             detected_paused, detected_observed_at, baseline_price,
                             baseline_reference, baseline_in_stock, replay_of, traceparent)
         SELECT $1, watch_id, device_id, trigger, channel, dedup_day,
                detected_at, detected_price, detected_currency, detected_in_stock,
                detected_paused, detected_observed_at, baseline_price,
                baseline_reference, baseline_in_stock, id, $3
         FROM outbox
         WHERE id = $2 AND replay_of IS NULL
           AND status IN ('dropped', 'failed') /* status: replayable */
         ON CONFLICT DO NOTHING",
        new.0,
        original.0,
        traceparent
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// Replays rows `ids` (of days `days`, which the caller has checked are replayable) in `conn`'s
/// transaction, each as a new row carrying `traceparent`; returns how many were made.
pub async fn many(
    conn: &mut PgConnection,
    ids: &[OutboxId],
    days: &[NaiveDate],
    traceparent: Option<String>,
) -> Result<u64, sqlx::Error> {
    let new: Vec<Uuid> = ids.iter().map(|_| OutboxId::new().0).collect();
    let inserted = sqlx::query!(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day,
                             detected_at, detected_price, detected_currency, detected_in_stock,
                             detected_paused, detected_observed_at, baseline_price,
                             baseline_reference, baseline_in_stock, replay_of, traceparent)
         SELECT u.new_id, o.watch_id, o.device_id, o.trigger, o.channel, o.dedup_day,
                o.detected_at, o.detected_price, o.detected_currency, o.detected_in_stock,
                o.detected_paused, o.detected_observed_at, o.baseline_price,
                o.baseline_reference, o.baseline_in_stock, o.id, $4
         FROM UNNEST($1::uuid[], $2::date[], $3::uuid[]) AS u(id, day, new_id)
         JOIN outbox o ON o.id = u.id AND o.dedup_day = u.day
         ON CONFLICT DO NOTHING",
        ids as _,
        days,
        &new,
        traceparent
    )
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted)
}

/// The trace context row `id` carries, to link a replay's trace to it; `None` if there is no
/// such row.
pub async fn traceparent_of(
    pool: &PgPool,
    id: OutboxId,
) -> Result<Option<Option<String>>, sqlx::Error> {
    sqlx::query_scalar!("SELECT traceparent FROM outbox WHERE id = $1", id.0)
        .fetch_optional(pool)
        .await
}

/// Why row `id` was not replayed: its state, the replay it already has, and the row it is
/// itself a replay of. `None` if there is no such row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayability {
    pub status: Status,
    pub replayed_as: Option<OutboxId>,
    pub replay_of: Option<OutboxId>,
}

pub async fn replayability(
    pool: &PgPool,
    id: OutboxId,
) -> Result<Option<Replayability>, sqlx::Error> {
    sqlx::query_as!(
        Replayability,
        r#"SELECT status AS "status: Status",
                  (SELECT r.id FROM outbox r WHERE r.replay_of = o.id)
                      AS "replayed_as: OutboxId",
                  replay_of AS "replay_of: OutboxId"
           FROM outbox o WHERE id = $1"#,
        id.0
    )
    .fetch_optional(pool)
    .await
}

/// A client's recovery of its endpoint's deliveries: device `device`'s rows that ended `failed`,
/// or `dropped` because their validity ran out, at or after `since`, and were not replayed yet
/// (replays among them, so a recovery tried before the receiver was back can be tried again),
/// each replayed once in `conn`'s transaction, oldest first, at most `limit`. Returns how many
/// were replayed and whether more remain.
pub async fn recover(
    conn: &mut PgConnection,
    device: tidings_domain::DeviceId,
    since: chrono::DateTime<chrono::Utc>,
    limit: i64,
    traceparent: Option<String>,
) -> Result<(u64, bool), sqlx::Error> {
    let found = sqlx::query!(
        r#"SELECT o.id AS "id: OutboxId", o.dedup_day FROM outbox o
           WHERE o.device_id = $1 AND o.finished_at >= $2
             AND (o.status = 'failed'
                  OR (o.status = 'dropped' AND o.reason = 'validity_expired'))
             AND NOT EXISTS (SELECT 1 FROM outbox r WHERE r.replay_of = o.id)
           ORDER BY o.id LIMIT $3::bigint + 1
           FOR UPDATE OF o"#,
        device.0,
        since,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    let more = found.len() as i64 > limit;
    let (ids, days): (Vec<OutboxId>, Vec<NaiveDate>) = (found.into_iter())
        .take(limit.max(0) as usize)
        .map(|r| (r.id, r.dedup_day))
        .unzip();
    if ids.is_empty() {
        return Ok((0, more));
    }
    Ok((many(conn, &ids, &days, traceparent).await?, more))
}
