//! What this detector enqueued recently for the current dedup day, so a condition that keeps
//! holding is not published on every scan. A key is trusted for `republish_after` only: JetStream
//! may lose an acknowledged message in a crash, so a trigger that still holds after that is
//! published again (JetStream's duplicate window or the outbox's unique key absorb the repeat when
//! nothing was lost). Bounded: past its capacity it forgets everything, which costs one re-publish
//! per holding trigger, like a restart.

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use std::collections::HashMap;

pub struct Enqueued {
    /// Dedup key → (its dedup day, when it was enqueued).
    keys: HashMap<String, (NaiveDate, DateTime<Utc>)>,
    capacity: usize,
    republish_after: TimeDelta,
}

impl Enqueued {
    pub fn new(capacity: usize, republish_after: TimeDelta) -> Self {
        Enqueued {
            keys: HashMap::new(),
            capacity,
            republish_after,
        }
    }

    /// Forgets keys of days that are over everywhere: every time zone is within a day of UTC.
    pub fn start_scan(&mut self, utc_today: NaiveDate) {
        if let Some(oldest) = utc_today.pred_opt() {
            self.keys.retain(|_, (day, _)| *day >= oldest);
        }
        if self.keys.len() > self.capacity {
            tracing::warn!(
                keys = self.keys.len(),
                capacity = self.capacity,
                "forgetting what was enqueued today; the dedup layers absorb the re-publishes"
            );
            self.keys.clear();
        }
    }

    /// Whether `key` was enqueued less than `republish_after` before `now`.
    pub fn contains(&self, key: &str, now: DateTime<Utc>) -> bool {
        self.keys
            .get(key)
            .is_some_and(|(_, at)| now - *at < self.republish_after)
    }

    /// Until when a key remembered at `now` is trusted.
    pub fn trusted_until(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now.checked_add_signed(self.republish_after)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    pub fn remember(&mut self, key: String, day: NaiveDate, now: DateTime<Utc>) {
        self.keys.insert(key, (day, now));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    fn at(minute: u32) -> DateTime<Utc> {
        use chrono::TimeZone;
        Utc.with_ymd_and_hms(2026, 11, 30, 12, minute, 0).unwrap()
    }

    #[test]
    fn keeps_today_and_yesterday_and_stays_bounded() {
        let mut m = Enqueued::new(3, TimeDelta::minutes(10));
        m.remember("a".into(), day(28), at(0));
        m.remember("b".into(), day(29), at(0));
        m.remember("c".into(), day(30), at(0));
        m.start_scan(day(30));
        assert!(!m.contains("a", at(1)) && m.contains("b", at(1)) && m.contains("c", at(1)));
        m.remember("d".into(), day(30), at(1));
        m.remember("e".into(), day(30), at(1));
        m.start_scan(day(30));
        assert_eq!(m.len(), 0, "over capacity: start over");
    }

    #[test]
    fn a_key_is_trusted_for_the_republish_interval_only() {
        let mut m = Enqueued::new(10, TimeDelta::minutes(10));
        m.remember("a".into(), day(30), at(0));
        assert!(m.contains("a", at(9)));
        assert!(!m.contains("a", at(10)), "due to be published again");
        m.remember("a".into(), day(30), at(10));
        assert!(m.contains("a", at(19)));
    }
}
