//! Checked again when shown (docs/design.md, *True on the screen*): when a device is about to
//! show a notification, the value it stated is compared with the item's current one, and the
//! device is told what to show.

use crate::money::{self, Separators};
use crate::names::names;
use crate::notification::{Notice, render};
use crate::texts::{Lang, Now, Said, say};
use crate::trigger::{LostReason, Observation, Verdict, evaluate};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;

names! {
    /// What a device showed for a notification.
    pub enum Shown("shown") {
        /// The notification as sent: it still held, at the same value.
        AsSent = "as_sent",
        /// It still held, at another value, which was shown instead.
        Updated = "updated",
        /// It no longer held: the device showed what changed.
        Corrected = "corrected",
        /// The api could not be asked in time: the device showed the sent text "as of" its time.
        AsOf = "as_of",
    }
}

/// What to show, with whether the notification still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Showing {
    pub holds: bool,
    pub shown: Shown,
    pub title: String,
    pub body: String,
}

/// What to show for notice `n`, whose `now` is the item's current value, when it said `sent`.
/// A notification holds while its trigger still holds against the baseline it was sent on; it
/// is then shown with the current value (the same text when nothing moved). One that stopped
/// holding says what it was at the sent value's time (in `tz`) and what it is now.
pub fn showing(n: &Notice<'_>, sent: &Observation, tz: Tz) -> Showing {
    match evaluate(n.trigger, n.now, n.baseline) {
        Verdict::Holds => {
            let p = render(n);
            let same = n.now.price == sent.price && n.now.currency == sent.currency;
            Showing {
                holds: true,
                shown: if same { Shown::AsSent } else { Shown::Updated },
                title: p.title,
                body: p.body,
            }
        }
        Verdict::Lost(lost) => {
            let (title, body) = changed(n, lost, sent, tz);
            Showing {
                holds: false,
                shown: Shown::Corrected,
                title,
                body,
            }
        }
    }
}

/// What changed since notice `n` stated `sent`, now that it no longer holds for `lost`: "Was
/// 9.99 EUR at 10:02, now 15.00 EUR." (the time in `tz`), in the reader's language.
pub fn changed(n: &Notice<'_>, lost: LostReason, sent: &Observation, tz: Tz) -> (String, String) {
    let locale = n.locale.unwrap_or_default();
    let sep = Separators::of(locale);
    let was = money::format(sent.price, &sent.currency, sep);
    let now_price = money::format(n.now.price, &n.now.currency, sep);
    let now = match lost {
        LostReason::ConditionLost => Now::Price(&now_price),
        LostReason::OutOfStock => Now::SoldOut,
        LostReason::ItemPaused => Now::Unavailable,
    };
    let at = local_time(sent.observed_at, tz);
    say(
        Lang::of(locale),
        Said::Changed {
            item: n.item.as_str(),
            was: &was,
            at: &at,
            now,
        },
    )
}

/// `HH:MM` of `at` in `tz`.
pub fn local_time(at: DateTime<Utc>, tz: Tz) -> String {
    at.with_timezone(&tz).format("%H:%M").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trigger::{Baseline, Trigger};
    use crate::{ItemCode, OutboxId, WatchId};
    use chrono::TimeZone;

    fn at_10_02() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 3, 9, 2, 0).unwrap()
    }

    fn obs(price: i64) -> Observation {
        Observation::on_sale(price, "EUR", at_10_02())
    }

    fn check(now: &Observation, locale: Option<&str>) -> Showing {
        let item = ItemCode::parse("SKU-1").unwrap();
        let below = Trigger::PriceBelow { threshold: 1200 };
        let n = Notice {
            id: OutboxId::new(),
            watch: WatchId::new(),
            trigger: &below,
            item: &item,
            now,
            baseline: &Baseline::default(),
            valid_until: at_10_02(),
            item_url: None,
            locale,
        };
        showing(&n, &obs(999), chrono_tz::Europe::Berlin)
    }

    #[test]
    fn a_notification_that_still_holds_is_shown_as_sent_or_with_the_new_value() {
        let same = check(&obs(999), None);
        assert_eq!((same.holds, same.shown), (true, Shown::AsSent));
        assert_eq!(same.body, "Now 9.99 EUR (your limit: 12.00 EUR).");
        let lower = check(&obs(950), None);
        assert_eq!((lower.holds, lower.shown), (true, Shown::Updated));
        assert_eq!(lower.body, "Now 9.50 EUR (your limit: 12.00 EUR).");
    }

    #[test]
    fn one_that_broke_says_what_it_was_when_and_what_it_is_now() {
        let back = check(&obs(1500), None);
        assert_eq!((back.holds, back.shown), (false, Shown::Corrected));
        assert_eq!(back.title, "SKU-1 has changed");
        // 09:02 UTC is 10:02 in Berlin, where the device lives.
        assert_eq!(back.body, "Was 9.99 EUR at 10:02, now 15.00 EUR.");
        let gone = Observation {
            in_stock: false,
            ..obs(999)
        };
        assert_eq!(
            check(&gone, None).body,
            "Was 9.99 EUR at 10:02, now sold out."
        );
        let paused = Observation {
            paused: true,
            ..obs(999)
        };
        assert_eq!(
            check(&paused, Some("ja-JP")).body,
            "10:02時点では9.99 EUR、現在 販売停止中"
        );
    }
}
