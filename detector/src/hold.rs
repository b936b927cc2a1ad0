//! Holding scans back while dispatch is behind.
//!
//! Offered more than dispatch can send, the dispatcher's ingest stops taking messages and the
//! surplus waits in the enqueue stream (the dispatcher's admission). A detector that kept
//! scanning would keep adding to that backlog, and the cores it took (its scans, and NATS storing
//! what it published) would be taken from dispatch and push. So before each scan the detector
//! reads how many messages wait for the ingest consumer, each counted as a full publish batch
//! (`TIDINGS_DETECTOR_PUBLISH_BATCH`); above `TIDINGS_DETECTOR_HOLD_BACKLOG` notifications it
//! does not scan, and looks again every second until the backlog is at half that. A scan then
//! publishes no more than the room left under the limit: the triggers past it stay to do, and
//! the next scan starts at their item, so every item gets its turn. Nothing is lost: a scan
//! evaluates the current value of every watched item, so a condition that began during the hold
//! is found by a scan after it (and one that ended is not sent, as it would not have been by the
//! dispatcher's re-check).
//!
//! A backlog that cannot be read never stops the scans: no dispatcher has created the consumer
//! yet (nothing can be behind), NATS does not answer in time, or, during a roll, the detector's
//! NATS user lacks the grant (reads then pause for a minute, so each scan does not wait on one).

use async_nats::jetstream;
use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
use std::time::Duration;
use tidings_bus::streams::consumer_of;
use tidings_domain::subjects::{StreamKind, Subjects};

/// How often a held detector reads the backlog again.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Whether to hold the next scan, given whether the last look held, the messages waiting for
/// ingest and the limit. Resuming only at half the limit keeps it from flapping at the edge.
pub fn hold(held: bool, waiting: u64, limit: u64) -> bool {
    if limit == 0 {
        return false;
    }
    if held {
        waiting > limit / 2
    } else {
        waiting > limit
    }
}

#[derive(Debug, thiserror::Error)]
#[error("reading consumer {consumer} on stream {stream}: {source}")]
pub struct BacklogError {
    stream: String,
    consumer: &'static str,
    #[source]
    source: ConsumerError,
}

/// What the next scan may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Dispatch is behind: no scan now.
    Wait,
    /// Scan, publishing at most `budget` new EnqueueRequests (`None`: no bound).
    Scan { budget: Option<usize> },
}

/// What decides, before each scan, whether it runs.
pub struct Hold {
    js: jetstream::Context,
    stream: String,
    limit: u64,
    /// Notifications a waiting message is counted as: the detector's publish batch, an upper
    /// bound (a message carries at most that many), so the limit is never overshot.
    per_message: u64,
    held: bool,
    /// When a read last failed for a reason other than a missing consumer: reads then pause for
    /// [`AFTER_FAILURE`] so a server that does not answer (or a user without the grant, during a
    /// roll) costs a scan nothing, and the failure is logged once.
    failed_at: Option<std::time::Instant>,
}

/// How long a read may take before the scan goes ahead without it.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long reads pause after one failed.
const AFTER_FAILURE: Duration = Duration::from_secs(60);

impl Hold {
    /// `limit` 0: never hold.
    pub fn new(js: jetstream::Context, subjects: &Subjects, limit: u64) -> Self {
        Hold {
            js,
            stream: subjects.stream(StreamKind::Enqueue),
            limit,
            per_message: 1,
            held: false,
            failed_at: None,
        }
    }

    /// Counts each waiting message as `n` notifications (the publish batch).
    pub fn counting_each_message_as(mut self, n: usize) -> Self {
        // `usize` fits `u64` on every target this builds for.
        self.per_message = u64::try_from(n.max(1)).unwrap_or(u64::MAX);
        self
    }

    /// Messages in the enqueue stream not yet delivered to ingest; 0 while there is no ingest
    /// consumer (no dispatcher has started), as nothing can be behind.
    async fn waiting(&self) -> Result<u64, BacklogError> {
        let consumer = consumer_of(StreamKind::Enqueue);
        let error = |source| BacklogError {
            stream: self.stream.clone(),
            consumer,
            source,
        };
        // One request: looking the consumer up returns its current info.
        let lookup = self
            .js
            .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(
                consumer,
                &self.stream,
            );
        let found = tokio::time::timeout(READ_TIMEOUT, lookup)
            .await
            .map_err(|_| error(ConsumerError::new(ConsumerErrorKind::TimedOut)))?;
        match found {
            Ok(c) => Ok(c.cached_info().num_pending),
            Err(e) if is_missing(&e) => Ok(0),
            Err(e) => Err(error(e)),
        }
    }

    /// The backlog, unless waiting is off or reads pause after a failure (`None`: scan
    /// unbounded); logs a failure once and the recovery once.
    async fn read(&mut self) -> Option<u64> {
        if self.limit == 0
            || self
                .failed_at
                .is_some_and(|at| at.elapsed() < AFTER_FAILURE)
        {
            return None;
        }
        match self.waiting().await {
            Ok(n) => {
                if self.failed_at.take().is_some() {
                    tracing::info!(stream = %self.stream, "the enqueue backlog can be read again");
                }
                Some(n)
            }
            Err(e) => {
                if self.failed_at.is_none() {
                    tracing::warn!(
                        error = %e,
                        "cannot read the enqueue backlog; scanning without waiting for dispatch"
                    );
                }
                self.failed_at = Some(std::time::Instant::now());
                None
            }
        }
    }

    /// Whether the next scan should wait, and if not, how many EnqueueRequests it may publish;
    /// logs and sets `tidings_detector_held` when waiting starts or ends.
    pub async fn check(&mut self) -> Gate {
        let Some(messages) = self.read().await else {
            self.set(false, 0);
            return Gate::Scan { budget: None };
        };
        let waiting = messages.saturating_mul(self.per_message);
        if self.set(hold(self.held, waiting, self.limit), waiting) {
            return Gate::Wait;
        }
        // A scan that resumes after a wait would otherwise publish at once every trigger that
        // began during it, and the backlog would only grow in bursts.
        let room = self.limit.saturating_sub(waiting);
        Gate::Scan {
            // Room past `usize` is more than a scan can publish: no limit.
            budget: Some(usize::try_from(room).unwrap_or(usize::MAX)),
        }
    }

    fn set(&mut self, next: bool, waiting: u64) -> bool {
        if next != self.held {
            self.held = next;
            crate::metrics::metrics().held.set(i64::from(next));
            if next {
                tracing::warn!(
                    waiting,
                    limit = self.limit,
                    "dispatch is behind; scans wait until the enqueue backlog is at half the limit"
                );
            } else {
                tracing::info!(waiting, "scanning again");
            }
        }
        next
    }
}

/// Whether the stream or the consumer does not exist (yet).
fn is_missing(e: &ConsumerError) -> bool {
    use async_nats::jetstream::ErrorCode;
    matches!(e.kind(), ConsumerErrorKind::JetStream(j)
        if j.error_code() == ErrorCode::CONSUMER_NOT_FOUND
            || j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_above_the_limit_and_resumes_at_half_of_it() {
        assert!(!hold(false, 1000, 1000));
        assert!(hold(false, 1001, 1000));
        assert!(hold(true, 900, 1000), "hysteresis");
        assert!(hold(true, 501, 1000));
        assert!(!hold(true, 500, 1000));
        assert!(!hold(true, 0, 1000));
    }

    #[test]
    fn a_zero_limit_never_holds() {
        assert!(!hold(false, u64::MAX, 0));
        assert!(!hold(true, u64::MAX, 0));
    }
}
