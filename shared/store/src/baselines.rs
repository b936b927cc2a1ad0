//! The `baselines` table as the detector and the dispatcher read it: what the last `sent`
//! notification of a (watch, trigger) said. Written only by the results loop, in the transaction
//! that marks the outbox row `sent`.

use chrono::{DateTime, NaiveDate, Utc};
use tidings_domain::trigger::{Baseline, LastSent};
use tidings_domain::withdrawal::Promise;
use tidings_domain::{OutboxId, WatchId};

/// A `baselines` row (`SELECT {BASELINE_COLUMNS}`).
#[derive(Debug, sqlx::FromRow)]
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

pub const BASELINE_COLUMNS: &str = "watch_id, trigger, price, in_stock, sent_at, outbox_id, \
     dedup_day, observed_at, valid_until, decided_price, decided_reference, decided_in_stock";

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

/// Upserts (watch, trigger)'s baseline from arrays of each column, `$6` the send's time.
const ADVANCE: &str = "INSERT INTO baselines (watch_id, trigger, price, in_stock, outbox_id, sent_at,
                           dedup_day, valid_until, decided_price, decided_reference,
                           decided_in_stock, observed_at)
    SELECT w, t, p, s, o, $6, d, v, dp, dr, ds, ob
    FROM UNNEST($1::uuid[], $2::text[], $3::bigint[], $4::bool[], $5::uuid[], $7::date[],
                $8::timestamptz[], $9::bigint[], $10::bigint[], $11::bool[], $12::timestamptz[])
         AS u(w, t, p, s, o, d, v, dp, dr, ds, ob)
    ON CONFLICT (watch_id, trigger) DO UPDATE
    SET price = EXCLUDED.price, in_stock = EXCLUDED.in_stock, outbox_id = EXCLUDED.outbox_id,
        sent_at = EXCLUDED.sent_at, dedup_day = EXCLUDED.dedup_day,
        observed_at = EXCLUDED.observed_at, valid_until = EXCLUDED.valid_until, decided_price = EXCLUDED.decided_price,
        decided_reference = EXCLUDED.decided_reference, decided_in_stock = EXCLUDED.decided_in_stock";

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
    let watch: Vec<WatchId> = advanced.iter().map(|a| a.watch_id).collect();
    let trigger: Vec<&str> = advanced.iter().map(|a| a.trigger).collect();
    let price: Vec<i64> = advanced.iter().map(|a| a.price).collect();
    let in_stock: Vec<bool> = advanced.iter().map(|a| a.in_stock).collect();
    let outbox: Vec<OutboxId> = advanced.iter().map(|a| a.outbox_id).collect();
    sqlx::query(ADVANCE)
        .bind(watch)
        .bind(trigger)
        .bind(price)
        .bind(in_stock)
        .bind(outbox)
        .bind(sent_at)
        .bind(promised(advanced, |p| Some(p.dedup_day)))
        .bind(promised(advanced, |p| Some(p.valid_until)))
        .bind(promised(advanced, |p| p.decided_on.price))
        .bind(promised(advanced, |p| p.decided_on.reference))
        .bind(promised(advanced, |p| p.decided_on.in_stock))
        .bind(promised(advanced, |p| Some(p.observed_at)))
        .execute(conn)
        .await?;
    Ok(())
}

/// One column of what the advanced rows promised (`None` where nothing was).
fn promised<T>(advanced: &[Advance<'_>], f: fn(&Promise) -> Option<T>) -> Vec<Option<T>> {
    advanced
        .iter()
        .map(|a| a.promise.as_ref().and_then(f))
        .collect()
}
