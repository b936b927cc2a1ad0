//! What the user reads. Built from the value re-fetched at send time, never from the detection
//! snapshot (docs/design.md), so the text is true when it is sent.

use crate::item::ItemCode;
use crate::messages::Payload;
use crate::trigger::{Baseline, Observation, Trigger};
use crate::{OutboxId, WatchId, validity};
use chrono::{DateTime, Utc};

/// `1234` minor units → `12.34`. Assumes two decimals, true of the currencies we serve today;
/// a currency table belongs here when zero- or three-decimal currencies arrive.
pub fn format_money(minor: i64, currency: &str) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    let m = minor.unsigned_abs();
    let amount = format!("{sign}{}.{:02}", m / 100, m % 100);
    if currency.is_empty() {
        amount
    } else {
        format!("{amount} {currency}")
    }
}

/// What a notification is about: row `id` of `watch`, whose `trigger` holds for `item` at the
/// re-checked observation `now`, current until `valid_until`.
pub struct Notice<'a> {
    pub id: OutboxId,
    pub watch: WatchId,
    pub trigger: &'a Trigger,
    pub item: &'a ItemCode,
    pub now: &'a Observation,
    pub baseline: &'a Baseline,
    pub valid_until: DateTime<Utc>,
    /// A template with `{item}` for the link the notification opens.
    pub item_url: Option<&'a str>,
}

/// The notification a person is shown for `n`.
pub fn render(n: &Notice<'_>) -> Payload {
    let Notice {
        trigger,
        item,
        now,
        baseline,
        ..
    } = *n;
    let price = format_money(now.price, &now.currency);
    let (title, body) = match *trigger {
        Trigger::PriceBelow { threshold } => (
            format!("{item} is below your price"),
            format!(
                "Now {price} (your limit: {}).",
                format_money(threshold, &now.currency)
            ),
        ),
        Trigger::PriceDrop { percent } => {
            let was = baseline
                .price
                .or(baseline.reference)
                .map(|b| format_money(b, &now.currency));
            (
                format!("{item} dropped at least {percent}%"),
                match was {
                    Some(was) => format!("Now {price}, down from {was}."),
                    None => format!("Now {price}."),
                },
            )
        }
        Trigger::BackInStock => (
            format!("{item} is back in stock"),
            format!("Available now at {price}."),
        ),
    };
    Payload {
        title,
        body,
        id: Some(n.id),
        tag: Some(validity::tag(n.watch, trigger)),
        observed_at: Some(now.observed_at),
        valid_until: Some(n.valid_until),
        url: n.item_url.map(|t| t.replace("{item}", item.as_str())),
        data: serde_json::json!({
            "item": item.as_str(),
            "trigger": trigger.key(),
            "price": now.price,
            "currency": now.currency,
            "in_stock": now.in_stock,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn obs(price: i64) -> Observation {
        Observation::on_sale(price, "EUR", Utc::now())
    }

    #[test]
    fn money() {
        assert_eq!(format_money(123456, "EUR"), "1234.56 EUR");
        assert_eq!(format_money(5, ""), "0.05");
        assert_eq!(format_money(-150, "USD"), "-1.50 USD");
    }

    #[test]
    fn the_body_carries_the_current_price() {
        let item = ItemCode::parse("SKU-1").unwrap();
        let id = OutboxId::new();
        let watch = WatchId::new();
        let below = Trigger::PriceBelow { threshold: 120000 };
        let now = obs(110050);
        let valid_until = now.observed_at + chrono::Duration::minutes(20);
        let notice = Notice {
            id,
            watch,
            trigger: &below,
            item: &item,
            now: &now,
            baseline: &Baseline::default(),
            valid_until,
            item_url: Some("https://shop.example/i/{item}"),
        };
        let p = render(&notice);
        assert_eq!(p.title, "SKU-1 is below your price");
        assert_eq!(p.body, "Now 1100.50 EUR (your limit: 1200.00 EUR).");
        assert_eq!(p.url.as_deref(), Some("https://shop.example/i/SKU-1"));
        assert_eq!(p.data["price"], 110050);
        assert_eq!(p.id, Some(id));
        assert_eq!(p.tag, Some(validity::tag(watch, &below)));
        assert_eq!(p.observed_at, Some(now.observed_at));
        assert_eq!(p.valid_until, Some(valid_until));
        let p = render(&Notice {
            trigger: &Trigger::PriceDrop { percent: 10 },
            now: &obs(900),
            baseline: &Baseline {
                price: None,
                reference: Some(1000),
                in_stock: None,
            },
            item_url: None,
            ..notice
        });
        assert_eq!(p.body, "Now 9.00 EUR, down from 10.00 EUR.");
    }
}
