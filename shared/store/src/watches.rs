//! What the detector records on watches: the item's stock state it last saw, and the first price
//! a `price_drop` watch is measured from.

use sqlx::PgPool;
use tidings_domain::WatchId;

/// One watch's scan record; `None` leaves that column as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub watch_id: WatchId,
    pub in_stock: Option<bool>,
    /// Written only while the watch has no reference price yet.
    pub reference_price: Option<i64>,
}

/// Records what a scan saw, one statement for every watch (an `UPDATE … FROM` applies one joined
/// row per watch, so each watch appears once).
pub async fn record_seen(pool: &PgPool, seen: &[Seen]) -> Result<(), sqlx::Error> {
    if seen.is_empty() {
        return Ok(());
    }
    let ids: Vec<WatchId> = seen.iter().map(|s| s.watch_id).collect();
    let states: Vec<Option<bool>> = seen.iter().map(|s| s.in_stock).collect();
    let prices: Vec<Option<i64>> = seen.iter().map(|s| s.reference_price).collect();
    sqlx::query(
        "UPDATE watches w
         SET last_in_stock = COALESCE(u.s, w.last_in_stock),
             reference_price = COALESCE(w.reference_price, u.p)
         FROM UNNEST($1::uuid[], $2::bool[], $3::bigint[]) AS u(id, s, p)
         WHERE w.id = u.id",
    )
    .bind(ids)
    .bind(states)
    .bind(prices)
    .execute(pool)
    .await?;
    Ok(())
}
