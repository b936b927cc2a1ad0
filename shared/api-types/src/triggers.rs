//! A watch's triggers as the api takes and shows them.

use serde::{Deserialize, Serialize};
use tidings_domain::trigger::Trigger;
use utoipa::ToSchema;

/// A trigger and its parameters. Prices are integer minor units (cents).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TriggerSpec {
    /// The price is below `threshold` (and below the last price notified about).
    PriceBelow {
        #[schema(minimum = 1, maximum = 1_000_000_000_000_i64)]
        threshold: i64,
    },
    /// The price fell by at least `percent` % from the last notified price (or the first price
    /// seen after the watch was created).
    PriceDrop {
        #[schema(minimum = 1, maximum = 99)]
        percent: i64,
    },
    /// The item went from out of stock to in stock.
    // A struct variant, not a unit one: serde ignores unknown fields next to the tag of a unit
    // variant even under `deny_unknown_fields`.
    BackInStock {},
}

impl TriggerSpec {
    /// How the api shows `t`.
    pub fn from_trigger(t: &Trigger) -> Self {
        match *t {
            Trigger::PriceBelow { threshold } => TriggerSpec::PriceBelow { threshold },
            Trigger::PriceDrop { percent } => TriggerSpec::PriceDrop {
                percent: i64::from(percent),
            },
            Trigger::BackInStock => TriggerSpec::BackInStock {},
        }
    }
}
