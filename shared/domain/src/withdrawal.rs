//! Withdrawals (docs/design.md, *True on the screen*): a `sent` notification whose condition
//! stops holding before its `valid_until` gets one follow-up, through the same outbox and
//! re-check as every notification, that replaces it on the screen (same tag) and in the push
//! service (same topic): "was 9.99, now 15.00".
//!
//! A withdrawal is an outbox row like any other. Its `trigger` column is the withdrawn trigger's
//! key behind [`PREFIX`], and its dedup day is the withdrawn row's, so there is at most one per
//! sent row. Once sent, it moves the baseline to the value it reported, so the next day's drop is
//! announced again; a drop later the same day is not (the day's key is taken): a price that flaps
//! around a limit gets one alert and one withdrawal a day, not a stream of both.

use crate::OutboxId;
use crate::trigger::{Baseline, LostReason, Observation, Trigger, Verdict, evaluate};
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

/// What a withdrawal's trigger key starts with.
pub const PREFIX: &str = "withdraw:";

/// An outbox `trigger` column's parts, without parsing the trigger itself: the key of the trigger
/// the row is about (whose baseline it is decided on), and whether the row withdraws it. The one
/// place that knows how a withdrawal's key is spelt, for readers that need no [`Trigger`] (a key
/// this build does not know still has its baseline).
fn split_key(key: &str) -> (&str, bool) {
    match key.strip_prefix(PREFIX) {
        Some(withdrawn) => (withdrawn, true),
        None => (key, false),
    }
}

/// An outbox row's `trigger` column, split once where it is read: the key of the trigger the
/// row is about (whose baseline it is decided on), whether the row withdraws it, and what it
/// announces if this build knows the trigger. A key this build does not know (a newer build's)
/// still has its baseline key; only its own row fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerColumn {
    pub key: String,
    pub withdrawal: bool,
    pub announces: Option<Announces>,
}

impl TriggerColumn {
    pub fn parse(column: &str) -> Self {
        let (key, withdrawal) = split_key(column);
        TriggerColumn {
            key: key.to_owned(),
            withdrawal,
            announces: Announces::from_key(column),
        }
    }
}

/// What an outbox row tells its reader, as its `trigger` column names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Announces {
    /// The trigger holds.
    Holds(Trigger),
    /// A notification of the trigger that was sent stopped holding: the row withdraws it.
    Ended(Trigger),
}

impl Announces {
    /// The outbox's `trigger` column: the trigger's key, behind [`PREFIX`] for a withdrawal.
    pub fn key(&self) -> String {
        match self {
            Announces::Holds(t) => t.key(),
            Announces::Ended(t) => format!("{PREFIX}{}", t.key()),
        }
    }

    /// Reads a key written by [`Announces::key`]; `None` for one this build does not know.
    pub fn from_key(key: &str) -> Option<Announces> {
        match split_key(key) {
            (withdrawn, true) => Trigger::from_key(withdrawn).map(Announces::Ended),
            (key, false) => Trigger::from_key(key).map(Announces::Holds),
        }
    }

    /// The trigger the row is about.
    pub fn trigger(&self) -> &Trigger {
        match self {
            Announces::Holds(t) | Announces::Ended(t) => t,
        }
    }

    pub fn is_withdrawal(&self) -> bool {
        matches!(self, Announces::Ended(_))
    }
}

/// What a `sent` notification stated, kept with its (watch, trigger)'s baseline until a later
/// send replaces it: which row, the day its key counts, when the value it stated was observed,
/// until when it is current, and the baseline it was decided against (against which it stops
/// holding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promise {
    pub outbox_id: OutboxId,
    pub dedup_day: NaiveDate,
    pub observed_at: DateTime<Utc>,
    pub valid_until: DateTime<Utc>,
    pub decided_on: Baseline,
}

/// Why a sent notification no longer holds at `observation`, if it does not and is still
/// current at `now`; `None` when it holds or its validity is over (a notification past
/// `valid_until` is no longer shown as current, so there is nothing to withdraw).
pub fn ended(
    trigger: &Trigger,
    promise: &Promise,
    observation: &Observation,
    now: DateTime<Utc>,
) -> Option<LostReason> {
    if now >= promise.valid_until {
        return None;
    }
    match evaluate(trigger, observation, &promise.decided_on) {
        Verdict::Holds => None,
        Verdict::Lost(reason) => Some(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn at(min: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 3, 10, min, 0).unwrap()
    }

    fn promise(decided_on: Baseline) -> Promise {
        Promise {
            outbox_id: OutboxId::new(),
            dedup_day: at(0).date_naive(),
            observed_at: at(0),
            valid_until: at(20),
            decided_on,
        }
    }

    #[test]
    fn keys_round_trip_and_a_withdrawal_is_marked() {
        for t in [
            Trigger::PriceBelow { threshold: 1200 },
            Trigger::PriceDrop { percent: 10 },
            Trigger::BackInStock,
        ] {
            let holds = Announces::Holds(t.clone());
            let ended = Announces::Ended(t.clone());
            assert_eq!(holds.key(), t.key());
            assert_eq!(ended.key(), format!("withdraw:{}", t.key()));
            assert_eq!(Announces::from_key(&holds.key()), Some(holds));
            assert_eq!(Announces::from_key(&ended.key()), Some(ended.clone()));
            assert!(ended.is_withdrawal());
            assert_eq!(ended.trigger(), &t);
        }
        assert_eq!(Announces::from_key("withdraw:withdraw:back_in_stock"), None);
        assert_eq!(Announces::from_key("withdraw:"), None);
        assert_eq!(
            split_key("withdraw:price_below:1200"),
            ("price_below:1200", true)
        );
        assert_eq!(split_key("price_below:1200"), ("price_below:1200", false));
        // A key this build cannot parse still splits, so its baseline is found.
        assert_eq!(split_key("withdraw:someday_kind"), ("someday_kind", true));
        assert_eq!(Announces::from_key("recall:back_in_stock"), None);
        assert_eq!(
            TriggerColumn::parse("withdraw:someday_kind"),
            TriggerColumn {
                key: "someday_kind".into(),
                withdrawal: true,
                announces: None
            }
        );
        let below = Trigger::PriceBelow { threshold: 1200 };
        assert_eq!(
            TriggerColumn::parse("withdraw:price_below:1200"),
            TriggerColumn {
                key: "price_below:1200".into(),
                withdrawal: true,
                announces: Some(Announces::Ended(below))
            }
        );
    }

    #[test]
    fn a_price_back_above_the_limit_ends_the_notification_while_it_is_current() {
        let below = Trigger::PriceBelow { threshold: 1200 };
        let p = promise(Baseline::default());
        let at_15 = Observation::on_sale(1500, "EUR", at(5));
        assert_eq!(
            ended(&below, &p, &at_15, at(5)),
            Some(LostReason::ConditionLost)
        );
        // Still below the limit, or lower still: the notification holds.
        for price in [999, 950, 1199] {
            let o = Observation::on_sale(price, "EUR", at(5));
            assert_eq!(ended(&below, &p, &o, at(5)), None, "{price}");
        }
        // Past valid_until nothing is withdrawn.
        assert_eq!(ended(&below, &p, &at_15, at(20)), None);
    }

    #[test]
    fn sold_out_and_paused_end_every_kind() {
        let restock = promise(Baseline {
            in_stock: Some(false),
            ..Baseline::default()
        });
        let sold_out = Observation {
            in_stock: false,
            ..Observation::on_sale(1000, "EUR", at(1))
        };
        let paused = Observation {
            paused: true,
            ..Observation::on_sale(1000, "EUR", at(1))
        };
        assert_eq!(
            ended(&Trigger::BackInStock, &restock, &sold_out, at(1)),
            Some(LostReason::OutOfStock)
        );
        assert_eq!(
            ended(&Trigger::BackInStock, &restock, &paused, at(1)),
            Some(LostReason::ItemPaused)
        );
        let drop = promise(Baseline {
            reference: Some(1500),
            ..Baseline::default()
        });
        let ten = Trigger::PriceDrop { percent: 10 };
        let o = |price| Observation::on_sale(price, "EUR", at(1));
        assert_eq!(ended(&ten, &drop, &o(1350), at(1)), None);
        assert_eq!(
            ended(&ten, &drop, &o(1351), at(1)),
            Some(LostReason::ConditionLost)
        );
    }

    proptest! {
        /// A notification is withdrawn exactly when, while current, its trigger stops holding
        /// against the baseline it was sent on.
        #[test]
        fn ended_is_evaluate_within_validity(
            price in 1i64..5000, threshold in 1i64..5000, minute in 0u32..40,
            in_stock: bool, paused: bool,
        ) {
            let t = Trigger::PriceBelow { threshold };
            let p = promise(Baseline::default());
            let o = Observation { in_stock, paused, ..Observation::on_sale(price, "EUR", at(0)) };
            let now = at(minute);
            let lost = evaluate(&t, &o, &Baseline::default()) != Verdict::Holds;
            prop_assert_eq!(ended(&t, &p, &o, now).is_some(), lost && now < p.valid_until);
        }

        #[test]
        fn every_key_reads_back(key in "\\PC{0,40}") {
            if let Some(a) = Announces::from_key(&key) {
                prop_assert_eq!(a.key(), key);
            }
        }
    }
}
