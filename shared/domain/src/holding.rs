//! When a notification that holds may go out, by its reader's preferences (issue #57, a first
//! step: the rules, pure; nothing holds a row yet): quiet hours in the reader's time zone, a cap
//! on notifications per rolling window, and a digest schedule. A held row waits in the outbox
//! until its release and is re-checked then like any send, so what is released is still true.
//!
//! Times of day are the reader's wall clock: a window or a digest hour that a DST change skips
//! starts at the first instant after the gap, and one that a change repeats counts from its
//! first occurrence (a start) or to its second (an end), so quiet hours are never cut short.

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveTime, TimeZone, Timelike, Utc,
    Weekday,
};
use chrono_tz::Tz;

use crate::names::names;

names! {
    /// Why a row waits past its detection (`outbox.held`).
    pub enum Held("held reason") {
        /// The reader's quiet hours.
        QuietHours = "quiet_hours",
        /// The reader's cap on notifications per window was reached.
        Cap = "cap",
        /// It goes out in the reader's next digest.
        Digest = "digest",
    }
}

/// The weekdays a quiet window starts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Days(u8);

impl Days {
    pub const EVERY: Days = Days(0x7f);

    pub fn of(days: &[Weekday]) -> Days {
        Days(
            days.iter()
                .fold(0, |m, d| m | 1 << d.num_days_from_monday()),
        )
    }

    pub fn contains(self, day: Weekday) -> bool {
        self.0 & (1 << day.num_days_from_monday()) != 0
    }

    /// How many days these are.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Quiet hours, e.g. 22:00–07:30, starting on `days`; an end at or before the start is the next
/// day's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuietHours {
    pub start: NaiveTime,
    pub end: NaiveTime,
    pub days: Days,
}

/// The instant `date` `time` names in `tz`: in a gap, the first instant after it; in a fold, the
/// first occurrence (`late`: the second).
fn instant(tz: Tz, date: NaiveDate, time: NaiveTime, late: bool) -> DateTime<Utc> {
    let mut local = date.and_time(time);
    // Gaps are at most a few hours; past that the zone data would be broken, and UTC serves.
    for _ in 0..16 {
        match tz.from_local_datetime(&local) {
            LocalResult::Single(t) => return t.with_timezone(&Utc),
            LocalResult::Ambiguous(a, b) => {
                return if late { b } else { a }.with_timezone(&Utc);
            }
            LocalResult::None => local += Duration::minutes(15),
        }
    }
    Utc.from_utc_datetime(&local)
}

impl QuietHours {
    /// The window that started on `date`, as instants.
    fn window(&self, tz: Tz, date: NaiveDate) -> (DateTime<Utc>, DateTime<Utc>) {
        let end_date = if self.end <= self.start {
            date.succ_opt().unwrap_or(date)
        } else {
            date
        };
        (
            instant(tz, date, self.start, false),
            instant(tz, end_date, self.end, true),
        )
    }

    /// When a notification due `at` may go: `at` outside the quiet hours, else their end.
    pub fn release(&self, at: DateTime<Utc>, tz: Tz) -> DateTime<Utc> {
        let today = at.with_timezone(&tz).date_naive();
        // A window that started yesterday may still run (22:00–07:30).
        for date in [today.pred_opt().unwrap_or(today), today] {
            if !self.days.contains(date.weekday()) {
                continue;
            }
            let (start, end) = self.window(tz, date);
            if start <= at && at < end {
                return end;
            }
        }
        at
    }
}

/// At most `max` notifications in any `window` (e.g. 5 a day).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    pub max: u32,
    pub window: Duration,
}

impl Cap {
    /// When a notification due `at` may go, given when the reader's earlier ones went (`sent`,
    /// any order, none after `at`): `at` while fewer than `max` went in the window before it,
    /// else when enough of them have left it.
    pub fn release(&self, sent: &[DateTime<Utc>], at: DateTime<Utc>) -> DateTime<Utc> {
        let mut recent: Vec<DateTime<Utc>> = (sent.iter().copied())
            .filter(|t| *t > at - self.window && *t <= at)
            .collect();
        let max = usize::try_from(self.max.max(1)).unwrap_or(usize::MAX);
        if recent.len() < max {
            return at;
        }
        recent.sort();
        // Once the oldest `len - max + 1` have left the window, `max - 1` remain in it.
        recent[recent.len() - max] + self.window
    }
}

/// When a reader's digest goes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digest {
    /// At the top of every hour of the reader's clock.
    Hourly,
    /// Every day at this time.
    Daily(NaiveTime),
    /// Every week on this day at this time.
    Weekly(Weekday, NaiveTime),
}

impl Digest {
    /// The first digest strictly after `after`.
    pub fn next(&self, after: DateTime<Utc>, tz: Tz) -> DateTime<Utc> {
        let local = after.with_timezone(&tz);
        let today = local.date_naive();
        let (time, step) = match self {
            Digest::Hourly => {
                let hour = NaiveTime::from_hms_opt(local.time().hour(), 0, 0);
                (hour.unwrap_or(NaiveTime::MIN), Duration::hours(1))
            }
            Digest::Daily(at) | Digest::Weekly(_, at) => (*at, Duration::days(1)),
        };
        let mut at = today.and_time(time);
        for _ in 0..(24 * 8) {
            let wanted_day = match self {
                Digest::Weekly(day, _) => at.date().weekday() == *day,
                _ => true,
            };
            let t = instant(tz, at.date(), at.time(), false);
            if wanted_day && t > after {
                return t;
            }
            at += step;
        }
        after + Duration::weeks(1)
    }
}

/// A reader's preferences; none set: every notification goes at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preferences {
    pub quiet: Option<QuietHours>,
    pub cap: Option<Cap>,
    pub digest: Option<Digest>,
}

/// Whether a notification that holds at `at` waits, why, and until when. Urgent ones never
/// wait. A digest reader's go into the next digest; otherwise the release is the first instant
/// both outside the quiet hours and under the cap (`sent`: when the reader's earlier ones went).
pub fn hold(
    p: &Preferences,
    urgent: bool,
    at: DateTime<Utc>,
    tz: Tz,
    sent: &[DateTime<Utc>],
) -> Option<(Held, DateTime<Utc>)> {
    if urgent {
        return None;
    }
    if let Some(digest) = p.digest {
        return Some((Held::Digest, digest.next(at, tz)));
    }
    let quiet = |t| p.quiet.map_or(t, |q| q.release(t, tz));
    let capped = |t| p.cap.map_or(t, |c| c.release(sent, t));
    let why = if quiet(at) > at {
        Held::QuietHours
    } else if capped(at) > at {
        Held::Cap
    } else {
        return None;
    };
    // Each step only moves later, and a cap's release leaves the window for good: a few rounds
    // reach the instant both allow.
    let mut t = at;
    for _ in 0..8 {
        let next = capped(quiet(t));
        if next == t {
            break;
        }
        t = next;
    }
    Some((why, t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hm(h: u32, m: u32) -> NaiveTime {
        NaiveTime::from_hms_opt(h, m, 0).unwrap()
    }

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    const NIGHT: QuietHours = QuietHours {
        start: NaiveTime::from_hms_opt(22, 0, 0).unwrap(),
        end: NaiveTime::from_hms_opt(7, 30, 0).unwrap(),
        days: Days::EVERY,
    };

    #[test]
    fn overnight_quiet_hours_release_at_their_end_in_the_readers_zone() {
        let tokyo: Tz = "Asia/Tokyo".parse().unwrap();
        // 23:10 in Tokyo is 14:10 UTC: held until 07:30 Tokyo, 22:30 UTC.
        let at = utc("2026-12-04T14:10:00Z");
        assert_eq!(NIGHT.release(at, tokyo), utc("2026-12-04T22:30:00Z"));
        // 03:00 Tokyo (the window started the day before).
        assert_eq!(
            NIGHT.release(utc("2026-12-04T18:00:00Z"), tokyo),
            utc("2026-12-04T22:30:00Z")
        );
        // 12:00 Tokyo: not quiet.
        let noon = utc("2026-12-05T03:00:00Z");
        assert_eq!(NIGHT.release(noon, tokyo), noon);
        // The same instant for a UTC reader (14:10 UTC) is not quiet.
        assert_eq!(NIGHT.release(at, Tz::UTC), at);
    }

    #[test]
    fn a_dst_change_inside_quiet_hours_moves_the_release_with_the_clock() {
        let berlin: Tz = "Europe/Berlin".parse().unwrap();
        let q = QuietHours {
            start: hm(1, 0),
            end: hm(4, 0),
            days: Days::EVERY,
        };
        // 2026-03-29: 02:00 CET becomes 03:00 CEST. 01:30 CET is 00:30 UTC; 04:00 CEST is 02:00 UTC.
        assert_eq!(
            q.release(utc("2026-03-29T00:30:00Z"), berlin),
            utc("2026-03-29T02:00:00Z")
        );
        // 2026-10-25: 03:00 CEST becomes 02:00 CET. 01:30 CEST is 23:30 UTC; 04:00 CET 03:00 UTC.
        assert_eq!(
            q.release(utc("2026-10-24T23:30:00Z"), berlin),
            utc("2026-10-25T03:00:00Z")
        );
        // A window starting in the skipped hour starts when the clock resumes (03:00 CEST).
        let gap = QuietHours {
            start: hm(2, 30),
            end: hm(5, 0),
            days: Days::EVERY,
        };
        assert_eq!(
            gap.release(utc("2026-03-29T00:45:00Z"), berlin),
            utc("2026-03-29T00:45:00Z")
        );
        assert_eq!(
            gap.release(utc("2026-03-29T01:10:00Z"), berlin),
            utc("2026-03-29T03:00:00Z")
        );
    }

    #[test]
    fn quiet_hours_keep_to_their_weekdays() {
        let weekdays = QuietHours {
            days: Days::of(&[
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri,
            ]),
            ..NIGHT
        };
        // Friday 23:00 starts a window (Friday's); Saturday 23:00 does not.
        assert_eq!(
            weekdays.release(utc("2026-12-04T23:00:00Z"), Tz::UTC),
            utc("2026-12-05T07:30:00Z")
        );
        let saturday = utc("2026-12-05T23:00:00Z");
        assert_eq!(weekdays.release(saturday, Tz::UTC), saturday);
    }

    #[test]
    fn the_sixth_of_five_a_day_waits_for_the_first_to_leave_the_window() {
        let cap = Cap {
            max: 5,
            window: Duration::days(1),
        };
        let first = utc("2026-12-04T08:00:00Z");
        let sent: Vec<_> = (0..5).map(|i| first + Duration::hours(i)).collect();
        let sixth = utc("2026-12-04T15:00:00Z");
        assert_eq!(cap.release(&sent[..4], sixth), sixth);
        assert_eq!(cap.release(&sent, sixth), first + Duration::days(1));
    }

    #[test]
    fn digests_go_at_the_next_hour_day_or_week_of_the_readers_clock() {
        let tokyo: Tz = "Asia/Tokyo".parse().unwrap();
        let at = utc("2026-12-04T14:10:00Z"); // Friday 23:10 in Tokyo
        assert_eq!(Digest::Hourly.next(at, tokyo), utc("2026-12-04T15:00:00Z"));
        assert_eq!(
            Digest::Daily(hm(8, 0)).next(at, tokyo),
            utc("2026-12-04T23:00:00Z")
        );
        assert_eq!(
            Digest::Weekly(Weekday::Mon, hm(8, 0)).next(at, tokyo),
            utc("2026-12-06T23:00:00Z")
        );
        // India is UTC+05:30: its top of the hour is at :30 UTC.
        let kolkata: Tz = "Asia/Kolkata".parse().unwrap();
        assert_eq!(
            Digest::Hourly.next(at, kolkata),
            utc("2026-12-04T14:30:00Z")
        );
        // Exactly at a digest time, the next one.
        let eight = utc("2026-12-04T23:00:00Z");
        assert_eq!(
            Digest::Daily(hm(8, 0)).next(eight, tokyo),
            utc("2026-12-05T23:00:00Z")
        );
    }

    #[test]
    fn urgent_never_waits_and_quiet_hours_and_caps_combine() {
        let p = Preferences {
            quiet: Some(NIGHT),
            cap: Some(Cap {
                max: 1,
                window: Duration::hours(12),
            }),
            digest: None,
        };
        let at = utc("2026-12-04T23:00:00Z");
        assert_eq!(hold(&p, true, at, Tz::UTC, &[]), None);
        assert_eq!(
            hold(&p, false, at, Tz::UTC, &[]),
            Some((Held::QuietHours, utc("2026-12-05T07:30:00Z")))
        );
        // One went at 21:00: the cap holds it to 09:00, past the quiet end.
        let sent = [utc("2026-12-04T21:00:00Z")];
        assert_eq!(
            hold(&p, false, at, Tz::UTC, &sent),
            Some((Held::QuietHours, utc("2026-12-05T09:00:00Z")))
        );
        let noon = utc("2026-12-05T12:00:00Z");
        assert_eq!(hold(&p, false, noon, Tz::UTC, &[]), None);
        let digest = Preferences {
            digest: Some(Digest::Daily(hm(8, 0))),
            ..p
        };
        assert_eq!(
            hold(&digest, false, noon, Tz::UTC, &[]),
            Some((Held::Digest, utc("2026-12-06T08:00:00Z")))
        );
        assert_eq!(hold(&digest, true, noon, Tz::UTC, &[]), None);
    }

    const ZONES: [&str; 5] = [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Tokyo",
        "Australia/Lord_Howe",
    ];

    proptest! {
        /// A release is never earlier than asked, and is itself outside the quiet hours.
        #[test]
        fn a_release_is_never_early_and_never_quiet(
            at in 1_700_000_000i64..1_900_000_000,
            start in 0u32..24 * 4, end in 0u32..24 * 4, days in 1u8..0x80, zone in 0usize..5,
        ) {
            let q = QuietHours {
                start: hm(start / 4, start % 4 * 15),
                end: hm(end / 4, end % 4 * 15),
                days: Days(days),
            };
            let tz: Tz = ZONES[zone].parse().unwrap();
            let at = DateTime::from_timestamp(at, 0).unwrap();
            let r = q.release(at, tz);
            prop_assert!(r >= at);
            prop_assert!(r - at <= Duration::hours(26));
            if start != end {
                prop_assert_eq!(q.release(r, tz), r, "released into quiet hours");
            }
        }

        /// After a cap's release, fewer than `max` went in the window before it.
        #[test]
        fn a_caps_release_leaves_room(
            offsets in proptest::collection::vec(0i64..86_400, 0..20), max in 1u32..6,
        ) {
            let at = utc("2026-12-04T12:00:00Z");
            let cap = Cap { max, window: Duration::days(1) };
            let sent: Vec<_> = offsets.iter().map(|s| at - Duration::seconds(*s)).collect();
            let r = cap.release(&sent, at);
            prop_assert!(r >= at);
            let counted = sent.iter().filter(|t| **t > r - cap.window && **t <= r).count();
            prop_assert!(counted < max as usize);
        }

        /// The next digest is after the moment asked, and at most a period (and a DST hour) on.
        #[test]
        fn the_next_digest_is_soon_after(at in 1_700_000_000i64..1_900_000_000, zone in 0usize..5, h in 0u32..24) {
            let tz: Tz = ZONES[zone].parse().unwrap();
            let at = DateTime::from_timestamp(at, 0).unwrap();
            for (d, period) in [
                (Digest::Hourly, Duration::hours(1)),
                (Digest::Daily(hm(h, 0)), Duration::days(1)),
                (Digest::Weekly(Weekday::Wed, hm(h, 0)), Duration::weeks(1)),
            ] {
                let next = d.next(at, tz);
                prop_assert!(next > at);
                prop_assert!(next - at <= period + Duration::hours(1), "{:?}: {} → {}", d, at, next);
            }
        }
    }
}
