//! When a retry is due: `min(30 s · 2^retry_count, 30 min)` with ±10 % jitter; a push service's
//! Retry-After is honoured but clamped to [backoff, 1 h], so it can neither hammer a service that
//! asked for a pause nor park a row for a day.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max_delay: Duration,
    /// Fraction of the delay added or removed at random, e.g. 0.10.
    pub jitter: f64,
    pub max_retry_after: Duration,
    /// Retries allowed before a transient failure is final.
    pub max_retries: u32,
}

impl RetryPolicy {
    /// Retries from `base` (the dispatcher's TIDINGS_RETRY_BASE) up to `max_retries`
    /// (TIDINGS_MAX_RETRIES), with the fixed cap, jitter and Retry-After clamp.
    pub fn new(base: Duration, max_retries: u32) -> Self {
        RetryPolicy {
            base,
            max_delay: Duration::from_secs(30 * 60),
            jitter: 0.10,
            max_retry_after: Duration::from_secs(60 * 60),
            max_retries,
        }
    }

    /// The un-jittered delay before retry number `retry_count + 1`.
    pub fn backoff(&self, retry_count: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry_count.min(31));
        self.base.saturating_mul(factor).min(self.max_delay)
    }

    /// The delay before the next attempt. `unit` is a number in [-1, 1] (the jitter draw), so
    /// this stays pure; [`RetryPolicy::delay`] draws it.
    pub fn delay_with(
        &self,
        retry_count: u32,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Duration {
        let backoff = self.backoff(retry_count);
        let jittered = backoff.mul_f64((1.0 + self.jitter * unit.clamp(-1.0, 1.0)).max(0.0));
        match retry_after {
            // The push service knows best when it can take more, within our bounds.
            Some(ra) => ra.clamp(backoff, self.max_retry_after.max(backoff)),
            None => jittered,
        }
    }

    pub fn delay(&self, retry_count: u32, retry_after: Option<Duration>) -> Duration {
        let unit = rand::random::<f64>() * 2.0 - 1.0;
        self.delay_with(retry_count, retry_after, unit)
    }

    /// The delay a webhook receiver asked for with `Retry-After` (back-pressure): its own pace,
    /// not our backoff, within [1 s, 1 h], and up to 10 % later so its rows do not all come
    /// back in the same instant. `unit` in [0, 1] is the jitter draw.
    pub fn paced_with(&self, retry_after: Duration, unit: f64) -> Duration {
        let asked = retry_after.clamp(Duration::from_secs(1), self.max_retry_after);
        asked.mul_f64(1.0 + self.jitter * unit.clamp(0.0, 1.0))
    }

    pub fn paced(&self, retry_after: Duration) -> Duration {
        self.paced_with(retry_after, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: RetryPolicy = RetryPolicy {
        base: Duration::from_secs(30),
        max_delay: Duration::from_secs(1800),
        jitter: 0.10,
        max_retry_after: Duration::from_secs(3600),
        max_retries: 8,
    };

    #[test]
    fn doubles_from_thirty_seconds_up_to_thirty_minutes() {
        let secs: Vec<u64> = (0..8).map(|n| P.backoff(n).as_secs()).collect();
        assert_eq!(secs, [30, 60, 120, 240, 480, 960, 1800, 1800]);
        assert_eq!(P.backoff(u32::MAX), Duration::from_secs(1800));
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        assert_eq!(P.delay_with(0, None, -1.0), Duration::from_secs(27));
        assert_eq!(P.delay_with(0, None, 1.0), Duration::from_secs(33));
        assert_eq!(P.delay_with(0, None, 0.0), Duration::from_secs(30));
    }

    #[test]
    fn a_receivers_pace_is_kept_within_a_second_and_an_hour() {
        let p = RetryPolicy::new(Duration::from_secs(30), 8);
        assert_eq!(
            p.paced_with(Duration::from_secs(2), 0.0),
            Duration::from_secs(2)
        );
        assert_eq!(
            p.paced_with(Duration::from_secs(2), 1.0),
            Duration::from_millis(2200)
        );
        assert_eq!(p.paced_with(Duration::ZERO, 0.0), Duration::from_secs(1));
        assert_eq!(
            p.paced_with(Duration::from_secs(86_400), 0.0),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn retry_after_is_clamped_between_backoff_and_an_hour() {
        let ra = |s| Some(Duration::from_secs(s));
        assert_eq!(P.delay_with(0, ra(120), 0.0), Duration::from_secs(120));
        assert_eq!(P.delay_with(2, ra(1), 0.0), Duration::from_secs(120));
        assert_eq!(P.delay_with(0, ra(86_400), 0.0), Duration::from_secs(3600));
    }

    proptest! {
        #[test]
        fn delay_is_bounded(n in 0u32..100, unit in -1.0f64..=1.0, ra in proptest::option::of(0u64..200_000)) {
            let d = P.delay(n, ra.map(Duration::from_secs));
            prop_assert!(d >= Duration::from_secs(27));
            prop_assert!(d <= Duration::from_secs(3600));
            let d = P.delay_with(n, None, unit);
            let b = P.backoff(n).as_secs_f64();
            prop_assert!((d.as_secs_f64() - b).abs() <= b * 0.10 + 1e-9);
        }
    }
}
