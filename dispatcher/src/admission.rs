//! Admission: ingest takes new notifications only while dispatch keeps up with the outbox.
//!
//! Offered more than it can send, a dispatcher that ingested at the offered rate spent the cores
//! on inserting rows it could not dispatch yet, and sent less than at a rate it could keep up
//! with. So each claim tells how long its oldest row had been due; past
//! `TIDINGS_INGEST_ADMISSION_LAG` ingest stops taking messages, and the surplus waits in the
//! enqueue stream (JetStream keeps it, nothing is lost) until dispatch has caught up to half
//! that lag. Rows already in the outbox keep their order; what waits in the stream is newer.

use std::time::Duration;
use tokio::sync::watch;

/// Whether ingest may take messages, given whether it may now, how long the oldest row of the
/// last claim had been due (`None`: the claim found nothing due) and the lag bound. Opening
/// again only below half the bound keeps it from flapping at the edge.
pub fn admit(open: bool, oldest_due: Option<Duration>, limit: Duration) -> bool {
    match oldest_due {
        None => true,
        Some(waited) if open => waited <= limit,
        Some(waited) => waited <= limit / 2,
    }
}

/// The gate ingest waits on and the dispatch workers move.
#[derive(Debug)]
pub struct Admission {
    open: watch::Sender<bool>,
    limit: Duration,
}

impl Admission {
    /// `limit` zero: ingest is never held back.
    pub fn new(limit: Duration) -> Self {
        Admission {
            open: watch::Sender::new(true),
            limit,
        }
    }

    /// What ingest waits on while it holds `false`; `None` when admission is off.
    pub fn gate(&self) -> Option<watch::Receiver<bool>> {
        (!self.limit.is_zero()).then(|| self.open.subscribe())
    }

    /// After a claim: `oldest_due` is how long its oldest row had been due.
    pub fn observe(&self, oldest_due: Option<Duration>) {
        if self.limit.is_zero() {
            return;
        }
        let limit = self.limit;
        self.open.send_if_modified(|open| {
            let next = admit(*open, oldest_due, limit);
            if next == *open {
                return false;
            }
            *open = next;
            crate::metrics::metrics()
                .ingest_admitted
                .set(i64::from(next));
            if next {
                tracing::info!("dispatch caught up; ingest takes new notifications again");
            } else {
                tracing::warn!(
                    waited_ms = oldest_due.map_or(0, |d| d.as_millis() as u64),
                    limit_ms = limit.as_millis() as u64,
                    "dispatch is behind; ingest holds new notifications in the enqueue stream"
                );
            }
            true
        });
    }

    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(1);

    #[test]
    fn closes_past_the_bound_and_opens_below_half_of_it() {
        assert!(admit(true, None, LIMIT));
        assert!(admit(true, Some(Duration::from_millis(1000)), LIMIT));
        assert!(!admit(true, Some(Duration::from_millis(1001)), LIMIT));
        // Closed: stays closed until the lag is below half the bound, or nothing is due.
        assert!(!admit(false, Some(Duration::from_millis(900)), LIMIT));
        assert!(admit(false, Some(Duration::from_millis(500)), LIMIT));
        assert!(admit(false, None, LIMIT));
    }

    #[test]
    fn the_gate_follows_the_claims_and_is_absent_when_off() {
        let a = Admission::new(LIMIT);
        let gate = a.gate().expect("on");
        a.observe(Some(Duration::from_secs(3)));
        assert!(!*gate.borrow());
        a.observe(Some(Duration::from_millis(700)));
        assert!(!*gate.borrow(), "hysteresis");
        a.observe(Some(Duration::from_millis(100)));
        assert!(*gate.borrow());
        let off = Admission::new(Duration::ZERO);
        assert!(off.gate().is_none());
        off.observe(Some(Duration::from_secs(60)));
        assert!(off.is_open());
    }
}
