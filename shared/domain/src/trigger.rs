//! Triggers and the one function that evaluates them.
//!
//! Detection and the dispatcher's pre-send re-check both call [`evaluate`], so "would we notify?"
//! has exactly one answer. Prices are integer minor units (cents): comparisons are exact, and a
//! threshold of `120000` means 1,200.00 in the item's currency.

use crate::names::names;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A condition on an item that is worth a notification.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Trigger {
    /// The price is strictly below `threshold` (minor units), and lower than the last price we
    /// notified about, so the same low price is never announced twice.
    PriceBelow { threshold: i64 },
    /// The price has fallen by at least `percent` % from the baseline: the last price we notified
    /// about, or the price when the watch was created.
    PriceDrop { percent: u8 },
    /// The item went from out of stock to in stock.
    BackInStock,
}

/// Why a trigger's parameters are unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTrigger {
    #[error("price_below threshold must be between 1 and {max} minor units, got {got}")]
    Threshold { got: i64, max: i64 },
    #[error("price_drop percent must be between 1 and 99, got {0}")]
    Percent(u8),
}

impl Trigger {
    /// Largest accepted threshold: 10^12 minor units keeps every product we compute in range.
    pub const MAX_THRESHOLD: i64 = 1_000_000_000_000;

    pub fn validate(&self) -> Result<(), InvalidTrigger> {
        match *self {
            Trigger::PriceBelow { threshold }
                if !(1..=Self::MAX_THRESHOLD).contains(&threshold) =>
            {
                Err(InvalidTrigger::Threshold {
                    got: threshold,
                    max: Self::MAX_THRESHOLD,
                })
            }
            Trigger::PriceDrop { percent } if !(1..=99).contains(&percent) => {
                Err(InvalidTrigger::Percent(percent))
            }
            _ => Ok(()),
        }
    }

    /// A stable text key naming this trigger with its parameters. It is part of the dedup key and
    /// of the outbox's unique key, so it must never change for a given trigger.
    pub fn key(&self) -> String {
        match self {
            Trigger::PriceBelow { threshold } => format!("price_below:{threshold}"),
            Trigger::PriceDrop { percent } => format!("price_drop:{percent}"),
            Trigger::BackInStock => "back_in_stock".to_owned(),
        }
    }

    /// Reads a key written by [`Trigger::key`]: the outbox stores the key, not the trigger twice.
    pub fn from_key(key: &str) -> Option<Trigger> {
        let trigger = match key.split_once(':') {
            None if key == "back_in_stock" => Trigger::BackInStock,
            Some(("price_below", t)) => Trigger::PriceBelow {
                threshold: t.parse().ok()?,
            },
            Some(("price_drop", p)) => Trigger::PriceDrop {
                percent: p.parse().ok()?,
            },
            _ => return None,
        };
        // Only canonical keys round-trip ("price_drop:010" is not one).
        (trigger.key() == key).then_some(trigger)
    }

    /// The trigger's name without parameters: a low-cardinality label for metrics and spans.
    pub fn name(&self) -> &'static str {
        match self {
            Trigger::PriceBelow { .. } => "price_below",
            Trigger::PriceDrop { .. } => "price_drop",
            Trigger::BackInStock => "back_in_stock",
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

/// What a source says an item is now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// Price in minor units.
    pub price: i64,
    /// ISO 4217 code, e.g. "EUR".
    pub currency: String,
    pub in_stock: bool,
    /// The listing is paused by the seller: it cannot be bought right now.
    #[serde(default)]
    pub paused: bool,
    pub observed_at: DateTime<Utc>,
    /// Whether the source stated availability. A product page whose offers state none is read
    /// as in stock (a shop that sells only what it has often leaves it out) but with this false:
    /// no evidence that an item came back, so `back_in_stock` does not hold on it (a template
    /// that drops the field must not announce a restock). Written only when false.
    #[serde(default = "stated", skip_serializing_if = "is_stated")]
    pub stock_stated: bool,
}

fn stated() -> bool {
    true
}

fn is_stated(stated: &bool) -> bool {
    *stated
}

impl Observation {
    /// An item in stock and not paused, at `price` minor units of `currency`.
    pub fn on_sale(price: i64, currency: &str, observed_at: DateTime<Utc>) -> Self {
        Observation {
            price,
            currency: currency.to_owned(),
            in_stock: true,
            paused: false,
            observed_at,
            stock_stated: true,
        }
    }
}

names! {
    /// What a source can answer instead of an observation.
    pub enum SourceErrorKind("source error") {
        /// The item does not exist (any more).
        NotFound = "not_found",
        /// The item exists but has nothing to sell.
        Empty = "empty",
        /// The upstream asked us to slow down (429).
        RateLimited = "rate_limited",
        /// Timeout, connection failure, 5xx.
        Unavailable = "unavailable",
        /// The upstream answered something we could not understand.
        BadData = "bad_data",
    }
}

impl SourceErrorKind {
    /// Worth asking again later. `bad_data` counts as transient: it is more often a passing
    /// upstream fault than a permanent state of the item, and the retry cap bounds it.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            SourceErrorKind::RateLimited | SourceErrorKind::Unavailable | SourceErrorKind::BadData
        )
    }
}

/// What a trigger compares an observation against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// The last price notified about for this (watch, trigger); `None` before the first send.
    pub price: Option<i64>,
    /// The price when the watch was created: `price_drop`'s reference until the first send.
    #[serde(default)]
    pub reference: Option<i64>,
    /// The stock state the trigger last knew: the previous observation of the item at detection,
    /// `true` once a notification has been sent.
    pub in_stock: Option<bool>,
}

/// The value a `sent` notification left behind for its (watch, trigger): the baseline row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastSent {
    pub price: i64,
    pub in_stock: bool,
    pub sent_at: DateTime<Utc>,
    /// What the notification stated and until when, while it may still be withdrawn; `None`
    /// once a withdrawal was sent (and for baselines written before withdrawals existed).
    #[serde(default)]
    pub promise: Option<crate::withdrawal::Promise>,
}

impl Baseline {
    /// The baseline a detection scan evaluates against.
    pub fn for_detection(
        last_sent: Option<&LastSent>,
        reference_price: Option<i64>,
        previous_in_stock: Option<bool>,
    ) -> Self {
        Baseline {
            price: last_sent.map(|s| s.price),
            reference: reference_price,
            in_stock: previous_in_stock,
        }
    }

    /// The baseline the dispatcher re-checks against: the one detection used, unless a
    /// notification for the same (watch, trigger) was sent after the detection, in which case
    /// that send is the baseline (so a trigger that has notified does not fire again for it).
    pub fn for_recheck(
        detected: &Baseline,
        last_sent: Option<&LastSent>,
        detected_at: DateTime<Utc>,
    ) -> Self {
        match last_sent {
            Some(s) if s.sent_at > detected_at => Baseline {
                price: Some(s.price),
                reference: detected.reference,
                in_stock: Some(s.in_stock),
            },
            _ => *detected,
        }
    }
}

/// Why a trigger does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    OutOfStock,
    ItemPaused,
    ConditionLost,
}

/// The answer of [`evaluate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    Lost(LostReason),
}

/// Does `trigger` hold for `observation`, given `baseline`?
///
/// An item that cannot be bought (out of stock, paused) never holds: a price alert for it would
/// send the user to a page where they cannot act on it.
pub fn evaluate(trigger: &Trigger, observation: &Observation, baseline: &Baseline) -> Verdict {
    if observation.paused {
        return Verdict::Lost(LostReason::ItemPaused);
    }
    if !observation.in_stock {
        return Verdict::Lost(LostReason::OutOfStock);
    }
    let price = i128::from(observation.price);
    let holds = match *trigger {
        Trigger::PriceBelow { threshold } => {
            price < i128::from(threshold) && baseline.price.is_none_or(|b| price < i128::from(b))
        }
        Trigger::PriceDrop { percent } => baseline.price.or(baseline.reference).is_some_and(|b| {
            // price <= b * (1 - percent/100), in integers.
            price * 100 <= i128::from(b) * i128::from(100 - percent.min(100))
        }),
        Trigger::BackInStock => observation.stock_stated && baseline.in_stock == Some(false),
    };
    if holds {
        Verdict::Holds
    } else {
        Verdict::Lost(LostReason::ConditionLost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn obs(price: i64, in_stock: bool) -> Observation {
        let at = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        Observation {
            in_stock,
            ..Observation::on_sale(price, "EUR", at)
        }
    }

    fn base(price: Option<i64>, in_stock: Option<bool>) -> Baseline {
        Baseline {
            price,
            reference: None,
            in_stock,
        }
    }

    const LOST: Verdict = Verdict::Lost(LostReason::ConditionLost);

    /// Each case: the baseline, a price (in stock), the verdict `t` gives.
    fn verdicts(t: Trigger, cases: &[(Baseline, i64, Verdict)]) {
        for &(b, price, expected) in cases {
            let got = evaluate(&t, &obs(price, true), &b);
            assert_eq!(got, expected, "{t:?} at {price} after {b:?}");
        }
    }

    #[test]
    fn price_below_holds_strictly_below_the_threshold() {
        let none = base(None, None);
        let cases = [(none, 1199, Verdict::Holds), (none, 1200, LOST)];
        verdicts(Trigger::PriceBelow { threshold: 1200 }, &cases);
    }

    #[test]
    fn price_below_does_not_fire_again_for_the_same_baseline() {
        // We told the user about 1100; 1100 again is not news, 1099 is.
        let told = base(Some(1100), Some(true));
        let cases = [(told, 1100, LOST), (told, 1099, Verdict::Holds)];
        verdicts(Trigger::PriceBelow { threshold: 1200 }, &cases);
    }

    #[test]
    fn price_drop_fires_at_ten_percent_not_at_nine() {
        let first = base(Some(1000), None);
        // After a sent notification at 900 the baseline is 900: 810 is the next 10 % drop.
        let after_900 = base(Some(900), Some(true));
        let cases = [
            (first, 900, Verdict::Holds),
            (first, 910, LOST),
            (after_900, 850, LOST),
            (after_900, 810, Verdict::Holds),
        ];
        verdicts(Trigger::PriceDrop { percent: 10 }, &cases);
    }

    /// Regression: the price when the watch was created is price_drop's reference only; it is
    /// not a price we told the user about, so it must not hold price_below back.
    #[test]
    fn the_creation_price_is_a_reference_for_price_drop_only() {
        let b = Baseline::for_detection(None, Some(1100), None);
        assert_eq!(
            evaluate(
                &Trigger::PriceBelow { threshold: 1200 },
                &obs(1100, true),
                &b
            ),
            Verdict::Holds
        );
        assert_eq!(
            evaluate(&Trigger::PriceDrop { percent: 10 }, &obs(990, true), &b),
            Verdict::Holds
        );
        assert_eq!(
            evaluate(&Trigger::PriceDrop { percent: 10 }, &obs(991, true), &b),
            Verdict::Lost(LostReason::ConditionLost)
        );
    }

    #[test]
    fn price_drop_without_any_reference_never_fires() {
        let t = Trigger::PriceDrop { percent: 10 };
        assert_eq!(
            evaluate(&t, &obs(1, true), &base(None, None)),
            Verdict::Lost(LostReason::ConditionLost)
        );
    }

    /// Regression: a page that stopped stating availability read as in stock, and a watch for
    /// its restock fired. Unstated is in stock for a price (the item is sold) but no restock.
    #[test]
    fn back_in_stock_never_holds_on_an_unstated_availability() {
        let unstated = Observation {
            stock_stated: false,
            ..obs(5, true)
        };
        let out_before = base(Some(5), Some(false));
        assert_eq!(
            evaluate(&Trigger::BackInStock, &unstated, &out_before),
            Verdict::Lost(LostReason::ConditionLost)
        );
        let below = Trigger::PriceBelow { threshold: 10 };
        assert_eq!(
            evaluate(&below, &unstated, &base(None, None)),
            Verdict::Holds
        );
        // Written only when unstated, so every snapshot stored before reads as stated.
        let json = serde_json::to_value(&unstated).unwrap();
        assert_eq!(json["stock_stated"], false);
        assert!(
            serde_json::to_value(obs(5, true))
                .unwrap()
                .get("stock_stated")
                .is_none()
        );
        let old: Observation = serde_json::from_value(serde_json::json!({
            "price": 5, "currency": "EUR", "in_stock": true, "observed_at": "2026-11-30T12:00:00Z"
        }))
        .unwrap();
        assert!(old.stock_stated);
    }

    #[test]
    fn back_in_stock_fires_on_the_out_to_in_transition_only() {
        let t = Trigger::BackInStock;
        assert_eq!(
            evaluate(&t, &obs(5, true), &base(None, Some(false))),
            Verdict::Holds
        );
        assert_eq!(
            evaluate(&t, &obs(5, true), &base(None, Some(true))),
            Verdict::Lost(LostReason::ConditionLost)
        );
        assert_eq!(
            evaluate(&t, &obs(5, true), &base(None, None)),
            Verdict::Lost(LostReason::ConditionLost)
        );
        assert_eq!(
            evaluate(&t, &obs(5, false), &base(None, Some(false))),
            Verdict::Lost(LostReason::OutOfStock)
        );
    }

    #[test]
    fn an_item_that_cannot_be_bought_never_holds() {
        let mut o = obs(1, true);
        o.paused = true;
        for t in [
            Trigger::PriceBelow { threshold: 1200 },
            Trigger::PriceDrop { percent: 10 },
            Trigger::BackInStock,
        ] {
            assert_eq!(
                evaluate(&t, &o, &base(Some(1000), Some(false))),
                Verdict::Lost(LostReason::ItemPaused)
            );
            assert_eq!(
                evaluate(&t, &obs(1, false), &base(Some(1000), Some(false))),
                Verdict::Lost(LostReason::OutOfStock)
            );
        }
    }

    #[test]
    fn recheck_uses_a_send_that_happened_after_detection() {
        let detected_at = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        let detected = base(Some(1000), Some(false));
        let before = LastSent {
            price: 1100,
            in_stock: true,
            sent_at: detected_at - chrono::Duration::hours(1),
            promise: None,
        };
        let after = LastSent {
            sent_at: detected_at + chrono::Duration::seconds(1),
            ..before
        };
        assert_eq!(
            Baseline::for_recheck(&detected, Some(&before), detected_at),
            detected
        );
        assert_eq!(
            Baseline::for_recheck(&detected, None, detected_at),
            detected
        );
        assert_eq!(
            Baseline::for_recheck(&detected, Some(&after), detected_at),
            base(Some(1100), Some(true))
        );
        // A back_in_stock detection that was already announced no longer holds at re-check.
        let rechecked = Baseline::for_recheck(&detected, Some(&after), detected_at);
        assert_eq!(
            evaluate(&Trigger::BackInStock, &obs(1, true), &rechecked),
            Verdict::Lost(LostReason::ConditionLost)
        );
    }

    #[test]
    fn detection_baseline_prefers_the_last_sent_price() {
        let s = LastSent {
            price: 900,
            in_stock: true,
            sent_at: Utc::now(),
            promise: None,
        };
        let with_reference = |price, in_stock| Baseline {
            reference: Some(1000),
            ..base(price, in_stock)
        };
        assert_eq!(
            Baseline::for_detection(Some(&s), Some(1000), Some(false)),
            with_reference(Some(900), Some(false))
        );
        assert_eq!(
            Baseline::for_detection(None, Some(1000), None),
            with_reference(None, None)
        );
    }

    #[test]
    fn trigger_validation_and_keys() {
        assert!(Trigger::PriceBelow { threshold: 0 }.validate().is_err());
        assert!(Trigger::PriceBelow { threshold: 1 }.validate().is_ok());
        assert!(Trigger::PriceDrop { percent: 0 }.validate().is_err());
        assert!(Trigger::PriceDrop { percent: 100 }.validate().is_err());
        assert!(Trigger::PriceDrop { percent: 99 }.validate().is_ok());
        assert_eq!(
            Trigger::PriceBelow { threshold: 1200 }.key(),
            "price_below:1200"
        );
        assert_eq!(Trigger::PriceDrop { percent: 10 }.key(), "price_drop:10");
        assert_eq!(Trigger::BackInStock.key(), "back_in_stock");
        let json = serde_json::to_value(Trigger::PriceBelow { threshold: 5 }).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "price_below", "threshold": 5})
        );
    }

    #[test]
    fn keys_read_back() {
        for t in [
            Trigger::PriceBelow { threshold: 120000 },
            Trigger::PriceDrop { percent: 10 },
            Trigger::BackInStock,
        ] {
            assert_eq!(Trigger::from_key(&t.key()), Some(t));
        }
        for bad in [
            "",
            "price_below",
            "price_below:x",
            "price_drop:010",
            "price_drop:300",
            "soon:1",
        ] {
            assert_eq!(Trigger::from_key(bad), None, "{bad:?}");
        }
    }

    fn any_trigger() -> impl Strategy<Value = Trigger> {
        prop_oneof![
            (1i64..=Trigger::MAX_THRESHOLD).prop_map(|threshold| Trigger::PriceBelow { threshold }),
            (1u8..=99).prop_map(|percent| Trigger::PriceDrop { percent }),
            Just(Trigger::BackInStock),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// A price trigger that holds keeps holding when the price falls further: a lower price
        /// is never "less true".
        #[test]
        fn price_triggers_are_monotone_in_price(
            t in any_trigger(),
            price in 0i64..=Trigger::MAX_THRESHOLD,
            drop in 0i64..=1_000_000,
            reference in proptest::option::of(1i64..=Trigger::MAX_THRESHOLD),
        ) {
            let b = base(reference, Some(false));
            if evaluate(&t, &obs(price, true), &b) == Verdict::Holds {
                prop_assert_eq!(evaluate(&t, &obs(price - drop, true), &b), Verdict::Holds);
            }
        }

        /// Whatever the trigger, a notification that was sent at a price makes that same price
        /// no longer newsworthy for price triggers.
        #[test]
        fn a_sent_price_does_not_fire_again(
            t in any_trigger(),
            price in 1i64..=Trigger::MAX_THRESHOLD,
        ) {
            let sent = base(Some(price), Some(true));
            prop_assert_ne!(evaluate(&t, &obs(price, true), &sent), Verdict::Holds);
        }
    }
}
