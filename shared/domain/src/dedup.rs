//! The dedup key: one notification per (watch, trigger, day, channel).
//!
//! The day is the calendar day of `detected_at` in the device's time zone, so "once a day" means
//! the user's day, not UTC's. It is computed here, once, and stored as a plain `date` column:
//! Postgres rejects `date(timestamptz)` in an index because it depends on the session time zone.

use crate::{Channel, WatchId};
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {0:?}: expected an IANA name such as \"Europe/Berlin\"")]
pub struct UnknownTimeZone(pub String);

/// Parses an IANA time zone name; an empty name means UTC.
pub fn parse_time_zone(name: &str) -> Result<Tz, UnknownTimeZone> {
    if name.is_empty() {
        return Ok(Tz::UTC);
    }
    name.parse::<Tz>()
        .map_err(|_| UnknownTimeZone(name.to_owned()))
}

/// The calendar day of `detected_at` in `tz`.
pub fn dedup_day(detected_at: DateTime<Utc>, tz: Tz) -> NaiveDate {
    detected_at.with_timezone(&tz).date_naive()
}

/// `<watch_id>:<trigger>:<dedup_day>:<channel>`: the JetStream `Nats-Msg-Id` of an
/// EnqueueRequest, and the outbox's unique key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DedupKey {
    pub watch_id: WatchId,
    pub trigger: String,
    pub dedup_day: NaiveDate,
    pub channel: Channel,
}

impl fmt::Display for DedupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.watch_id, self.trigger, self.dedup_day, self.channel
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(y: i32, m: u32, d: u32, h: u32, min: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, h, min, 0).unwrap()
    }

    fn day(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).unwrap()
    }

    #[test]
    fn utc_days_change_at_utc_midnight() {
        assert_eq!(
            dedup_day(at(2026, 11, 30, 23, 59), Tz::UTC),
            day(2026, 11, 30)
        );
        assert_eq!(dedup_day(at(2026, 12, 1, 0, 0), Tz::UTC), day(2026, 12, 1));
    }

    /// Each case: a UTC instant and the local day it falls on in `zone`.
    fn assert_days(zone: &str, cases: &[(DateTime<Utc>, NaiveDate)]) {
        let tz = parse_time_zone(zone).unwrap();
        for &(instant, local) in cases {
            assert_eq!(dedup_day(instant, tz), local, "{instant} in {zone}");
        }
    }

    #[test]
    fn a_time_zone_moves_the_day_boundary() {
        // 23:30 UTC is already tomorrow in Berlin (UTC+1 in winter)...
        assert_days(
            "Europe/Berlin",
            &[(at(2026, 11, 30, 23, 30), day(2026, 12, 1))],
        );
        // ...and 03:00 UTC is still yesterday in New York (UTC-5).
        assert_days(
            "America/New_York",
            &[(at(2026, 12, 1, 3, 0), day(2026, 11, 30))],
        );
        assert_days(
            "Pacific/Auckland",
            &[(at(2026, 11, 30, 11, 0), day(2026, 12, 1))],
        );
    }

    #[test]
    fn dst_changes_keep_local_midnight() {
        assert_days(
            "Europe/Berlin",
            &[
                // Spring forward on 2026-03-29: local midnight is 23:00 UTC before, 22:00 after.
                (at(2026, 3, 28, 22, 59), day(2026, 3, 28)),
                (at(2026, 3, 28, 23, 0), day(2026, 3, 29)),
                (at(2026, 3, 29, 21, 59), day(2026, 3, 29)),
                (at(2026, 3, 29, 22, 0), day(2026, 3, 30)),
                // Fall back on 2026-10-25: the local day is 25 hours long.
                (at(2026, 10, 24, 22, 0), day(2026, 10, 25)),
                (at(2026, 10, 25, 22, 59), day(2026, 10, 25)),
                (at(2026, 10, 25, 23, 0), day(2026, 10, 26)),
            ],
        );
    }

    #[test]
    fn time_zone_names_are_checked() {
        assert_eq!(parse_time_zone(""), Ok(Tz::UTC));
        assert_eq!(parse_time_zone("UTC"), Ok(Tz::UTC));
        assert_eq!(
            parse_time_zone("Mars/Olympus"),
            Err(UnknownTimeZone("Mars/Olympus".into()))
        );
    }

    #[test]
    fn key_format() {
        let id: WatchId = "0193a0f0-0000-7000-8000-000000000001".parse().unwrap();
        let key = DedupKey {
            watch_id: id,
            trigger: "price_below:1200".into(),
            dedup_day: day(2026, 11, 30),
            channel: Channel::WebPush,
        };
        assert_eq!(
            key.to_string(),
            "0193a0f0-0000-7000-8000-000000000001:price_below:1200:2026-11-30:web_push"
        );
    }
}
