//! What the user reads. Built from the value re-fetched at send time, never from the detection
//! snapshot (docs/design.md), so the text is true when it is sent.

use crate::item::ItemCode;
use crate::messages::{Declarative, DeclarativeNotification, Payload};
use crate::money::{self, Separators};
use crate::texts::{Lang, Said, say};
use crate::trigger::{Baseline, Observation, Trigger};
use crate::{OutboxId, WatchId, validity};
use chrono::{DateTime, Utc};

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
    /// The device's BCP 47 locale (`ja-JP`): the language and number format it reads.
    pub locale: Option<&'a str>,
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
    let locale = n.locale.unwrap_or_default();
    let (lang, sep) = (Lang::of(locale), Separators::of(locale));
    let amount = |minor| money::format(minor, &now.currency, sep);
    let price = amount(now.price);
    let item_code = item.as_str();
    let said = match *trigger {
        Trigger::PriceBelow { threshold } => {
            let limit = amount(threshold);
            say(
                lang,
                Said::Below {
                    item: item_code,
                    price: &price,
                    limit: &limit,
                },
            )
        }
        Trigger::PriceDrop { percent } => {
            let was = baseline.price.or(baseline.reference).map(amount);
            say(
                lang,
                Said::Dropped {
                    item: item_code,
                    percent,
                    price: &price,
                    was: was.as_deref(),
                },
            )
        }
        Trigger::BackInStock => say(
            lang,
            Said::Restocked {
                item: item_code,
                price: &price,
            },
        ),
    };
    let (title, body) = said;
    let url = n.item_url.map(|t| t.replace("{item}", item.as_str()));
    let tag = validity::tag(n.watch, trigger);
    let declarative = url.clone().map(|navigate| Declarative {
        web_push: Declarative::WEB_PUSH,
        notification: DeclarativeNotification {
            title: title.clone(),
            body: body.clone(),
            navigate,
            tag: Some(tag.clone()),
            lang: n.locale.map(str::to_owned),
            timestamp: Some(now.observed_at.timestamp_millis()),
        },
        mutable: true,
    });
    Payload {
        title,
        body,
        id: Some(n.id),
        tag: Some(tag),
        observed_at: Some(now.observed_at),
        valid_until: Some(n.valid_until),
        url,
        data: serde_json::json!({
            "item": item.as_str(),
            "trigger": trigger.key(),
            "price": now.price,
            "currency": now.currency,
            "in_stock": now.in_stock,
        }),
        declarative,
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
            locale: None,
        };
        let p = render(&notice);
        assert_eq!(p.title, "SKU-1 is below your price");
        assert_eq!(p.body, "Now 1,100.50 EUR (your limit: 1,200.00 EUR).");
        assert_eq!(p.url.as_deref(), Some("https://shop.example/i/SKU-1"));
        assert_eq!(p.data["price"], 110050);
        assert_eq!(p.id, Some(id));
        assert_eq!(p.tag, Some(validity::tag(watch, &below)));
        assert_eq!(p.observed_at, Some(now.observed_at));
        assert_eq!(p.valid_until, Some(valid_until));
        // The same notification for Safari's Declarative Web Push, which a worker may correct.
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["web_push"], 8030);
        assert_eq!(json["mutable"], true);
        assert_eq!(json["notification"]["title"], p.title);
        assert_eq!(json["notification"]["body"], p.body);
        assert_eq!(
            json["notification"]["navigate"],
            "https://shop.example/i/SKU-1"
        );
        assert_eq!(json["notification"]["tag"], json["tag"]);
        assert_eq!(serde_json::from_value::<Payload>(json).unwrap(), p);
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

    #[test]
    fn the_reader_gets_their_language_and_the_currencys_own_decimals() {
        let item = ItemCode::parse("SKU-1").unwrap();
        let yen = Observation::on_sale(1100, "JPY", Utc::now());
        let below = Trigger::PriceBelow { threshold: 1200 };
        let notice = Notice {
            id: OutboxId::new(),
            watch: WatchId::new(),
            trigger: &below,
            item: &item,
            now: &yen,
            baseline: &Baseline::default(),
            valid_until: yen.observed_at,
            item_url: None,
            locale: Some("ja-JP"),
        };
        let p = render(&notice);
        assert_eq!(p.title, "SKU-1が指定価格を下回りました");
        assert_eq!(p.body, "現在 1,100 JPY（指定価格: 1,200 JPY）");
        let euros = Observation::on_sale(123_456, "EUR", Utc::now());
        let p = render(&Notice {
            now: &euros,
            trigger: &Trigger::BackInStock,
            locale: Some("de-DE"),
            ..notice
        });
        assert_eq!(p.body, "Available now at 1.234,56 EUR.");
    }
}
