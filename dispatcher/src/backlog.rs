//! The outbox backlog as gauges: non-terminal rows by state, the age of the oldest due row and
//! how long the oldest `sending` row has been past its lease (read by `tidings_store::backlog`).
//! Terminal states are counted by `tidings_outbox_transitions_total` instead. Beside it, the
//! health of webhook endpoints: breakers open, endpoints paced, and the longest failing.

use crate::metrics::metrics;
use sqlx::PgPool;
use std::time::Duration;
use tidings_domain::holding::Held;
use tidings_domain::outbox::Status;
use tidings_runtime::metrics::{HeldLabels, ReleaseLabels, StateLabels, StatusLabels};
use tokio_util::sync::CancellationToken;

/// Creates the gauges' series at 0, so a scrape between start and the first reading finds them
/// (regression: under CI's load the dashboards' check scraped a dispatcher before its first
/// reading and found no `tidings_outbox_rows`).
pub fn init_metrics() {
    let m = metrics();
    for status in [Status::Pending, Status::Retry, Status::Sending] {
        let _ = m.outbox_rows.get_or_create(&StatusLabels {
            status: status.as_str().to_owned(),
        });
    }
    for state in ["open", "half_open", "paced"] {
        let _ = (m.webhook_endpoints).get_or_create(&StateLabels {
            state: state.to_owned(),
        });
    }
    for held in Held::ALL {
        let labels = HeldLabels {
            held: held.as_str().to_owned(),
        };
        let _ = m.outbox_held.get_or_create(&labels);
        let _ = m.held.get_or_create(&labels);
        // What a release re-check can make of a held row (holding::released).
        for outcome in ["sent", "held", "dropped", "retry", "failed"] {
            let _ = m.released.get_or_create(&ReleaseLabels {
                held: labels.held.clone(),
                outcome: outcome.to_owned(),
            });
        }
    }
}

/// Reads the backlog once and sets the gauges (an endpoint fails from `breaker_failures`
/// failing batches in a row).
pub async fn measure(pool: &PgPool, breaker_failures: u32) -> Result<(), sqlx::Error> {
    let backlog = tidings_store::backlog::read(pool).await?;
    let m = metrics();
    for status in [Status::Pending, Status::Retry, Status::Sending] {
        m.outbox_rows
            .get_or_create(&StatusLabels {
                status: status.as_str().to_owned(),
            })
            .set(backlog.rows(status));
    }
    for (held, n) in backlog.held {
        (m.outbox_held)
            .get_or_create(&HeldLabels {
                held: held.as_str().to_owned(),
            })
            .set(n);
    }
    m.oldest_due_seconds.set(backlog.oldest_due_seconds);
    m.lease_overdue_seconds.set(backlog.lease_overdue_seconds);
    let endpoints = tidings_store::subscriptions::unhealthy(pool, breaker_failures).await?;
    for (state, n) in [
        ("open", endpoints.open),
        ("half_open", endpoints.half_open),
        ("paced", endpoints.paced),
    ] {
        (m.webhook_endpoints)
            .get_or_create(&StateLabels {
                state: state.to_owned(),
            })
            .set(n);
    }
    m.webhook_failing_seconds.set(endpoints.failing_seconds);
    m.webhook_breaker_open_seconds.set(endpoints.open_seconds);
    Ok(())
}

/// A reading may take at most one part in this many of the time until the next. Counting walks
/// every row it counts (a busy outbox's pages are not all-visible, so even the partial indexes
/// send it to the heap): 1,000,000 due rows took 190-600 ms a reading here, and every dispatcher
/// replica reads. Spaced by their own cost, readings take at most 1 % of Postgres's time a
/// replica until they are [`LONGEST_PAUSE_PERIODS`] apart, and the gauges are only older while the
/// backlog is that large.
const READING_SHARE: u32 = 100;

/// The longest pause between readings, in periods: a reading slowed once (a stalled Postgres)
/// leaves the gauges at most this much older.
const LONGEST_PAUSE_PERIODS: u32 = 6;

/// When to read again after a reading that took `took`: after `every`, or later if the reading
/// took more than its share of that, but within [`LONGEST_PAUSE_PERIODS`] periods.
pub fn next_reading_in(every: Duration, took: Duration) -> Duration {
    let longest = every.saturating_mul(LONGEST_PAUSE_PERIODS);
    every.max(took.saturating_mul(READING_SHARE)).min(longest)
}

/// Measures every `every` (or less often: [`next_reading_in`]) until `shutdown`.
pub async fn run(
    pool: PgPool,
    breaker_failures: u32,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let started = std::time::Instant::now();
        if let Err(e) = measure(&pool, breaker_failures).await {
            tracing::warn!(error = %e, "measuring the outbox backlog failed");
        }
        let pause = next_reading_in(every, started.elapsed());
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_that_takes_more_than_its_share_spaces_the_next() {
        let every = Duration::from_secs(10);
        let cases = [(5, 10_000), (100, 10_000), (190, 19_000), (600, 60_000)];
        for (took_ms, next_ms) in cases {
            let next = next_reading_in(every, Duration::from_millis(took_ms));
            assert_eq!(next, Duration::from_millis(next_ms), "after {took_ms} ms");
        }
        // A reading slowed once (30 s: a statement timeout) leaves the gauges a minute older at
        // most, and one that hangs for ever does not overflow the pause.
        for took in [
            Duration::from_secs(2),
            Duration::from_secs(30),
            Duration::MAX,
        ] {
            assert_eq!(next_reading_in(every, took), Duration::from_secs(60));
        }
    }
}
