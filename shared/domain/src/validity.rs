//! How long a notification stays true enough to show, and how the push service and the screen
//! tell one watch's notifications apart (docs/design.md, *True on the screen*).
//!
//! A notification is built from the value its re-check saw. That value is worth showing as
//! current for a while, and a while depends on what changed: a price moves sooner than a restock
//! sells out. So each trigger kind has a validity, and a notification's `valid_until` is its
//! re-check plus that validity. The push service may hold the message no longer than that (its
//! `TTL`), and a push that could not go out before it is withheld rather than sent late.
//!
//! The push `Topic` and the notification `tag` name the watch and the trigger, not the row: a
//! newer notification of the same watch and trigger replaces an older one still waiting in the
//! push service (RFC 8030 §5.4) and the one on the screen. Two triggers of one watch say two
//! different things ("below 12.00", "down 10 %") and keep separate places.

use crate::WatchId;
use crate::trigger::Trigger;
use chrono::{DateTime, Utc};
use sha2::Digest;
use std::time::Duration;

/// How long a notification of each trigger kind may be shown as current after its re-check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// `price_below` and `price_drop`.
    pub price: Duration,
    /// `back_in_stock`.
    pub stock: Duration,
}

impl Default for Validity {
    fn default() -> Self {
        Validity {
            price: Duration::from_secs(20 * 60),
            stock: Duration::from_secs(60 * 60),
        }
    }
}

impl Validity {
    /// The validity of a notification of `trigger`.
    pub fn of(&self, trigger: &Trigger) -> Duration {
        match trigger {
            Trigger::PriceBelow { .. } | Trigger::PriceDrop { .. } => self.price,
            Trigger::BackInStock => self.stock,
        }
    }

    /// The instant a notification of `trigger` re-checked at `checked_at` stops being current.
    pub fn until(&self, trigger: &Trigger, checked_at: DateTime<Utc>) -> DateTime<Utc> {
        let validity =
            chrono::Duration::from_std(self.of(trigger)).unwrap_or(chrono::TimeDelta::MAX);
        checked_at
            .checked_add_signed(validity)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// Whole seconds the push service may hold a message sent at `now` that is current until
/// `valid_until`: what is left of its validity, rounded down so the message never outlives it,
/// and at most `max` (the operator's TTL). `None` once nothing is left: the message must not go.
pub fn ttl(valid_until: DateTime<Utc>, now: DateTime<Utc>, max: Duration) -> Option<u32> {
    let left = (valid_until - now).to_std().ok().filter(|l| !l.is_zero())?;
    // `max` is a TTL of days at most, far below `u32` seconds.
    Some(u32::try_from(left.min(max).as_secs()).unwrap_or(u32::MAX))
}

/// The longest `Topic` Web Push allows: 32 characters of the URL-safe base64 alphabet.
pub const MAX_TOPIC_LEN: usize = 32;

/// The Web Push `Topic` of a watch's notifications of `trigger`: 128 bits of SHA-256 over the
/// watch and the trigger's key, as 32 hex characters (hex is within base64url and fits the
/// limit). Stable across releases and processes: a topic sent by one dispatcher must replace one
/// sent by another.
pub fn topic(watch: WatchId, trigger: &Trigger) -> String {
    hashed_topic(&[watch.0.as_bytes(), trigger.key().as_bytes()])
}

/// A `Topic` naming `parts`: 128 bits of their SHA-256, as 32 hex characters.
pub fn hashed_topic(parts: &[&[u8]]) -> String {
    let mut h = sha2::Sha256::new();
    for part in parts {
        h.update(part);
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(MAX_TOPIC_LEN);
    for b in &digest[..MAX_TOPIC_LEN / 2] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The notification `tag` of a watch's notifications of `trigger`: a browser shows a newer
/// notification with the same tag in place of the older one (and a redelivery of one row once).
pub fn tag(watch: WatchId, trigger: &Trigger) -> String {
    format!("{}/{}", watch.0.simple(), trigger.key())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_price_is_current_for_less_time_than_a_restock() {
        let v = Validity::default();
        let drop = Trigger::PriceDrop { percent: 10 };
        assert_eq!(v.until(&drop, at(0)), at(20 * 60));
        assert_eq!(v.until(&Trigger::BackInStock, at(0)), at(3600));
        assert!(v.of(&Trigger::PriceBelow { threshold: 1 }) < v.of(&Trigger::BackInStock));
    }

    #[test]
    fn the_ttl_is_what_is_left_of_the_validity_at_most_the_operators() {
        let hour = Duration::from_secs(3600);
        assert_eq!(ttl(at(1200), at(0), hour), Some(1200));
        assert_eq!(ttl(at(1200), at(1199), hour), Some(1));
        assert_eq!(ttl(at(7200), at(0), hour), Some(3600));
        // Less than a second left: TTL 0 asks for delivery only to a device online now.
        assert_eq!(
            ttl(at(1), at(0) + chrono::Duration::milliseconds(500), hour),
            Some(0)
        );
        assert_eq!(ttl(at(1200), at(1200), hour), None);
        assert_eq!(ttl(at(1200), at(1300), hour), None);
    }

    #[test]
    fn a_topic_is_pinned_so_every_release_names_a_watch_alike() {
        let watch = WatchId(uuid::Uuid::from_u128(
            0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
        ));
        assert_eq!(
            topic(watch, &Trigger::BackInStock),
            "2d434a757fef64f53e7a09549cb34709"
        );
    }

    #[test]
    fn tags_name_the_watch_and_the_trigger() {
        let watch = WatchId(uuid::Uuid::from_u128(1));
        assert_eq!(
            tag(watch, &Trigger::PriceBelow { threshold: 1200 }),
            "00000000000000000000000000000001/price_below:1200"
        );
    }

    fn any_trigger() -> impl Strategy<Value = Trigger> {
        prop_oneof![
            any::<i64>().prop_map(|threshold| Trigger::PriceBelow { threshold }),
            (1u8..=100).prop_map(|percent| Trigger::PriceDrop { percent }),
            Just(Trigger::BackInStock),
        ]
    }

    proptest! {
        #[test]
        fn topics_fit_web_push_and_separate_watches_and_triggers(
            a in any::<u128>(), b in any::<u128>(), t in any_trigger(), u in any_trigger(),
        ) {
            let (wa, wb) = (WatchId(uuid::Uuid::from_u128(a)), WatchId(uuid::Uuid::from_u128(b)));
            let ta = topic(wa, &t);
            prop_assert_eq!(ta.len(), MAX_TOPIC_LEN);
            prop_assert!(ta.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
            prop_assert_eq!(&ta, &topic(wa, &t));
            prop_assert_eq!(ta == topic(wb, &u), a == b && t == u);
            prop_assert_eq!(tag(wa, &t) == tag(wb, &u), a == b && t == u);
        }

        #[test]
        fn a_ttl_never_outlives_the_validity_nor_the_operators_bound(
            until in -10_000i64..10_000, now in -10_000i64..10_000, max in 0u64..20_000,
        ) {
            let max = Duration::from_secs(max);
            match ttl(at(until), at(now), max) {
                None => prop_assert!(until <= now),
                Some(secs) => {
                    prop_assert!(until > now);
                    prop_assert!(i64::from(secs) <= until - now);
                    prop_assert!(u64::from(secs) <= max.as_secs());
                }
            }
        }

        #[test]
        fn valid_until_is_the_recheck_plus_the_kinds_validity(
            t in any_trigger(), price in 0u64..100_000, stock in 0u64..100_000, checked in 0i64..1_000_000,
        ) {
            let v = Validity { price: Duration::from_secs(price), stock: Duration::from_secs(stock) };
            let until = v.until(&t, at(checked));
            prop_assert_eq!((until - at(checked)).to_std().unwrap(), v.of(&t));
        }
    }
}
