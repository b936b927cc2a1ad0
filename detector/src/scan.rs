//! One scan: bring this shard's watchlist up to date (the rows written since the previous scan),
//! fetch every watched item once (batch endpoint when there is one, ~`page_size` watches' items
//! per request round), and evaluate, with the shared `evaluate`, the watches of each item whose
//! observation or watches changed since an evaluation that found nothing (see `watchlist`). An
//! EnqueueRequest is published per holding trigger, up to `TIDINGS_DETECTOR_PUBLISH_BATCH` to a
//! message (one alone has `Nats-Msg-Id` = its dedup key), many acks in flight. A failing item is
//! counted and logged; it never stops the scan.

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_domain::messages::{EnqueueRequest, EnqueueRequests, encode};
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_domain::{ItemCode, WatchId};
use tidings_runtime::telemetry;
use tidings_source::HttpSource;
use tokio::sync::Mutex;

use crate::config::Settings;
use crate::evaluate::detect;
use crate::memory::Enqueued;
use crate::watchlist::{Entry, Watchlist};
use tidings_store::watches::Seen;
use tidings_store::{DbError, db};

/// What a scan did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanStats {
    /// Active watches in this shard.
    pub watches: usize,
    /// Watch rows and baseline rows read from the database for this scan.
    pub rows_read: usize,
    pub items: usize,
    /// Watches evaluated: those whose item's value, the watch or its baselines changed, or whose
    /// item had something left to do.
    pub evaluated: usize,
    /// Items the source could not answer for this scan.
    pub source_errors: usize,
    /// Triggers that held.
    pub holding: usize,
    /// Holding triggers already enqueued today by this detector (not published again).
    pub remembered: usize,
    pub published: usize,
    /// Published, but JetStream's duplicate window already had the key.
    pub duplicates: usize,
    pub publish_errors: usize,
    /// Holding triggers left for a later scan: the scan's budget (what the enqueue stream had
    /// room for, [`crate::hold`]) was spent. Their items are evaluated again next scan.
    pub deferred: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("scan: {0}")]
    Db(#[from] DbError),
}

pub struct Detector {
    pool: PgPool,
    js: jetstream::Context,
    source: HttpSource,
    settings: Settings,
    memory: Mutex<Enqueued>,
    watchlist: Mutex<Watchlist>,
    /// The item whose triggers the last scan's budget could not all take: the next scan starts
    /// there, so under a lasting overload every item gets its turn, not only the first ones.
    resume_at: Mutex<Option<ItemCode>>,
}

impl Detector {
    pub fn new(
        pool: PgPool,
        js: jetstream::Context,
        source: HttpSource,
        settings: Settings,
    ) -> Self {
        let memory = Mutex::new(Enqueued::new(
            settings.memory_capacity,
            chrono::TimeDelta::from_std(settings.republish_after).unwrap_or(chrono::TimeDelta::MAX),
        ));
        Detector {
            pool,
            js,
            source,
            settings,
            memory,
            watchlist: Mutex::new(Watchlist::new()),
            resume_at: Mutex::new(None),
        }
    }

    /// Whether this detector only prints what it would enqueue.
    pub fn is_dry_run(&self) -> bool {
        self.settings.dry_run
    }

    /// One scan of this shard's watches, as of `now` (injected so tests control the day).
    pub async fn scan_once(&self, now: DateTime<Utc>) -> Result<ScanStats, ScanError> {
        self.scan_within(now, None).await
    }

    /// One scan that publishes at most `budget` new EnqueueRequests (`None`: no bound); the
    /// triggers past it are left for a later scan, which starts at their item.
    pub async fn scan_within(
        &self,
        now: DateTime<Utc>,
        budget: Option<usize>,
    ) -> Result<ScanStats, ScanError> {
        let mut budget = Budget {
            left: budget,
            stopped_at: None,
        };
        self.memory.lock().await.start_scan(now.date_naive());
        let started = std::time::Instant::now();
        let mut list = self.watchlist.lock().await;
        let read = list
            .refresh(&self.pool, &self.settings)
            .await
            .map_err(db("reading the watches and baselines that changed"))?;
        let mut stats = ScanStats {
            watches: list.len(),
            rows_read: read.watches + read.baselines,
            ..ScanStats::default()
        };
        let page_size = usize::try_from(self.settings.page_size).unwrap_or(1).max(1);
        let mut pages: Vec<Vec<ItemCode>> = Vec::new();
        let mut in_page = page_size;
        // From where the last scan's budget ran out, around to just before it.
        let resume_at = self.resume_at.lock().await.take();
        let (before, from): (Vec<_>, Vec<_>) = list
            .items()
            .partition(|(code, _)| resume_at.as_ref().is_some_and(|r| *code < r));
        for (code, watches) in from.into_iter().chain(before) {
            if in_page >= page_size {
                pages.push(Vec::new());
                in_page = 0;
            }
            if let Some(page) = pages.last_mut() {
                page.push(code.clone());
            }
            in_page += watches;
        }
        for page in pages {
            self.scan_page(&mut list, page, (now, started), &mut stats, &mut budget)
                .await?;
        }
        *self.resume_at.lock().await = budget.stopped_at;
        Ok(stats)
    }

    async fn scan_page(
        &self,
        list: &mut Watchlist,
        items: Vec<ItemCode>,
        (scan_now, scan_started): (DateTime<Utc>, std::time::Instant),
        stats: &mut ScanStats,
        budget: &mut Budget,
    ) -> Result<(), ScanError> {
        stats.items += items.len();
        let fetched = self.source.fetch_many(&items).await;
        // Detected when observed: the scan's clock plus the time this scan has taken so far (a
        // large scan takes seconds; stamping every page with the scan's start would overstate
        // detection → delivery latency by up to that).
        let now = scan_now + chrono::Duration::from_std(scan_started.elapsed()).unwrap_or_default();
        for (item, answer) in &fetched {
            if let Err(e) = answer {
                stats.source_errors += 1;
                tracing::warn!(item = %item, kind = e.kind.as_str(), error = %e, "source could not answer for item");
            }
        }

        let mut detections = Vec::new();
        // The time zone of each detection's watch, in the same order.
        let mut zones = Vec::new();
        let mut stock_changes = Vec::new();
        let mut references = Vec::new();
        // Per evaluated item: its detections (a range of `detections`) and whether it has a
        // state to record.
        let mut evaluated = Vec::new();
        for code in &items {
            let Some(Ok(obs)) = fetched.get(code) else {
                continue;
            };
            let entries = list.to_evaluate(code, obs, now);
            if entries.is_empty() {
                continue;
            }
            let first = detections.len();
            let writes_before = stock_changes.len() + references.len();
            for Entry {
                watch: w,
                last_sent,
                ..
            } in entries
            {
                stats.evaluated += 1;
                let found = detect(w, obs, last_sent, now);
                zones.extend(found.iter().map(|_| w.time_zone));
                detections.extend(found);
                // Only back_in_stock reads the previous stock state; other watches need no write.
                if w.last_in_stock != Some(obs.in_stock)
                    && w.triggers.contains(&Trigger::BackInStock)
                {
                    stock_changes.push((w.id, obs.in_stock));
                }
                // A watch made through the api has no reference price yet: price_drop measures
                // from the first price this watch saw.
                if w.reference_price.is_none()
                    && w.triggers
                        .iter()
                        .any(|t| matches!(t, Trigger::PriceDrop { .. }))
                {
                    references.push((w.id, obs.price));
                }
            }
            let writes = stock_changes.len() + references.len() > writes_before;
            evaluated.push((code, obs, first..detections.len(), writes));
        }
        let holding = detections.len();
        stats.holding += holding;
        // Each detection's dedup key, formatted once: it is the memory's key and the Nats-Msg-Id.
        let keys: Vec<String> = detections
            .iter()
            .map(|d| d.dedup_key().to_string())
            .collect();

        let mut memory = self.memory.lock().await;
        let republish_at = memory.trusted_until(now);
        let mut unsent: Vec<usize> = (0..holding)
            .filter(|&i| !memory.contains(&keys[i], now))
            .collect();
        stats.remembered += holding - unsent.len();
        let deferred = budget.take(&mut unsent);
        stats.deferred += deferred.len();
        if let Some(&first) = deferred.first()
            && budget.stopped_at.is_none()
        {
            budget.stopped_at = evaluated
                .iter()
                .find(|(_, _, found, _)| found.contains(&first))
                .map(|(code, ..)| (*code).clone());
        }
        let fresh: Vec<(&EnqueueRequest, &String)> =
            unsent.iter().map(|&i| (&detections[i], &keys[i])).collect();
        if self.settings.dry_run {
            for (d, _) in &fresh {
                println!("{}", serde_json::to_string(d).unwrap_or_default());
            }
            stats.published += fresh.len();
            // Nothing was enqueued: what held is still to do.
            for (code, obs, found, writes) in evaluated {
                let quiet = found.is_empty() && !writes;
                list.evaluated(code, obs, quiet.then(Vec::new), republish_at);
            }
            return Ok(());
        }
        // A detection starts its notification's trace; the span's context travels in the
        // EnqueueRequest's headers.
        let spans: Vec<tracing::Span> = if telemetry::exporting() {
            fresh
                .iter()
                .map(|(d, key)| {
                    tracing::info_span!(
                        "detect",
                        otel.kind = "producer",
                        messaging.system = "nats",
                        messaging.operation.type = "publish",
                        messaging.destination.name =
                            %self.settings.subjects.subject(StreamKind::Enqueue, d.channel),
                        messaging.message.id = key.as_str(),
                        watch_id = %d.watch_id,
                        trigger = %d.trigger,
                        channel = d.channel.as_str(),
                        price = d.detected.price,
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        // New detections and re-publishes alike go in batches of up to `publish_batch`, one
        // channel to a message. A batch's id names its keys, so a re-publish of the same
        // triggers together (they were trusted until the same scan) is answered `duplicate`
        // like a lone key's; one made differently reaches ingest, whose unique key absorbs it.
        let mut by_channel: Vec<Vec<usize>> = Vec::new();
        for i in 0..fresh.len() {
            match by_channel
                .iter_mut()
                .find(|g| fresh[g[0]].0.channel == fresh[i].0.channel)
            {
                Some(g) => g.push(i),
                None => by_channel.push(vec![i]),
            }
        }
        let batch = self.settings.publish_batch.max(1);
        let groups: Vec<Vec<usize>> = by_channel
            .iter()
            .flat_map(|g| g.chunks(batch).map(<[usize]>::to_vec))
            .collect();
        let outgoing = groups
            .iter()
            .map(|group| self.message(group, &fresh, &spans))
            .collect();
        // Deferred triggers count as not yet published: their items stay to do.
        let mut failed: HashSet<WatchId> =
            deferred.iter().map(|&i| detections[i].watch_id).collect();
        for (group, ack) in groups
            .iter()
            .zip(publish_all(&self.js, outgoing, 1024).await)
        {
            for &i in group {
                let (d, key) = fresh[i];
                match &ack {
                    Ok(ack) => {
                        if ack.duplicate {
                            stats.duplicates += 1;
                        } else {
                            stats.published += 1;
                        }
                        memory.remember(key.clone(), d.dedup_day, now);
                    }
                    Err(e) => {
                        stats.publish_errors += 1;
                        failed.insert(d.watch_id);
                        if let Some(span) = spans.get(i) {
                            telemetry::fail(
                                span,
                                &format!("publishing EnqueueRequest failed: {e}"),
                            );
                        }
                        tracing::error!(watch_id = %d.watch_id, trigger = %d.trigger, error = %e, "publishing EnqueueRequest failed; the next scan tries again");
                    }
                }
            }
        }
        // An item is settled when every trigger that held for it is now enqueued for its day
        // and nothing is left to record.
        for (code, obs, found, writes) in evaluated {
            let done = (!writes && keys[found.clone()].iter().all(|k| memory.contains(k, now)))
                .then(|| {
                    detections[found.clone()]
                        .iter()
                        .zip(&zones[found])
                        .map(|(d, tz)| (*tz, d.dedup_day))
                        .collect()
                });
            list.evaluated(code, obs, done, republish_at);
        }
        drop(memory);
        drop(spans);

        // The stock state moves on only where nothing failed to publish, so a back_in_stock that
        // could not be enqueued is detected again next scan. One statement for both kinds of
        // write, one entry per watch (an UPDATE … FROM applies one joined row per watch).
        let mut writes: HashMap<WatchId, (Option<bool>, Option<i64>)> = HashMap::new();
        for (id, state) in stock_changes {
            if !failed.contains(&id) {
                writes.entry(id).or_default().0 = Some(state);
            }
        }
        for (id, price) in references {
            writes.entry(id).or_default().1 = Some(price);
        }
        if !writes.is_empty() {
            let seen: Vec<Seen> = writes
                .iter()
                .map(|(id, (state, price))| Seen {
                    watch_id: *id,
                    in_stock: *state,
                    reference_price: *price,
                })
                .collect();
            tidings_store::watches::record_seen(&self.pool, &seen)
                .await
                .map_err(db("recording stock states and reference prices"))?;
            for (id, (state, price)) in writes {
                if let Some(state) = state {
                    list.set_last_in_stock(id, state);
                }
                if let Some(price) = price {
                    list.set_reference_price(id, price);
                }
            }
        }
        Ok(())
    }

    /// The message for `group` (indices into `fresh`, one channel): a request alone, with its
    /// dedup key as `Nats-Msg-Id` and its span's trace in the header, or an [`EnqueueRequests`]
    /// batch whose requests each carry their own trace.
    fn message(
        &self,
        group: &[usize],
        fresh: &[(&EnqueueRequest, &String)],
        spans: &[tracing::Span],
    ) -> Outgoing {
        let traceparent = |i: usize| spans.get(i).and_then(telemetry::traceparent);
        let (first, key) = fresh[group[0]];
        let subject = self
            .settings
            .subjects
            .subject(StreamKind::Enqueue, first.channel);
        let mut headers = async_nats::HeaderMap::new();
        if let [only] = group {
            headers.insert("Nats-Msg-Id", key.as_str());
            if let Some(tp) = traceparent(*only) {
                headers.insert("traceparent", tp.as_str());
            }
            return Outgoing {
                subject,
                headers,
                payload: encode(first),
            };
        }
        let batch = EnqueueRequests::new(
            group
                .iter()
                .map(|&i| EnqueueRequest {
                    traceparent: traceparent(i),
                    ..fresh[i].0.clone()
                })
                .collect(),
        );
        headers.insert("Nats-Msg-Id", batch.msg_id().as_str());
        Outgoing {
            subject,
            headers,
            payload: encode(&batch),
        }
    }
}

/// How many more EnqueueRequests a scan may publish, and where it first could not.
struct Budget {
    left: Option<usize>,
    stopped_at: Option<ItemCode>,
}

impl Budget {
    /// Keeps in `unsent` what the budget still allows and returns the rest (detection indices).
    fn take(&mut self, unsent: &mut Vec<usize>) -> Vec<usize> {
        let Some(left) = self.left.as_mut() else {
            return Vec::new();
        };
        let keep = unsent.len().min(*left);
        *left -= keep;
        unsent.split_off(keep)
    }
}
