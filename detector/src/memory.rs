//! What this detector enqueued for the current dedup day, so a condition that keeps holding all
//! day is published once, not on every scan. Bounded: past its capacity it forgets everything,
//! which costs one re-publish per holding trigger — absorbed by JetStream's duplicate window and
//! the outbox's unique key, like a restart.

use chrono::NaiveDate;
use std::collections::HashMap;

pub struct Enqueued {
    keys: HashMap<String, NaiveDate>,
    capacity: usize,
}

impl Enqueued {
    pub fn new(capacity: usize) -> Self {
        Enqueued {
            keys: HashMap::new(),
            capacity,
        }
    }

    /// Forgets keys of days that are over everywhere: every time zone is within a day of UTC.
    pub fn start_scan(&mut self, utc_today: NaiveDate) {
        if let Some(oldest) = utc_today.pred_opt() {
            self.keys.retain(|_, day| *day >= oldest);
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

    pub fn contains(&self, key: &str) -> bool {
        self.keys.contains_key(key)
    }

    pub fn remember(&mut self, key: String, day: NaiveDate) {
        self.keys.insert(key, day);
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    #[test]
    fn keeps_today_and_yesterday_and_stays_bounded() {
        let mut m = Enqueued::new(3);
        m.remember("a".into(), day(28));
        m.remember("b".into(), day(29));
        m.remember("c".into(), day(30));
        m.start_scan(day(30));
        assert!(!m.contains("a") && m.contains("b") && m.contains("c"));
        m.remember("d".into(), day(30));
        m.remember("e".into(), day(30));
        m.start_scan(day(30));
        assert!(m.is_empty(), "over capacity: start over");
    }
}
