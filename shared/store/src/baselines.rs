//! The `baselines` table as the detector and the dispatcher read it: what the last `sent`
//! notification of a (watch, trigger) said. Written only by the results loop, in the transaction
//! that marks the outbox row `sent`.

use chrono::{DateTime, Utc};
use tidings_domain::trigger::LastSent;
use tidings_domain::{OutboxId, WatchId};

/// A `baselines` row (`SELECT {BASELINE_COLUMNS}`).
#[derive(Debug, sqlx::FromRow)]
pub struct BaselineRow {
    pub watch_id: WatchId,
    pub trigger: String,
    pub price: i64,
    pub in_stock: bool,
    pub sent_at: DateTime<Utc>,
}

pub const BASELINE_COLUMNS: &str = "watch_id, trigger, price, in_stock, sent_at";

impl BaselineRow {
    pub fn last_sent(&self) -> LastSent {
        LastSent {
            price: self.price,
            in_stock: self.in_stock,
            sent_at: self.sent_at,
        }
    }
}

/// A watch's baseline moved to the value a row sent.
#[derive(Debug, Clone)]
pub struct Advance<'a> {
    pub watch_id: WatchId,
    pub trigger: &'a str,
    pub price: i64,
    pub in_stock: bool,
    pub outbox_id: OutboxId,
}

/// Moves each (watch, trigger)'s baseline to the value sent, in the transaction that ends its row
/// `sent`.
pub async fn advance(
    conn: &mut sqlx::PgConnection,
    advanced: &[Advance<'_>],
    sent_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if advanced.is_empty() {
        return Ok(());
    }
    let col = |f: &dyn Fn(&Advance<'_>) -> String| advanced.iter().map(f).collect::<Vec<_>>();
    let watch: Vec<WatchId> = advanced.iter().map(|a| a.watch_id).collect();
    let trigger = col(&|a| a.trigger.to_owned());
    let price: Vec<i64> = advanced.iter().map(|a| a.price).collect();
    let in_stock: Vec<bool> = advanced.iter().map(|a| a.in_stock).collect();
    let outbox: Vec<OutboxId> = advanced.iter().map(|a| a.outbox_id).collect();
    sqlx::query(
        "INSERT INTO baselines (watch_id, trigger, price, in_stock, outbox_id, sent_at)
         SELECT w, t, p, s, o, $6 FROM UNNEST($1::uuid[], $2::text[], $3::bigint[], $4::bool[], $5::uuid[])
              AS u(w, t, p, s, o)
         ON CONFLICT (watch_id, trigger) DO UPDATE
         SET price = EXCLUDED.price, in_stock = EXCLUDED.in_stock,
             outbox_id = EXCLUDED.outbox_id, sent_at = EXCLUDED.sent_at",
    )
    .bind(watch)
    .bind(trigger)
    .bind(price)
    .bind(in_stock)
    .bind(outbox)
    .bind(sent_at)
    .execute(conn)
    .await?;
    Ok(())
}
