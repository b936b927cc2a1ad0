//! Change hints (docs/sources.md, "Change hints"): "these items changed", from the api's
//! `POST /v1/items/changed` or a producer inside the cluster, on `<prefix>.hints.<source>`.
//! Every shard hears every hint and fetches, now, the hinted items it watches, through the same
//! steps as a scan; the scan interval is then only a safety net. A hint is never trusted for a
//! value, and is held to its source's rate (`hint_rate`, items a second): past it, items wait
//! (each once, however often hinted) for the next second's allowance.

use crate::metrics::{self, Hinted};
use crate::scan::Detector;
use futures::StreamExt;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tidings_domain::ItemCode;
use tidings_domain::subjects::Subjects;
use tidings_source::SourceConfig;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Items one source may have waiting; a hint past it is dropped (the next scan sees them).
const MAX_PENDING: usize = 100_000;
/// Hints arriving this close together are fetched together.
const LINGER: Duration = Duration::from_millis(20);

/// One source's waiting items and its allowance.
struct Queue {
    prefix: String,
    rate: f64,
    tokens: f64,
    refilled: Instant,
    pending: BTreeSet<ItemCode>,
}

impl Queue {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.refilled = now;
    }

    /// When the allowance next covers one item.
    fn ready_at(&self) -> Instant {
        let short = (1.0 - self.tokens).max(0.0) / self.rate;
        self.refilled + Duration::from_secs_f64(short).max(LINGER)
    }
}

/// Every source's queue.
pub struct Queues {
    queues: HashMap<String, Queue>,
    /// The sources' prefixes: a hinted code must route to the source it came from.
    routes: SourceConfig,
}

impl Queues {
    pub fn new(config: &SourceConfig) -> Self {
        let now = Instant::now();
        let queues = config
            .sources
            .iter()
            .map(|s| {
                let rate = f64::from(s.hints.rate.max(1));
                let queue = Queue {
                    prefix: s.prefix.clone(),
                    rate,
                    tokens: rate,
                    refilled: now,
                    pending: BTreeSet::new(),
                };
                (s.name.clone(), queue)
            })
            .collect();
        Queues {
            queues,
            routes: config.clone(),
        }
    }

    /// Takes one hint for `source`: its items wait for [`Queues::due`].
    pub fn add(&mut self, source: &str, payload: &[u8]) {
        let Some(queue) = self.queues.get_mut(source) else {
            metrics::hinted(Hinted::Invalid, 1);
            tracing::warn!(
                source,
                "a change hint for a source this detector does not know"
            );
            return;
        };
        let codes = match tidings_domain::hints::decode(payload) {
            Ok(codes) => codes,
            Err(e) => {
                metrics::hinted(Hinted::Invalid, 1);
                tracing::warn!(source, error = %e, "an unreadable change hint");
                return;
            }
        };
        let (mut dropped, mut foreign) = (0, 0);
        for code in codes {
            if let Some(owner) = self.routes.claimed_from(source, code.as_str()) {
                tracing::warn!(source, owner, item = %code, "a change hint for another source's item");
                foreign += 1;
                continue;
            }
            let full = ItemCode::parse(&format!("{}{code}", queue.prefix));
            match full {
                Ok(item) if queue.pending.len() < MAX_PENDING => {
                    queue.pending.insert(item);
                }
                _ => dropped += 1,
            }
        }
        metrics::hinted(Hinted::Dropped, dropped);
        metrics::hinted(Hinted::Foreign, foreign);
    }

    /// When something waiting may next be fetched; `None`: nothing waits.
    fn next_at(&self) -> Option<Instant> {
        self.queues
            .values()
            .filter(|q| !q.pending.is_empty())
            .map(Queue::ready_at)
            .min()
    }

    /// The waiting items this shard watches that their sources' allowances cover now; what
    /// no watch here watches is let go.
    pub async fn due(&mut self, detector: &Detector) -> Vec<ItemCode> {
        let now = Instant::now();
        let mut due = Vec::new();
        for queue in self.queues.values_mut().filter(|q| !q.pending.is_empty()) {
            queue.refill(now);
            let waiting: Vec<ItemCode> = std::mem::take(&mut queue.pending).into_iter().collect();
            let watched = match detector.watched(&waiting).await {
                Ok((watched, unwatched)) => {
                    metrics::hinted(Hinted::Unwatched, unwatched);
                    watched
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the watchlist for change hints");
                    queue.pending = waiting.into_iter().collect();
                    continue;
                }
            };
            // Whole items only: the allowance is spent in units of one fetch.
            let allowed = (queue.tokens.floor() as usize).min(watched.len());
            queue.tokens -= allowed as f64;
            let mut watched = watched.into_iter();
            due.extend(watched.by_ref().take(allowed));
            queue.pending = watched.collect();
        }
        due
    }
}

/// Listens for change hints until `shutdown`, fetching what they name as its allowance comes.
/// Without NATS hints (a failed subscription) the detector still scans: it logs and returns.
pub async fn listen(
    detector: &Detector,
    nats: async_nats::Client,
    subjects: &Subjects,
    config: &SourceConfig,
    shutdown: CancellationToken,
) {
    let all = subjects.all_hints();
    let mut hints = match nats.subscribe(all.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(subject = all, error = %e, "subscribing to change hints; scans only");
            return;
        }
    };
    let mut hinted = Queues::new(config);
    let head = format!("{}.hints.", subjects.prefix());
    loop {
        let wake = hinted.next_at();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            message = hints.next() => match message {
                Some(m) => {
                    let source = m.subject.as_str().strip_prefix(&head).unwrap_or_default();
                    hinted.add(source, &m.payload);
                }
                None => {
                    tracing::error!(subject = all, "the change-hint subscription ended; scans only");
                    return;
                }
            },
            _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                let due = hinted.due(detector).await;
                if due.is_empty() {
                    continue;
                }
                let count = due.len();
                match detector.scan_items(chrono::Utc::now(), due).await {
                    Ok(stats) => {
                        metrics::hinted(Hinted::Fetched, count);
                        metrics::observe_hinted(&stats, detector.is_dry_run());
                        tracing::info!(items = count, evaluated = stats.evaluated, published = stats.published, "change hints fetched");
                    }
                    Err(e) => tracing::error!(items = count, error = %e, "fetching hinted items; the next scan sees them"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `acme`'s hint for `eu:42` became `acme:eu:42`, which the source with prefix
    /// `acme:eu:` reads, so one source's secret made another's items fetched.
    #[test]
    fn a_hinted_code_that_another_source_claims_waits_for_nothing() {
        let config = SourceConfig::new("http://default/{item}")
            .with_source("acme", "acme:")
            .with_source("acme-eu", "acme:eu:");
        let mut queues = Queues::new(&config);
        queues.add("acme", br#"{"items": ["42", "eu:42"]}"#);
        queues.add("acme-eu", br#"{"items": ["7"]}"#);
        let pending = |source: &str| -> Vec<String> {
            queues.queues[source]
                .pending
                .iter()
                .map(|i| i.as_str().to_owned())
                .collect()
        };
        assert_eq!(pending("acme"), ["acme:42"]);
        assert_eq!(pending("acme-eu"), ["acme:eu:7"]);
    }
}
