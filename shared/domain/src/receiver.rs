//! How a webhook receiver is judged and paced (docs/webhooks.md): a circuit breaker that judges
//! its health, and a pace that follows its requests to slow down. Both are pure: the dispatcher
//! reads an endpoint's state with its result batch, asks these what follows and writes it back.
//!
//! Two different things a receiver can say, kept apart:
//! - **it is broken** (errors, timeouts): the breaker counts one observation per result batch,
//!   opens once failures have lasted (a number of batches in a row *and* a time), and then sends
//!   one probe per pause, doubling the pause per failed probe;
//! - **slow down** (`429`, a `503` with `Retry-After`): never a failure. The endpoint's rows wait
//!   in the outbox until its `Retry-After`, then go at a rate halved per such answer and raised
//!   by a step per delivering batch (AIMD), until it is fast enough to need no pace at all.

use chrono::{DateTime, Utc};
use std::time::Duration;

/// When a webhook endpoint's circuit opens, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    /// Failing result batches in a row before it may open (0 disables the breaker).
    pub failures: u32,
    /// How long its failures must have lasted before it opens: a burst of failing batches
    /// within a second is one bad moment, not a broken receiver.
    pub after: Duration,
    /// The first pause; each failed probe doubles it, up to `max_pause`.
    pub pause: Duration,
    pub max_pause: Duration,
}

/// An endpoint's circuit, as stored with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Circuit {
    /// Failing result batches since its last delivery.
    pub failures: u32,
    /// When the first of them was seen.
    pub failing_since: Option<DateTime<Utc>>,
    /// Times it opened since its last delivery (its first opening and each failed probe).
    pub opens: u32,
    /// Its rows are held back until then.
    pub open_until: Option<DateTime<Utc>>,
    /// A probe is out: the next failure is its answer.
    pub probing: bool,
}

/// What a result batch said about an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// At least one of its webhooks was delivered.
    Delivered,
    /// None was delivered and at least one failed.
    Failed,
    /// It only asked to slow down: the pace's business, not the breaker's.
    SlowDown,
}

/// Where a circuit stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed,
    Open {
        until: DateTime<Utc>,
    },
    /// Its pause is over: one probe goes, the other rows wait for its answer.
    HalfOpen,
}

impl Circuit {
    /// Where it stands at `now`.
    pub fn state(&self, now: DateTime<Utc>) -> State {
        match self.open_until {
            Some(until) if until > now => State::Open { until },
            _ if self.opens > 0 => State::HalfOpen,
            _ => State::Closed,
        }
    }
}

impl Breaker {
    /// The pause after the circuit opened `opens` times before: `pause`, then doubled per
    /// opening, at most `max_pause`.
    pub fn pause_for(&self, opens: u32) -> Duration {
        (self.pause * 2u32.pow(opens.min(20))).min(self.max_pause)
    }

    /// The circuit after a result batch's observation at `now`.
    pub fn observe(&self, c: Circuit, seen: Observed, now: DateTime<Utc>) -> Circuit {
        match seen {
            Observed::Delivered => Circuit::default(),
            Observed::SlowDown => c,
            Observed::Failed if self.failures == 0 => c,
            // Sent before it opened, answered after: the opening already counted it.
            Observed::Failed if !c.probing && c.open_until.is_some_and(|u| u > now) => c,
            Observed::Failed => {
                let failures = c.failures.saturating_add(1);
                let failing_since = c.failing_since.unwrap_or(now);
                let lasted = (now - failing_since).to_std().unwrap_or_default() >= self.after;
                if c.probing || (failures >= self.failures && lasted) {
                    let pause = chrono::Duration::from_std(self.pause_for(c.opens))
                        .unwrap_or(chrono::Duration::MAX);
                    return Circuit {
                        failures,
                        failing_since: Some(failing_since),
                        opens: c.opens.saturating_add(1),
                        open_until: Some(now + pause),
                        probing: false,
                    };
                }
                Circuit {
                    failures,
                    failing_since: Some(failing_since),
                    ..c
                }
            }
        }
    }
}

/// How an endpoint that asked to slow down is paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacing {
    /// Rows a second after its first request to slow down.
    pub start: f64,
    /// The slowest it goes (halving stops here).
    pub min: f64,
    /// Added per delivering batch.
    pub step: f64,
    /// At this rate it is paced no more.
    pub max: f64,
    /// The longest a `Retry-After` holds an endpoint's rows: the receiver's number is
    /// untrusted (`Retry-After: 999999999999` would hold them for ever, or overflow the clock).
    pub max_wait: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            start: 8.0,
            min: 0.1,
            step: 1.0,
            max: 64.0,
            max_wait: Duration::from_secs(3600),
        }
    }
}

/// An endpoint's pace, as stored with it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pace {
    /// Rows a second; `None`: not paced.
    pub per_second: Option<f64>,
    /// Its rows wait until then (its `Retry-After`, or the slot its last release took).
    pub until: Option<DateTime<Utc>>,
}

/// What the pace lets go of an endpoint's waiting rows now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// How many go now.
    pub go: usize,
    /// The rest wait until then (and the endpoint's pace with them); `None` when unpaced.
    pub next: Option<DateTime<Utc>>,
}

impl Pacing {
    /// The pace after a batch that asked to slow down, the longest `Retry-After` being
    /// `retry_after`.
    pub fn slow_down(&self, p: Pace, retry_after: Duration, now: DateTime<Utc>) -> Pace {
        let rate = p.per_second.map_or(self.start, |r| r / 2.0).max(self.min);
        let wait = retry_after.min(self.max_wait);
        let asked = now + chrono::Duration::from_std(wait).unwrap_or_default();
        Pace {
            per_second: Some(rate),
            until: Some(p.until.map_or(asked, |u| u.max(asked))),
        }
    }

    /// The pace after a batch that delivered and did not ask to slow down.
    pub fn speed_up(&self, p: Pace) -> Pace {
        match p.per_second.map(|r| r + self.step) {
            Some(r) if r < self.max => Pace {
                per_second: Some(r),
                ..p
            },
            _ => Pace::default(),
        }
    }

    /// What goes of `waiting` rows at `now`: none before the pace's time; then one second's
    /// worth (at least one), and the next ones when those have used their share of time.
    pub fn release(&self, p: Pace, waiting: usize, now: DateTime<Utc>) -> Release {
        let Some(rate) = p.per_second else {
            return Release {
                go: waiting,
                next: None,
            };
        };
        if let Some(until) = p.until.filter(|u| *u > now) {
            return Release {
                go: 0,
                next: Some(until),
            };
        }
        // Rates are bounded by `min` and `max`: the casts stay small.
        let go = (rate.floor() as usize).max(1).min(waiting);
        let share = Duration::from_secs_f64(go as f64 / rate.max(self.min));
        Release {
            go,
            next: Some(now + chrono::Duration::from_std(share).unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn breaker() -> Breaker {
        Breaker {
            failures: 3,
            after: Duration::from_secs(10),
            pause: Duration::from_secs(30),
            max_pause: Duration::from_secs(3600),
        }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::seconds(1_700_000_000 + secs)
    }

    #[test]
    fn pauses_double_per_opening_up_to_the_cap() {
        let b = breaker();
        let pauses: Vec<u64> = (0..10).map(|n| b.pause_for(n).as_secs()).collect();
        assert_eq!(pauses, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
        assert_eq!(b.pause_for(u32::MAX), Duration::from_secs(3600));
    }

    #[test]
    fn it_opens_only_once_failures_have_lasted_and_counted() {
        let b = breaker();
        let mut c = Circuit::default();
        // Five failing batches within a second: a burst, not a broken receiver.
        for s in 0..5 {
            c = b.observe(
                c,
                Observed::Failed,
                at(0) + chrono::Duration::milliseconds(s * 200),
            );
        }
        assert_eq!(c.state(at(1)), State::Closed);
        assert_eq!(c.failures, 5);
        // Still failing ten seconds on: open for the first pause.
        c = b.observe(c, Observed::Failed, at(10));
        assert_eq!(c.state(at(10)), State::Open { until: at(40) });
        assert_eq!(c.opens, 1);
        // A late answer to a request sent before it opened changes nothing.
        assert_eq!(b.observe(c, Observed::Failed, at(12)), c);
        assert_eq!(c.state(at(40)), State::HalfOpen);
        // A delivery closes it and forgets.
        let closed = b.observe(c, Observed::Delivered, at(41));
        assert_eq!(closed, Circuit::default());
        assert_eq!(closed.state(at(41)), State::Closed);
    }

    #[test]
    fn a_disabled_breaker_never_opens() {
        let b = Breaker {
            failures: 0,
            ..breaker()
        };
        let mut c = Circuit::default();
        for s in 0..100 {
            c = b.observe(c, Observed::Failed, at(s * 60));
        }
        assert_eq!(c.state(at(6000)), State::Closed);
    }

    /// A probe is out from `now` for `lease`, as the dispatcher marks it.
    fn probing(c: Circuit, now: DateTime<Utc>) -> Circuit {
        Circuit {
            open_until: Some(now + chrono::Duration::seconds(60)),
            probing: true,
            ..c
        }
    }

    proptest! {
        /// However many batches only ask to slow down, or deliver, in whatever order and at
        /// whatever times, the circuit never opens.
        #[test]
        fn back_pressure_never_opens_it(
            seen in prop::collection::vec(prop::bool::ANY, 1..200),
            gaps in prop::collection::vec(0i64..120, 200),
        ) {
            let b = breaker();
            let (mut c, mut now) = (Circuit::default(), at(0));
            for (slow, gap) in seen.into_iter().zip(gaps) {
                now += chrono::Duration::seconds(gap);
                let o = if slow { Observed::SlowDown } else { Observed::Delivered };
                c = b.observe(c, o, now);
                prop_assert_eq!(c.state(now), State::Closed);
                prop_assert_eq!(c.opens, 0);
            }
        }

        /// Once open, k failed probes give pauses p, 2p, 4p, … (at most the cap).
        #[test]
        fn failed_probes_double_the_pause(k in 1u32..12, first in 10i64..100) {
            let b = breaker();
            let mut c = Circuit::default();
            c = b.observe(c, Observed::Failed, at(0));
            c = b.observe(c, Observed::Failed, at(first / 2));
            c = b.observe(c, Observed::Failed, at(first));
            let mut now = at(first);
            prop_assert_eq!(c.state(now), State::Open { until: now + chrono::Duration::seconds(30) });
            for probe in 1..=k {
                now = c.open_until.unwrap();
                prop_assert_eq!(c.state(now), State::HalfOpen);
                c = probing(c, now);
                now += chrono::Duration::seconds(5);
                c = b.observe(c, Observed::Failed, now);
                let pause = (c.open_until.unwrap() - now).to_std().unwrap();
                prop_assert_eq!(pause, b.pause_for(probe));
                prop_assert_eq!(pause, (b.pause * 2u32.pow(probe)).min(b.max_pause));
            }
        }

        /// A pace halves per request to slow down, never below its floor, holds rows until the
        /// receiver's `Retry-After`, and climbs back to unpaced on deliveries.
        #[test]
        fn the_pace_follows_the_receiver(slowdowns in 1usize..30, ra in 0u64..120) {
            let p = Pacing::default();
            let mut pace = Pace::default();
            for n in 0..slowdowns {
                let before = pace.per_second;
                pace = p.slow_down(pace, Duration::from_secs(ra), at(0));
                let rate = pace.per_second.unwrap();
                prop_assert!(rate >= p.min);
                if let Some(b) = before { prop_assert!(rate <= b); }
                if n == 0 { prop_assert_eq!(rate, p.start); }
            }
            let held = p.release(pace, 100, at(0));
            if ra > 0 {
                prop_assert_eq!(held, Release { go: 0, next: Some(at(ra as i64)) });
            }
            let now = at(ra as i64);
            let r = p.release(pace, 100, now);
            prop_assert!(r.go >= 1 && r.go as f64 <= pace.per_second.unwrap().max(1.0));
            prop_assert!(r.next.unwrap() > now);
            let mut climbs = 0;
            while pace.per_second.is_some() {
                pace = p.speed_up(pace);
                climbs += 1;
                prop_assert!(climbs <= 64);
            }
            prop_assert_eq!(p.release(pace, 7, now), Release { go: 7, next: None });
        }
    }

    proptest! {
        /// Whatever a receiver says its `Retry-After` is, its rows wait an hour at most.
        #[test]
        fn a_hostile_retry_after_holds_rows_an_hour_at_most(secs in prop::num::u64::ANY) {
            let p = Pacing::default();
            let pace = p.slow_down(Pace::default(), Duration::from_secs(secs), at(0));
            let until = pace.until.unwrap();
            prop_assert!(until <= at(3600));
            prop_assert_eq!(until, at(secs.min(3600) as i64));
        }
    }

    #[test]
    fn twenty_rows_at_the_start_pace_go_within_three_seconds() {
        let p = Pacing::default();
        let pace = p.slow_down(Pace::default(), Duration::from_secs(2), at(0));
        let (mut waiting, mut now, mut pace) = (20usize, at(0), pace);
        let mut rounds = 0;
        while waiting > 0 {
            let r = p.release(pace, waiting, now);
            waiting -= r.go;
            pace.until = r.next;
            now = r.next.unwrap();
            rounds += 1;
        }
        // 2 s of Retry-After, then 8 a second: 8 + 8 + 4.
        assert_eq!(rounds, 4);
        assert!(now <= at(5), "{now}");
    }
}
