//! How long outbox rows are kept, and which weekly partitions that means: the weeks to have
//! ready ahead of time and the expired weeks to drop. Pure: the dispatcher's retention loop reads
//! what partitions exist and acts on the [`Plan`]; the database re-checks every drop.

use chrono::{Datelike, Duration, NaiveDate};

/// The shortest retention allowed: longer than the enqueue stream keeps a message (7 days), so a
/// detection that waited there as long as it can still finds its week, and far longer than the
/// longest retry schedule (~1.5 h). The database refuses a drop under it too.
pub const MIN_RETENTION_DAYS: u32 = 8;

/// Weeks made ahead of the current one, so a detection dated tomorrow in the furthest time zone,
/// and the next weeks' rows, never wait for a partition.
pub const WEEKS_AHEAD: i64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    days: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "a retention of {0} days is too short: rows are kept at least {MIN_RETENTION_DAYS} days (the enqueue stream keeps a message 7)"
)]
pub struct TooShort(pub u32);

/// `TIDINGS_RETENTION`: a duration in whole days (`30d`), at least [`MIN_RETENTION_DAYS`].
pub fn parse_retention(s: &str) -> Result<Retention, String> {
    let d = crate::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d.as_secs() % 86_400 != 0 {
        return Err(format!("{s:?} is not a whole number of days: use e.g. 30d"));
    }
    let days = u32::try_from(d.as_secs() / 86_400).map_err(|_| format!("{s:?} is too long"))?;
    Retention::days(days).map_err(|e| e.to_string())
}

impl Retention {
    pub fn days(days: u32) -> Result<Retention, TooShort> {
        if days < MIN_RETENTION_DAYS {
            return Err(TooShort(days));
        }
        Ok(Retention { days })
    }

    pub fn in_days(self) -> u32 {
        self.days
    }

    /// The first day whose rows are kept on `today`: rows of earlier days may be gone (their
    /// week's partition dropped); rows from it on are all there.
    pub fn kept_from(self, today: NaiveDate) -> NaiveDate {
        today - Duration::days(i64::from(self.days))
    }

    /// Whether the week starting `week` has wholly left the retention window on `today`.
    pub fn expired(self, week: NaiveDate, today: NaiveDate) -> bool {
        week + Duration::days(7) <= self.kept_from(today)
    }
}

/// The Monday of `day`'s week: the start of the partition `day`'s rows live in.
pub fn week_of(day: NaiveDate) -> NaiveDate {
    day - Duration::days(i64::from(day.weekday().num_days_from_monday()))
}

/// A partition that exists: its week, and whether any of its rows is still to be decided
/// (pending, retry or sending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub week: NaiveDate,
    pub live: bool,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Weeks to make: from yesterday's week (a time zone behind) to [`WEEKS_AHEAD`] ahead.
    pub ensure: Vec<NaiveDate>,
    /// Expired weeks whose rows are all terminal.
    pub drop: Vec<NaiveDate>,
    /// Expired weeks kept because a row is still to be decided: counted and alerted on.
    pub kept: Vec<NaiveDate>,
}

pub fn plan(today: NaiveDate, retention: Retention, existing: &[Partition]) -> Plan {
    let first = week_of(today - Duration::days(1));
    let ensure = (0..)
        .map(|i| first + Duration::weeks(i))
        .take_while(|w| *w <= week_of(today) + Duration::weeks(WEEKS_AHEAD))
        .filter(|w| !existing.iter().any(|p| p.week == *w))
        .collect();
    let (mut drop, mut kept) = (Vec::new(), Vec::new());
    for p in existing.iter().filter(|p| retention.expired(p.week, today)) {
        if p.live {
            kept.push(p.week);
        } else {
            drop.push(p.week);
        }
    }
    drop.sort();
    kept.sort();
    Plan { ensure, drop, kept }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn d(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    #[test]
    fn a_week_starts_on_monday() {
        assert_eq!(week_of(d("2026-12-01")), d("2026-11-30"));
        assert_eq!(week_of(d("2026-11-30")), d("2026-11-30"));
        assert_eq!(week_of(d("2026-12-06")), d("2026-11-30"));
        assert_eq!(week_of(d("2026-12-07")), d("2026-12-07"));
    }

    #[test]
    fn retention_is_read_in_whole_days() {
        assert_eq!(parse_retention("30d"), Ok(Retention::days(30).unwrap()));
        assert!(
            parse_retention("7d")
                .unwrap_err()
                .contains("at least 8 days")
        );
        assert!(
            parse_retention("36h")
                .unwrap_err()
                .contains("whole number of days")
        );
        assert!(parse_retention("soon").is_err());
    }

    #[test]
    fn retention_has_a_floor() {
        assert_eq!(Retention::days(7), Err(TooShort(7)));
        assert!(Retention::days(MIN_RETENTION_DAYS).is_ok());
        assert!(TooShort(3).to_string().contains("at least 8 days"));
    }

    #[test]
    fn thirty_days_keeps_the_weeks_that_touch_the_window_and_makes_four_ahead() {
        let today = d("2026-12-01");
        let r = Retention::days(30).unwrap();
        assert_eq!(r.kept_from(today), d("2026-11-01"));
        let existing: Vec<Partition> = [
            "2026-10-12",
            "2026-10-19",
            "2026-10-26",
            "2026-11-02",
            "2026-11-30",
        ]
        .iter()
        .map(|w| Partition {
            week: d(w),
            live: *w == "2026-10-19",
        })
        .collect();
        let p = plan(today, r, &existing);
        // 10-19 … 10-25 ended before 11-01: expired (kept, a row is live). 10-26 … 11-01 holds
        // 11-01, the first kept day: it stays.
        assert_eq!(p.drop, vec![d("2026-10-12")]);
        assert_eq!(p.kept, vec![d("2026-10-19")]);
        assert_eq!(
            p.ensure,
            ["2026-12-07", "2026-12-14", "2026-12-21", "2026-12-28"].map(d)
        );
    }

    #[test]
    fn on_a_monday_yesterdays_week_is_made_too() {
        let p = plan(d("2026-12-07"), Retention::days(30).unwrap(), &[]);
        assert_eq!(p.ensure.first(), Some(&d("2026-11-30")));
        assert_eq!(p.ensure.len(), 6);
    }

    proptest! {
        /// Whatever exists: a dropped week lies wholly before the retention window and had no
        /// live row; a live expired week is kept; every week from yesterday's to four ahead is
        /// there or to be made; nothing is both made and dropped.
        #[test]
        fn the_plan_never_drops_what_must_stay(
            offset in 0i64..3000,
            days in MIN_RETENTION_DAYS..400,
            weeks in proptest::collection::vec((-80i64..10, any::<bool>()), 0..30),
        ) {
            let today = d("2020-01-01") + Duration::days(offset);
            let r = Retention::days(days).unwrap();
            let mut existing: Vec<Partition> = weeks
                .iter()
                .map(|(w, live)| Partition { week: week_of(today) + Duration::weeks(*w), live: *live })
                .collect();
            existing.sort_by_key(|p| p.week);
            existing.dedup_by_key(|p| p.week);
            let p = plan(today, r, &existing);
            for w in &p.drop {
                prop_assert!(*w + Duration::days(7) <= r.kept_from(today));
                prop_assert!(existing.iter().any(|e| e.week == *w && !e.live));
                prop_assert!(!p.ensure.contains(w));
            }
            for e in existing.iter().filter(|e| e.live && r.expired(e.week, today)) {
                prop_assert!(p.kept.contains(&e.week));
            }
            let mut w = week_of(today - Duration::days(1));
            while w <= week_of(today) + Duration::weeks(WEEKS_AHEAD) {
                prop_assert!(p.ensure.contains(&w) || existing.iter().any(|e| e.week == w));
                w += Duration::weeks(1);
            }
        }
    }
}
