//! The `baselines` table as the detector and the dispatcher read it: what the last `sent`
//! notification of a (watch, trigger) said. Written only by the results loop, in the transaction
//! that marks the outbox row `sent`.

use chrono::{DateTime, Utc};
use tidings_domain::WatchId;
use tidings_domain::trigger::LastSent;

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
