//! One scan: bring this shard's watchlist up to date (the rows written since the previous scan),
//! fetch every watched item once (batch endpoint when there is one, ~`page_size` watches' items
//! per request round), and evaluate, with the shared `evaluate`, the watches of each item whose
//! observation or watches changed since an evaluation that found nothing (see `watchlist`). An
//! EnqueueRequest is published per holding trigger, up to `TIDINGS_DETECTOR_PUBLISH_BATCH` to a
//! message (one alone has `Nats-Msg-Id` = its dedup key), many acks in flight. A failing item is
//! counted and logged; it never stops the scan.

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::time::Duration;
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_domain::messages::{EnqueueRequest, EnqueueRequests, encode};
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::{Observation, Trigger};
use tidings_domain::{ItemCode, WatchId};
use tidings_runtime::telemetry;
use tidings_source::{Fetched, Sources};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

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
    /// Time spent waiting between pages (the scan's spread), not scanning.
    pub waited: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("scan: {0}")]
    Db(#[from] DbError),
}

pub struct Detector {
    pool: PgPool,
    js: jetstream::Context,
    source: Sources,
    settings: Settings,
    memory: Mutex<Enqueued>,
    watchlist: Mutex<Watchlist>,
    /// The item whose triggers the last scan's budget could not all take: the next scan starts
    /// there, so under a lasting overload every item gets its turn, not only the first ones.
    resume_at: Mutex<Option<ItemCode>>,
}

impl Detector {
    pub fn new(pool: PgPool, js: jetstream::Context, source: Sources, settings: Settings) -> Self {
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

    /// The part of the interval a scan's pages are spread over.
    pub fn spread(&self) -> Duration {
        self.settings.spread()
    }

    /// Whether this detector only prints what it would enqueue.
    pub fn is_dry_run(&self) -> bool {
        self.settings.dry_run
    }

    /// One scan of this shard's watches, as of `now` (injected so tests control the day), its
    /// pages one after another.
    pub async fn scan_once(&self, now: DateTime<Utc>) -> Result<ScanStats, ScanError> {
        self.scan_within(now, None, Duration::ZERO, &CancellationToken::new())
            .await
    }

    /// One scan that publishes at most `budget` new EnqueueRequests (`None`: no bound); the
    /// triggers past it are left for a later scan, which starts at their item. Its pages start
    /// evenly over `spread`, so the source is asked at a steady rate and what the scan finds
    /// reaches the pipeline as it comes, not as one burst per interval. The watchlist is not
    /// held between pages: change hints go on while a scan waits. Once `stop` is cancelled it
    /// waits no more: the pages left are the next scan's, as past a budget.
    pub async fn scan_within(
        &self,
        now: DateTime<Utc>,
        budget: Option<usize>,
        spread: Duration,
        stop: &CancellationToken,
    ) -> Result<ScanStats, ScanError> {
        let mut budget = Budget {
            left: budget,
            stopped_at: None,
        };
        let started = std::time::Instant::now();
        let (list, mut stats) = self.begin(now).await?;
        let pages = self.pages(&list).await;
        drop(list);
        let count = pages.len();
        for (i, page) in pages.into_iter().enumerate() {
            let due = started + spread.mul_f64(i as f64 / count as f64);
            let waiting = std::time::Instant::now();
            if due > waiting {
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    _ = stop.cancelled() => {
                        // Unless a spent budget already named an earlier item.
                        if budget.stopped_at.is_none() {
                            budget.stopped_at = page.first().cloned();
                        }
                        break;
                    }
                }
                stats.waited += waiting.elapsed();
            }
            let mut list = self.watchlist.lock().await;
            self.scan_page(&mut list, page, (now, started), &mut stats, &mut budget)
                .await?;
        }
        *self.resume_at.lock().await = budget.stopped_at;
        Ok(stats)
    }

    /// The shard's items in pages of about `page_size` watches, from where the last scan's
    /// budget ran out, around to just before it.
    async fn pages(&self, list: &Watchlist) -> Vec<Vec<ItemCode>> {
        // A page size is a small `u32`, which fits `usize`; at least one watch a page.
        let page_size = usize::try_from(self.settings.page_size).unwrap_or(1).max(1);
        let mut pages: Vec<Vec<ItemCode>> = Vec::new();
        let mut in_page = page_size;
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
        pages
    }

    /// The watchlist, brought up to date, for a scan as of `now`.
    async fn begin(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(tokio::sync::MutexGuard<'_, Watchlist>, ScanStats), ScanError> {
        self.memory.lock().await.start_scan(now.date_naive());
        let mut list = self.watchlist.lock().await;
        let read = list
            .refresh(&self.pool, &self.settings)
            .await
            .map_err(db("reading the watches and baselines that changed"))?;
        let stats = ScanStats {
            watches: list.len(),
            rows_read: read.watches + read.baselines,
            ..ScanStats::default()
        };
        Ok((list, stats))
    }

    /// The items this shard watches that a change to `items` touches (each, and the offers of
    /// it that watches name), the list brought up to date first.
    /// Also says how many of `items` touch none.
    pub async fn watched(&self, items: &[ItemCode]) -> Result<(Vec<ItemCode>, usize), ScanError> {
        let (list, _) = self.begin(Utc::now()).await?;
        let mut unwatched = 0;
        let mut watched = Vec::new();
        for code in items {
            let before = watched.len();
            watched.extend(list.touched(code).cloned());
            unwatched += usize::from(watched.len() == before);
        }
        watched.sort();
        watched.dedup();
        Ok((watched, unwatched))
    }

    /// Fetches `items` now and evaluates their watches: a change hint's (see [`crate::hints`]),
    /// through the same steps as a scan's pages, with no budget (hints are rate-limited before).
    pub async fn scan_items(
        &self,
        now: DateTime<Utc>,
        items: Vec<ItemCode>,
    ) -> Result<ScanStats, ScanError> {
        let started = std::time::Instant::now();
        let (mut list, mut stats) = self.begin(now).await?;
        // Watched when `watched` looked; a watch removed since is simply not found.
        let watched: Vec<ItemCode> = items
            .into_iter()
            .filter(|code| list.touched(code).next().is_some())
            .collect();
        let mut budget = Budget {
            left: None,
            stopped_at: None,
        };
        // A page size is a small `u32`, which fits `usize`; at least one watch a page.
        let page_size = usize::try_from(self.settings.page_size).unwrap_or(1).max(1);
        for page in watched.chunks(page_size) {
            self.scan_page(
                &mut list,
                page.to_vec(),
                (now, started),
                &mut stats,
                &mut budget,
            )
            .await?;
        }
        Ok(stats)
    }

    /// One page of items: fetch → evaluate → select → publish → record. Each step takes what the
    /// one before it found.
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
        count_source_errors(&fetched, stats);
        let found = evaluate(list, &items, &fetched, now, stats);

        let mut memory = self.memory.lock().await;
        let republish_at = memory.trusted_until(now);
        let chosen = select(&memory, &found, now, budget, stats);
        if self.settings.dry_run {
            for &i in &chosen.fresh {
                println!(
                    "{}",
                    serde_json::to_string(&found.detections[i].request).unwrap_or_default()
                );
            }
            stats.published += chosen.fresh.len();
            // Nothing was enqueued: what held is still to do.
            for item in &found.items {
                let quiet = item.found.is_empty() && !item.writes;
                list.evaluated(item.code, item.obs, quiet.then(Vec::new), republish_at);
            }
            return Ok(());
        }
        let mut failed = self
            .publish(&found.detections, &chosen.fresh, &mut memory, now, stats)
            .await;
        // Deferred triggers count as not yet published: their items stay to do.
        failed.extend(
            chosen
                .deferred
                .iter()
                .map(|&i| found.detections[i].request.watch_id),
        );
        mark_settled(list, &found, &memory, now, republish_at);
        drop(memory);
        self.record_seen(list, found.writes, &failed).await
    }

    /// Publishes detections `fresh` (indices into `detections`) in batches of up to
    /// `publish_batch`, one channel to a message, remembering each that JetStream took; returns
    /// the watches whose triggers could not be published.
    async fn publish(
        &self,
        detections: &[Found],
        fresh: &[usize],
        memory: &mut Enqueued,
        now: DateTime<Utc>,
        stats: &mut ScanStats,
    ) -> HashSet<WatchId> {
        let spans = self.detect_spans(detections, fresh);
        // A batch's id names its keys, so a re-publish of the same triggers together (they were
        // trusted until the same scan) is answered `duplicate` like a lone key's; one made
        // differently reaches ingest, whose unique key absorbs it.
        let groups = batches(detections, fresh, self.settings.publish_batch.max(1));
        let outgoing = groups
            .iter()
            .map(|group| self.message(group, detections, &spans))
            .collect();
        let mut failed = HashSet::new();
        let acks = publish_all(&self.js, outgoing, 1024).await;
        for (group, ack) in groups.iter().zip(acks) {
            for &(i, span) in group {
                let d = &detections[i];
                match &ack {
                    Ok(ack) => {
                        if ack.duplicate {
                            stats.duplicates += 1;
                        } else {
                            stats.published += 1;
                        }
                        memory.remember(d.key.clone(), d.request.dedup_day, now);
                    }
                    Err(e) => {
                        stats.publish_errors += 1;
                        failed.insert(d.request.watch_id);
                        if let Some(span) = spans.get(span) {
                            telemetry::fail(
                                span,
                                &format!("publishing EnqueueRequest failed: {e}"),
                            );
                        }
                        tracing::error!(watch_id = %d.request.watch_id, trigger = %d.request.trigger, error = %e, "publishing EnqueueRequest failed; the next scan tries again");
                    }
                }
            }
        }
        failed
    }

    /// A detection starts its notification's trace: one span per fresh detection (in `fresh`'s
    /// order) while traces are exported, whose context travels in the EnqueueRequest.
    fn detect_spans(&self, detections: &[Found], fresh: &[usize]) -> Vec<tracing::Span> {
        if !telemetry::exporting() {
            return Vec::new();
        }
        fresh
            .iter()
            .map(|&i| {
                let (d, key) = (&detections[i].request, &detections[i].key);
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
    }

    /// Records stock states and first prices in one statement, and in the list. The stock state
    /// moves on only where nothing failed to publish, so a back_in_stock that could not be
    /// enqueued is detected again next scan.
    async fn record_seen(
        &self,
        list: &mut Watchlist,
        writes: Writes,
        failed: &HashSet<WatchId>,
    ) -> Result<(), ScanError> {
        // One entry per watch: an UPDATE … FROM applies one joined row per watch.
        let mut seen: HashMap<WatchId, Seen> = HashMap::new();
        let nothing = |watch_id| Seen {
            watch_id,
            in_stock: None,
            reference_price: None,
        };
        for (id, state) in writes.stock {
            if !failed.contains(&id) {
                seen.entry(id).or_insert_with(|| nothing(id)).in_stock = Some(state);
            }
        }
        for (id, price) in writes.references {
            seen.entry(id)
                .or_insert_with(|| nothing(id))
                .reference_price = Some(price);
        }
        if seen.is_empty() {
            return Ok(());
        }
        let seen: Vec<Seen> = seen.into_values().collect();
        tidings_store::watches::record_seen(&self.pool, &seen)
            .await
            .map_err(db("recording stock states and reference prices"))?;
        for s in seen {
            if let Some(state) = s.in_stock {
                list.set_last_in_stock(s.watch_id, state);
            }
            if let Some(price) = s.reference_price {
                list.set_reference_price(s.watch_id, price);
            }
        }
        Ok(())
    }

    /// The message for `group` (one channel): a request alone, with its dedup key as
    /// `Nats-Msg-Id` and its span's trace in the header, or an [`EnqueueRequests`] batch whose
    /// requests each carry their own trace.
    fn message(
        &self,
        group: &[(usize, usize)],
        detections: &[Found],
        spans: &[tracing::Span],
    ) -> Outgoing {
        let traceparent = |span: usize| spans.get(span).and_then(telemetry::traceparent);
        let first = &detections[group[0].0];
        let subject = self
            .settings
            .subjects
            .subject(StreamKind::Enqueue, first.request.channel);
        if let [(_, span)] = group {
            let mut one =
                Outgoing::deduplicated(subject, first.key.as_str(), encode(&first.request));
            if let Some(tp) = traceparent(*span) {
                one.headers.insert("traceparent", tp.as_str());
            }
            return one;
        }
        let batch = EnqueueRequests::new(
            group
                .iter()
                .map(|&(i, span)| EnqueueRequest {
                    traceparent: traceparent(span),
                    ..detections[i].request.clone()
                })
                .collect(),
        );
        Outgoing::deduplicated(subject, &batch.msg_id(), encode(&batch))
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

/// One detection: the request, its dedup key (the memory's key and the `Nats-Msg-Id`, formatted
/// once) and its watch's time zone (which day the key counts in).
struct Found {
    request: EnqueueRequest,
    key: String,
    zone: Tz,
}

/// An evaluated item: its detections (a range of [`Evaluation::detections`]) and whether it has a
/// state to record.
struct ItemEvaluated<'a> {
    code: &'a ItemCode,
    obs: &'a Observation,
    found: Range<usize>,
    writes: bool,
}

/// What the watches' states need: a new stock state for back_in_stock, a first price for
/// price_drop.
#[derive(Default)]
struct Writes {
    stock: Vec<(WatchId, bool)>,
    references: Vec<(WatchId, i64)>,
}

/// What evaluating a page found.
#[derive(Default)]
struct Evaluation<'a> {
    detections: Vec<Found>,
    items: Vec<ItemEvaluated<'a>>,
    writes: Writes,
}

fn count_source_errors(fetched: &HashMap<ItemCode, Fetched>, stats: &mut ScanStats) {
    for (item, answer) in fetched {
        if let Err(e) = answer {
            stats.source_errors += 1;
            tracing::warn!(item = %item, kind = e.kind.as_str(), error = %e, "source could not answer for item");
        }
    }
}

/// Evaluates the watches of each answered item that changed since an evaluation that found
/// nothing to do.
fn evaluate<'a>(
    list: &Watchlist,
    items: &'a [ItemCode],
    fetched: &'a HashMap<ItemCode, Fetched>,
    now: DateTime<Utc>,
    stats: &mut ScanStats,
) -> Evaluation<'a> {
    let mut out = Evaluation::default();
    for code in items {
        let Some(Ok(obs)) = fetched.get(code) else {
            continue;
        };
        let entries = list.to_evaluate(code, obs, now);
        if entries.is_empty() {
            continue;
        }
        let first = out.detections.len();
        let writes_before = out.writes.stock.len() + out.writes.references.len();
        for Entry {
            watch: w,
            last_sent,
            ..
        } in entries
        {
            stats.evaluated += 1;
            out.detections
                .extend(
                    detect(w, obs, last_sent, now)
                        .into_iter()
                        .map(|request| Found {
                            key: request.dedup_key().to_string(),
                            request,
                            zone: w.time_zone,
                        }),
                );
            // Only back_in_stock reads the previous stock state; other watches need no write.
            if w.last_in_stock != Some(obs.in_stock) && w.triggers.contains(&Trigger::BackInStock) {
                out.writes.stock.push((w.id, obs.in_stock));
            }
            // A watch made through the api has no reference price yet: price_drop measures from
            // the first price this watch saw.
            if w.reference_price.is_none()
                && w.triggers
                    .iter()
                    .any(|t| matches!(t, Trigger::PriceDrop { .. }))
            {
                out.writes.references.push((w.id, obs.price));
            }
        }
        let writes = out.writes.stock.len() + out.writes.references.len() > writes_before;
        out.items.push(ItemEvaluated {
            code,
            obs,
            found: first..out.detections.len(),
            writes,
        });
    }
    stats.holding += out.detections.len();
    out
}

/// Which detections to publish: those this detector has not enqueued today, within the budget.
struct Selection {
    /// Indices into [`Evaluation::detections`].
    fresh: Vec<usize>,
    /// Past the budget: left for a later scan.
    deferred: Vec<usize>,
}

fn select(
    memory: &Enqueued,
    found: &Evaluation<'_>,
    now: DateTime<Utc>,
    budget: &mut Budget,
    stats: &mut ScanStats,
) -> Selection {
    let mut fresh: Vec<usize> = (0..found.detections.len())
        .filter(|&i| !memory.contains(&found.detections[i].key, now))
        .collect();
    stats.remembered += found.detections.len() - fresh.len();
    let deferred = budget.take(&mut fresh);
    stats.deferred += deferred.len();
    if let Some(&first) = deferred.first()
        && budget.stopped_at.is_none()
    {
        budget.stopped_at = found
            .items
            .iter()
            .find(|item| item.found.contains(&first))
            .map(|item| item.code.clone());
    }
    Selection { fresh, deferred }
}

/// Detections `fresh` grouped for publishing: one channel to a group, at most `batch` to a
/// group; each entry is (index into the detections, index into `fresh`, which is its span's).
fn batches(detections: &[Found], fresh: &[usize], batch: usize) -> Vec<Vec<(usize, usize)>> {
    let mut by_channel: Vec<Vec<(usize, usize)>> = Vec::new();
    for (n, &i) in fresh.iter().enumerate() {
        let channel = detections[i].request.channel;
        match by_channel
            .iter_mut()
            .find(|g| detections[g[0].0].request.channel == channel)
        {
            Some(g) => g.push((i, n)),
            None => by_channel.push(vec![(i, n)]),
        }
    }
    by_channel
        .iter()
        .flat_map(|g| g.chunks(batch).map(<[(usize, usize)]>::to_vec))
        .collect()
}

/// Marks each evaluated item: settled when every trigger that held for it is now enqueued for
/// its day and nothing is left to record, to do again otherwise.
fn mark_settled(
    list: &mut Watchlist,
    found: &Evaluation<'_>,
    memory: &Enqueued,
    now: DateTime<Utc>,
    republish_at: DateTime<Utc>,
) {
    for item in &found.items {
        let held = &found.detections[item.found.clone()];
        let done = (!item.writes && held.iter().all(|d| memory.contains(&d.key, now)))
            .then(|| held.iter().map(|d| (d.zone, d.request.dedup_day)).collect());
        list.evaluated(item.code, item.obs, done, republish_at);
    }
}
