//! One scan: page through this shard's active watches in (item_code, id) order (keyset
//! pagination, no OFFSET), so each item's watches are contiguous and each item is fetched once per
//! scan (batch endpoint when there is one; an item spanning two pages carries its observation
//! over). Every trigger is evaluated with the shared `evaluate`, and an EnqueueRequest is
//! published per holding trigger with `Nats-Msg-Id` = its dedup key, many acks in flight. A
//! failing item is counted and logged; it never stops the scan.

use async_nats::jetstream;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;
use std::collections::{HashMap, HashSet};
use tidings_shared::dedup::parse_time_zone;
use tidings_shared::messages::encode;
use tidings_shared::publish::{Outgoing, publish_all};
use tidings_shared::source::{Fetched, HttpSource};
use tidings_shared::subjects::StreamKind;
use tidings_shared::telemetry;
use tidings_shared::trigger::{LastSent, Trigger};
use tidings_shared::{Channel, DeviceId, ItemCode, WatchId};
use tokio::sync::Mutex;

use crate::config::Settings;
use crate::evaluate::{Watch, detect};
use crate::memory::Enqueued;

/// What a scan did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanStats {
    pub watches: usize,
    pub items: usize,
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
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("scan: {what}: {source}")]
    Db {
        what: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

fn db(what: &'static str) -> impl FnOnce(sqlx::Error) -> ScanError {
    move |source| ScanError::Db { what, source }
}

#[derive(sqlx::FromRow)]
struct WatchRow {
    id: WatchId,
    device_id: DeviceId,
    item_code: String,
    triggers: Json<Vec<Trigger>>,
    channel: String,
    reference_price: Option<i64>,
    time_zone: String,
    last_in_stock: Option<bool>,
}

pub struct Detector {
    pool: PgPool,
    js: jetstream::Context,
    source: HttpSource,
    settings: Settings,
    memory: Mutex<Enqueued>,
}

impl Detector {
    pub fn new(
        pool: PgPool,
        js: jetstream::Context,
        source: HttpSource,
        settings: Settings,
    ) -> Self {
        let memory = Mutex::new(Enqueued::new(settings.memory_capacity));
        Detector {
            pool,
            js,
            source,
            settings,
            memory,
        }
    }

    /// Whether this detector only prints what it would enqueue.
    pub fn is_dry_run(&self) -> bool {
        self.settings.dry_run
    }

    /// One full scan of this shard's watches, as of `now` (injected so tests control the day).
    pub async fn scan_once(&self, now: DateTime<Utc>) -> Result<ScanStats, ScanError> {
        self.memory.lock().await.start_scan(now.date_naive());
        let started = std::time::Instant::now();
        let mut stats = ScanStats::default();
        let mut after = (String::new(), WatchId(sqlx::types::Uuid::nil()));
        let mut carry: Option<(ItemCode, Fetched)> = None;
        loop {
            let page: Vec<WatchRow> = sqlx::query_as(
                "SELECT w.id, w.device_id, w.item_code, w.triggers, w.channel, w.reference_price,
                        d.time_zone, w.last_in_stock
                 FROM watches w JOIN devices d ON d.id = w.device_id
                 WHERE w.removed_at IS NULL AND NOT w.paused AND d.removed_at IS NULL
                   AND (w.item_code, w.id) > ($1, $2)
                   AND ($4::int = 1
                        OR ((get_byte(uuid_send(w.id), 14) * 256 + get_byte(uuid_send(w.id), 15)) % $4::int) = $5::int)
                 ORDER BY w.item_code, w.id
                 LIMIT $3",
            )
            .bind(&after.0)
            .bind(after.1)
            .bind(self.settings.page_size)
            .bind(i32::try_from(self.settings.shard_count).unwrap_or(1))
            .bind(i32::try_from(self.settings.shard_index).unwrap_or(0))
            .fetch_all(&self.pool)
            .await
            .map_err(db("reading watches"))?;
            let Some(last) = page.last() else { break };
            after = (last.item_code.clone(), last.id);
            let full = page.len() as i64 >= self.settings.page_size;
            self.scan_page(page, (now, started), &mut carry, &mut stats)
                .await?;
            if !full {
                break;
            }
        }
        Ok(stats)
    }

    async fn scan_page(
        &self,
        page: Vec<WatchRow>,
        (scan_now, scan_started): (DateTime<Utc>, std::time::Instant),
        carry: &mut Option<(ItemCode, Fetched)>,
        stats: &mut ScanStats,
    ) -> Result<(), ScanError> {
        stats.watches += page.len();
        let watches: Vec<Watch> = page
            .into_iter()
            .map(|w| Watch {
                id: w.id,
                device_id: w.device_id,
                time_zone: parse_time_zone(&w.time_zone).unwrap_or_else(|e| {
                    tracing::warn!(watch_id = %w.id, error = %e, "device time zone unusable; using UTC");
                    chrono_tz::Tz::UTC
                }),
                item_code: w.item_code,
                triggers: w.triggers.0,
                channel: w.channel.parse().unwrap_or(Channel::WebPush),
                reference_price: w.reference_price,
                last_in_stock: w.last_in_stock,
            })
            .collect();
        let items: Vec<ItemCode> = {
            let mut set: Vec<ItemCode> = watches
                .iter()
                .filter_map(|w| ItemCode::parse(&w.item_code).ok())
                .collect();
            set.sort();
            set.dedup();
            // The previous page's last item may continue here: it was already fetched.
            set.retain(|i| carry.as_ref().is_none_or(|(c, _)| c != i));
            set
        };
        stats.items += items.len();
        let mut fetched = self.source.fetch_many(&items).await;
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

        if let Some((item, answer)) = carry.take() {
            fetched.insert(item, answer);
        }
        if let Some(last) = watches
            .last()
            .and_then(|w| ItemCode::parse(&w.item_code).ok())
            && let Some(answer) = fetched.get(&last)
        {
            *carry = Some((last, answer.clone()));
        }

        let ids: Vec<WatchId> = watches.iter().map(|w| w.id).collect();
        let sent: Vec<(WatchId, String, i64, bool, DateTime<Utc>)> =
            sqlx::query_as("SELECT watch_id, trigger, price, in_stock, sent_at FROM baselines WHERE watch_id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.pool)
                .await
                .map_err(db("reading baselines"))?;
        let mut last_sent: HashMap<WatchId, HashMap<String, LastSent>> = HashMap::new();
        for (watch, trigger, price, in_stock, sent_at) in sent {
            last_sent.entry(watch).or_default().insert(
                trigger,
                LastSent {
                    price,
                    in_stock,
                    sent_at,
                },
            );
        }

        let empty = HashMap::new();
        let mut detections = Vec::new();
        let mut stock_changes = Vec::new();
        let mut references = Vec::new();
        for w in &watches {
            let Some(Ok(obs)) = ItemCode::parse(&w.item_code)
                .ok()
                .and_then(|c| fetched.get(&c))
            else {
                continue;
            };
            detections.extend(detect(w, obs, last_sent.get(&w.id).unwrap_or(&empty), now));
            // Only back_in_stock reads the previous stock state; other watches need no write.
            if w.last_in_stock != Some(obs.in_stock) && w.triggers.contains(&Trigger::BackInStock) {
                stock_changes.push((w.id, obs.in_stock));
            }
            // A watch made through the api has no reference price yet: price_drop measures from
            // the first price this watch saw.
            if w.reference_price.is_none()
                && w.triggers
                    .iter()
                    .any(|t| matches!(t, Trigger::PriceDrop { .. }))
            {
                references.push((w.id, obs.price));
            }
        }
        let holding = detections.len();
        stats.holding += holding;

        let mut memory = self.memory.lock().await;
        let fresh: Vec<_> = detections
            .into_iter()
            .filter(|d| !memory.contains(&d.dedup_key().to_string()))
            .collect();
        stats.remembered += holding - fresh.len();
        if self.settings.dry_run {
            for d in &fresh {
                println!("{}", serde_json::to_string(d).unwrap_or_default());
            }
            stats.published += fresh.len();
            return Ok(());
        }
        // A detection starts its notification's trace; the span's context travels in the
        // EnqueueRequest's headers.
        let spans: Vec<tracing::Span> = if telemetry::exporting() {
            fresh
                .iter()
                .map(|d| {
                    tracing::info_span!(
                        "detect",
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
        let outgoing = fresh
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", d.dedup_key().to_string().as_str());
                if let Some(tp) = spans.get(i).and_then(telemetry::traceparent) {
                    headers.insert("traceparent", tp.as_str());
                }
                Outgoing {
                    subject: self
                        .settings
                        .subjects
                        .subject(StreamKind::Enqueue, d.channel),
                    headers,
                    payload: encode(d),
                }
            })
            .collect();
        let mut failed: HashSet<WatchId> = HashSet::new();
        for (d, ack) in fresh
            .iter()
            .zip(publish_all(&self.js, outgoing, 1024).await)
        {
            match ack {
                Ok(ack) => {
                    if ack.duplicate {
                        stats.duplicates += 1;
                    } else {
                        stats.published += 1;
                    }
                    memory.remember(d.dedup_key().to_string(), d.dedup_day);
                }
                Err(e) => {
                    stats.publish_errors += 1;
                    failed.insert(d.watch_id);
                    tracing::error!(watch_id = %d.watch_id, trigger = %d.trigger, error = %e, "publishing EnqueueRequest failed; the next scan tries again");
                }
            }
        }
        drop(memory);
        drop(spans);

        // The stock state moves on only where nothing failed to publish, so a back_in_stock that
        // could not be enqueued is detected again next scan.
        let (ids, states): (Vec<WatchId>, Vec<bool>) = stock_changes
            .into_iter()
            .filter(|(id, _)| !failed.contains(id))
            .unzip();
        if !ids.is_empty() {
            sqlx::query(
                "UPDATE watches w SET last_in_stock = u.s
                 FROM UNNEST($1::uuid[], $2::bool[]) AS u(id, s) WHERE w.id = u.id",
            )
            .bind(ids)
            .bind(states)
            .execute(&self.pool)
            .await
            .map_err(db("recording stock states"))?;
        }
        if !references.is_empty() {
            let (ids, prices): (Vec<WatchId>, Vec<i64>) = references.into_iter().unzip();
            sqlx::query(
                "UPDATE watches w SET reference_price = u.p
                 FROM UNNEST($1::uuid[], $2::bigint[]) AS u(id, p)
                 WHERE w.id = u.id AND w.reference_price IS NULL",
            )
            .bind(ids)
            .bind(prices)
            .execute(&self.pool)
            .await
            .map_err(db("recording reference prices"))?;
        }
        Ok(())
    }
}
