//! The `baselines` table as the detector and the dispatcher read it: what the last `sent`
//! notification of a (watch, trigger) said. Written only by the results loop, in the transaction
//! that marks the outbox row `sent`.

use chrono::{DateTime, NaiveDate, Utc};
use std::sync::LazyLock;
use tidings_domain::trigger::{Baseline, LastSent};
use tidings_domain::withdrawal::Promise;
use tidings_domain::{OutboxId, WatchId};

/// A `baselines` row.
#[derive(Debug)]
pub struct BaselineRow {
    pub watch_id: WatchId,
    pub trigger: String,
    pub price: i64,
    pub in_stock: bool,
    pub sent_at: DateTime<Utc>,
    pub outbox_id: OutboxId,
    pub dedup_day: Option<NaiveDate>,
    pub observed_at: Option<DateTime<Utc>>,
    pub valid_until: Option<DateTime<Utc>>,
    pub decided_price: Option<i64>,
    pub decided_reference: Option<i64>,
    pub decided_in_stock: Option<bool>,
}

impl BaselineRow {
    pub fn last_sent(&self) -> LastSent {
        let promise = match (self.dedup_day, self.observed_at, self.valid_until) {
            (Some(dedup_day), Some(observed_at), Some(valid_until)) => Some(Promise {
                outbox_id: self.outbox_id,
                dedup_day,
                observed_at,
                valid_until,
                decided_on: Baseline {
                    price: self.decided_price,
                    reference: self.decided_reference,
                    in_stock: self.decided_in_stock,
                },
            }),
            _ => None,
        };
        LastSent {
            price: self.price,
            in_stock: self.in_stock,
            sent_at: self.sent_at,
            promise,
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
    /// What the row stated, for a notification that may be withdrawn; `None` for a withdrawal
    /// (which is never withdrawn itself).
    pub promise: Option<Promise>,
}

crate::unnest::unnest_rows! {
    /// A (watch, trigger)'s baseline as [`advance`] writes it: the columns of table `u`.
    struct AdvanceRow<'a> {
        watch_id: WatchId,
        trigger: &'a str,
        price: i64,
        in_stock: bool,
        outbox_id: OutboxId,
        sent_at: DateTime<Utc>,
        dedup_day: Option<NaiveDate>,
        valid_until: Option<DateTime<Utc>>,
        decided_price: Option<i64>,
        decided_reference: Option<i64>,
        decided_in_stock: Option<bool>,
        observed_at: Option<DateTime<Utc>>,
    }
}

/// Upserts each (watch, trigger)'s baseline. Marked with the writing transaction (by the
/// column's default, or set here), so the mark's trigger need not call its function (0029).
static ADVANCE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO baselines (watch_id, trigger, price, in_stock, outbox_id, sent_at,
                                dedup_day, valid_until, decided_price, decided_reference,
                                decided_in_stock, observed_at)
         SELECT watch_id, trigger, price, in_stock, outbox_id, sent_at,
                dedup_day, valid_until, decided_price, decided_reference,
                decided_in_stock, observed_at
         FROM {rows}
         ON CONFLICT (watch_id, trigger) DO UPDATE
         SET price = EXCLUDED.price, in_stock = EXCLUDED.in_stock,
             outbox_id = EXCLUDED.outbox_id, sent_at = EXCLUDED.sent_at,
             dedup_day = EXCLUDED.dedup_day, observed_at = EXCLUDED.observed_at,
             valid_until = EXCLUDED.valid_until, decided_price = EXCLUDED.decided_price,
             decided_reference = EXCLUDED.decided_reference,
             decided_in_stock = EXCLUDED.decided_in_stock,
             changed_xid = pg_current_xact_id()",
        rows = AdvanceRow::table("u"),
    )
});

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
    let rows: Vec<AdvanceRow<'_>> = advanced
        .iter()
        .map(|a| {
            let promise = a.promise.as_ref();
            AdvanceRow {
                watch_id: a.watch_id,
                trigger: a.trigger,
                price: a.price,
                in_stock: a.in_stock,
                outbox_id: a.outbox_id,
                sent_at,
                dedup_day: promise.map(|p| p.dedup_day),
                valid_until: promise.map(|p| p.valid_until),
                decided_price: promise.and_then(|p| p.decided_on.price),
                decided_reference: promise.and_then(|p| p.decided_on.reference),
                decided_in_stock: promise.and_then(|p| p.decided_on.in_stock),
                observed_at: promise.map(|p| p.observed_at),
            }
        })
        .collect();
    AdvanceRow::bind(&rows, sqlx::query(ADVANCE.as_str()))
        .execute(conn)
        .await?;
    Ok(())
}
