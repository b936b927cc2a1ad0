//! What the user reads. Built from the value re-fetched at send time, never from the detection
//! snapshot (docs/design.md), so the text is true when it is sent.

use crate::item::ItemCode;
use crate::messages::{Declarative, DeclarativeNotification, Payload};
use crate::money::{self, Separators};
use crate::shown;
use crate::texts::{Lang, Said, say};
use crate::trigger::{Baseline, LostReason, Observation, Trigger, Verdict, evaluate};
use crate::{OutboxId, WatchId, validity};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;

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
    let (title, body) = said(n);
    payload(n, title, body, None)
}

/// The notification that withdraws row `withdraws`, which stated `sent` and no longer holds at
/// `n.now`: "Was 9.99 EUR at 10:02, now 15.00 EUR." (times in `tz`), under the withdrawn one's
/// tag, so it takes its place on the screen.
pub fn withdrawal(n: &Notice<'_>, withdraws: OutboxId, sent: &Observation, tz: Tz) -> Payload {
    let lost = match evaluate(n.trigger, n.now, n.baseline) {
        Verdict::Lost(lost) => lost,
        // The re-check sends a withdrawal only when the trigger no longer holds.
        Verdict::Holds => LostReason::ConditionLost,
    };
    let (title, body) = shown::changed(n, lost, sent, tz);
    payload(n, title, body, Some(withdraws))
}

/// What `n`'s trigger says, in the reader's language.
fn said(n: &Notice<'_>) -> (String, String) {
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
    match *trigger {
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
    }
}

/// The payload of `n` saying `title` and `body`.
fn payload(n: &Notice<'_>, title: String, body: String, withdraws: Option<OutboxId>) -> Payload {
    let Notice {
        trigger, item, now, ..
    } = *n;
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
        withdraws,
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

    /// A withdrawal says what changed since the notification it withdraws, in that one's place
    /// (same tag), in the reader's language and time zone.
    #[test]
    fn a_withdrawal_says_what_changed_under_the_withdrawn_ones_tag() {
        use chrono::TimeZone;
        let item = ItemCode::parse("SKU-1").unwrap();
        let at = Utc.with_ymd_and_hms(2026, 12, 3, 9, 2, 0).unwrap();
        let back = Observation::on_sale(1500, "EUR", at + chrono::Duration::minutes(5));
        let sent = Observation::on_sale(999, "EUR", at);
        let below = Trigger::PriceBelow { threshold: 1200 };
        let (watch, withdrawn) = (WatchId::new(), OutboxId::new());
        let notice = Notice {
            id: OutboxId::new(),
            watch,
            trigger: &below,
            item: &item,
            now: &back,
            baseline: &Baseline::default(),
            valid_until: back.observed_at + chrono::Duration::minutes(20),
            item_url: Some("https://shop.example/i/{item}"),
            locale: None,
        };
        let p = withdrawal(&notice, withdrawn, &sent, chrono_tz::Europe::Berlin);
        assert_eq!(p.title, "SKU-1 has changed");
        assert_eq!(p.body, "Was 9.99 EUR at 10:02, now 15.00 EUR.");
        assert_eq!(p.withdraws, Some(withdrawn));
        assert_eq!(p.tag, render(&notice).tag);
        assert_eq!(p.tag, Some(validity::tag(watch, &below)));
        let sold_out = Observation {
            in_stock: false,
            ..back.clone()
        };
        let p = withdrawal(
            &Notice {
                now: &sold_out,
                locale: Some("ja-JP"),
                ..notice
            },
            withdrawn,
            &sent,
            chrono_tz::Asia::Tokyo,
        );
        assert_eq!(p.body, "18:02時点では9.99 EUR、現在 在庫切れ");
        // An alert is not a withdrawal.
        assert_eq!(render(&notice).withdraws, None);
    }
}
