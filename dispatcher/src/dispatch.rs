//! Dispatch: claim due rows → pre-guards → re-fetch (batched by item) → re-check → `sending` →
//! publish PushRequest.
//!
//! The order matters. A row is marked `sending` (with its attempt, deadline and lease) before its
//! PushRequest is published, so a crash between the two leaves a `sending` row that the lease
//! sweeper retries; publishing first could deliver a notification whose row still looks unsent.
//! If the publish itself fails, the row goes straight back to `retry`.

use async_nats::jetstream;
use chrono::Utc;
use sqlx::PgPool;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_domain::ItemCode;
use tidings_domain::messages::{PushRequest, Urgency, VERSION, encode, topic_for};
use tidings_domain::notification::render;
use tidings_domain::outbox::{self, Event, Status};
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::{SourceErrorKind, Trigger};
use tidings_domain::{Channel, OutboxId};
use tidings_runtime::telemetry;
use tidings_source::{Fetched, HttpSource, SourceError};
use tokio_util::sync::CancellationToken;

use crate::claim::{self, Claimed};
use crate::config::Settings;
use crate::recheck::{self, Decision};
use crate::transition::{self, Change};

/// PushRequests in flight at once per dispatch worker.
const PUBLISH_WINDOW: usize = 512;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DispatchStats {
    pub claimed: usize,
    pub published: usize,
    pub dropped: usize,
    pub retried: usize,
    pub failed: usize,
    /// Changes that lost their compare-and-set to a concurrent writer.
    pub lost_races: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("dispatch: {what}: {source}")]
    Db {
        what: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

fn db(what: &'static str) -> impl FnOnce(sqlx::Error) -> DispatchError {
    move |source| DispatchError::Db { what, source }
}

pub struct Dispatcher {
    pool: PgPool,
    js: jetstream::Context,
    source: Arc<HttpSource>,
    settings: Arc<Settings>,
}

impl Dispatcher {
    pub fn new(
        pool: PgPool,
        js: jetstream::Context,
        source: Arc<HttpSource>,
        settings: Arc<Settings>,
    ) -> Self {
        Dispatcher {
            pool,
            js,
            source,
            settings,
        }
    }

    /// Claims and handles one batch of due rows.
    pub async fn dispatch_once(&self) -> Result<DispatchStats, DispatchError> {
        self.dispatch_up_to(self.settings.claim_batch).await
    }

    /// Messages waiting in the push stream; `None` when NATS cannot say (dispatch goes on).
    pub async fn push_backlog(&self) -> Option<u64> {
        let stream = self
            .js
            .get_stream(self.settings.subjects.stream(StreamKind::Push))
            .await
            .ok()?;
        Some(stream.cached_info().state.messages)
    }

    /// How many rows this cycle may claim: the claim batch, less what the push stream already
    /// holds beyond `push_backlog_limit`. Rows wait in the outbox rather than in the stream,
    /// so they are re-checked right before they can actually be sent, and never sit in a queue
    /// until their push deadline passes.
    pub async fn room(&self) -> i64 {
        let limit = self.settings.push_backlog_limit;
        if limit == 0 {
            return self.settings.claim_batch;
        }
        match self.push_backlog().await {
            Some(waiting) => {
                let free = i64::try_from(limit.saturating_sub(waiting)).unwrap_or(i64::MAX);
                free.min(self.settings.claim_batch)
            }
            None => self.settings.claim_batch,
        }
    }

    /// Claims and handles up to `batch` due rows.
    pub async fn dispatch_up_to(&self, batch: i64) -> Result<DispatchStats, DispatchError> {
        let s = &self.settings;
        if batch <= 0 {
            return Ok(DispatchStats::default());
        }
        let rows = claim::claim(&self.pool, batch, s.claim_lease)
            .await
            .map_err(db("claiming due rows"))?;
        let mut stats = DispatchStats {
            claimed: rows.len(),
            ..DispatchStats::default()
        };
        if rows.is_empty() {
            return Ok(stats);
        }
        let watches = claim::watches(&self.pool, &rows)
            .await
            .map_err(db("reading watches"))?;
        let last_sent = claim::baselines(&self.pool, &rows)
            .await
            .map_err(db("reading baselines"))?;

        // One span per row, a child of its ingest span, covering pre-guards, re-fetch, re-check
        // and publish; the PushRequest carries it on.
        let spans: HashMap<OutboxId, tracing::Span> = if telemetry::exporting() {
            rows.iter()
                .map(|r| {
                    let span = tracing::info_span!(
                        "recheck",
                        outbox_id = %r.id,
                        watch_id = %r.watch_id,
                        trigger = r.trigger.as_str(),
                        channel = "web_push",
                        outcome = tracing::field::Empty,
                        reason = tracing::field::Empty,
                    );
                    telemetry::set_parent(&span, r.traceparent.as_deref());
                    (r.id, span)
                })
                .collect()
        } else {
            HashMap::new()
        };

        // Pre-guards first, so the source is asked only about rows that could still be sent.
        let mut guarded = Vec::with_capacity(rows.len());
        let mut changes = Vec::with_capacity(rows.len());
        for row in &rows {
            match recheck::pre_guard(watches.get(&row.watch_id)) {
                Ok((sub_id, sub)) => guarded.push((row, sub_id, sub)),
                Err(reason) => changes.push(self.plan(row, Event::Withheld(reason), None)),
            }
        }
        let items: Vec<ItemCode> = guarded
            .iter()
            .filter_map(|(row, _, _)| ItemCode::parse(&watches.get(&row.watch_id)?.item_code).ok())
            .collect();
        let fetched = self.source.fetch_many(&items).await;

        let now = Utc::now();
        let deadline = now + s.push_deadline;
        let lease_until = now + s.sending_lease;
        let mut requests: HashMap<OutboxId, PushRequest> = HashMap::new();
        for (row, sub_id, sub) in guarded {
            // Keys are written by ingest from a valid trigger; one this build cannot read is kept
            // for an operator (retried, then failed with the key in last_error), never guessed at.
            let Some(trigger) = row.trigger() else {
                let error = format!("unknown trigger key {:?}", row.trigger);
                changes.push(self.plan(row, Event::Transient, Some(error)));
                continue;
            };
            let item_code = watches
                .get(&row.watch_id)
                .map(|w| w.item_code.as_str())
                .unwrap_or_default();
            let item = ItemCode::parse(item_code);
            let answer: Fetched = match &item {
                Ok(code) => fetched.get(code).cloned().unwrap_or_else(|| {
                    Err(SourceError {
                        kind: SourceErrorKind::Unavailable,
                        detail: "no answer for item".into(),
                    })
                }),
                Err(e) => Err(SourceError {
                    kind: SourceErrorKind::NotFound,
                    detail: e.to_string(),
                }),
            };
            let last = last_sent.get(&(row.watch_id, row.trigger.clone()));
            let decision =
                recheck::recheck(&trigger, &row.baseline(), row.detected_at, last, &answer);
            match (decision, item) {
                (Decision::Withhold { reason, checked }, _) => {
                    let mut c = self.plan(row, Event::Withheld(reason), None);
                    c.checked = checked.and_then(|o| serde_json::to_value(o).ok());
                    changes.push(c);
                }
                (Decision::Transient { error }, _) => {
                    changes.push(self.plan(row, Event::Transient, Some(error)))
                }
                (
                    Decision::Send {
                        observation,
                        baseline,
                    },
                    Ok(code),
                ) => {
                    let payload = render(
                        &trigger,
                        &code,
                        &observation,
                        &baseline,
                        s.item_page_url.as_deref(),
                    );
                    let mut c = self.plan(row, Event::Dispatched, None);
                    c.sent_value = serde_json::to_value(&observation).ok();
                    c.payload = serde_json::to_value(&payload).ok();
                    c.subscription_id = Some(sub_id);
                    c.deadline = Some(deadline);
                    c.lease_until = Some(lease_until);
                    requests.insert(
                        row.id,
                        PushRequest {
                            v: VERSION,
                            outbox_id: row.id,
                            attempt: c.transition.attempt,
                            deadline,
                            subscription: sub.clone(),
                            payload,
                            ttl: u32::try_from(s.push_ttl.as_secs()).unwrap_or(u32::MAX),
                            urgency: urgency(&trigger),
                            topic: topic_for(row.id),
                        },
                    );
                    changes.push(c);
                }
                // An unparsable item code was classified not_found above, so it never holds.
                (Decision::Send { .. }, Err(_)) => {}
            }
        }

        let won = self.write(&changes, "writing dispatch transitions").await?;
        for c in &changes {
            if !won.contains(&c.id) {
                stats.lost_races += 1;
                continue;
            }
            match c.transition.to {
                Status::Dropped => stats.dropped += 1,
                Status::Retry => stats.retried += 1,
                Status::Failed => stats.failed += 1,
                _ => {}
            }
            if let Some(span) = spans.get(&c.id) {
                span.record("outcome", c.transition.to.as_str());
                if let Some(reason) = c.transition.reason {
                    span.record("reason", reason.as_str());
                }
            }
        }
        // Borrowed from the rows unless a recheck span stands in between.
        let traceparents: HashMap<OutboxId, Cow<'_, str>> = rows
            .iter()
            .filter_map(|r| {
                let tp = match spans.get(&r.id) {
                    Some(span) => {
                        telemetry::forward(span, r.traceparent.as_deref()).map(Cow::Owned)
                    }
                    None => r.traceparent.as_deref().map(Cow::Borrowed),
                };
                Some((r.id, tp?))
            })
            .collect();
        let to_publish: Vec<PushRequest> = requests
            .into_iter()
            .filter(|(id, _)| won.contains(id))
            .map(|(_, r)| r)
            .collect();
        let (published, failed) = self.publish(to_publish, &traceparents).await;
        stats.published = published;
        if !failed.is_empty() {
            stats.retried += self.unsend(failed, &changes).await?;
        }
        Ok(stats)
    }

    fn plan(&self, row: &Claimed, event: Event, error: Option<String>) -> Change {
        let r = row.row();
        let t = match outbox::apply(r, event, self.settings.retry.max_retries) {
            Ok(t) => t,
            // The claim selects pending and retry rows only, from which every event used here is
            // legal; keeping the row unchanged is the safe answer if that ever stops being true.
            Err(e) => {
                tracing::error!(outbox_id = %row.id, error = %e, "illegal transition planned");
                outbox::Transition {
                    to: r.status,
                    reason: None,
                    retry_count: r.retry_count,
                    attempt: r.attempt,
                    advances_baseline: false,
                    maybe_delivered: false,
                }
            }
        };
        let mut c = Change::new(row.id, r, t);
        if t.to == Status::Retry {
            c.next_attempt_at = Some(Utc::now() + self.settings.retry.delay(r.retry_count, None));
        }
        if let Some(error) = error {
            tracing::info!(outbox_id = %row.id, watch_id = %row.watch_id, to = %t.to, %error, "transient failure");
            c.last_error = Some(error);
        }
        c
    }

    /// Publishes with many acks in flight; returns how many were stored and which failed.
    async fn publish(
        &self,
        requests: Vec<PushRequest>,
        traceparents: &HashMap<OutboxId, Cow<'_, str>>,
    ) -> (usize, Vec<(OutboxId, String)>) {
        let subject = self
            .settings
            .subjects
            .subject(StreamKind::Push, Channel::WebPush);
        let outgoing = requests
            .iter()
            .map(|r| {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", r.msg_id().as_str());
                if let Some(tp) = traceparents.get(&r.outbox_id) {
                    headers.insert("traceparent", tp.as_ref());
                }
                Outgoing {
                    subject: subject.clone(),
                    headers,
                    payload: encode(r),
                }
            })
            .collect();
        let acks = publish_all(&self.js, outgoing, PUBLISH_WINDOW).await;
        let mut published = 0;
        let mut failed = Vec::new();
        for (r, ack) in requests.iter().zip(acks) {
            match ack {
                Ok(_) => published += 1,
                Err(e) => failed.push((r.outbox_id, e)),
            }
        }
        (published, failed)
    }

    /// Rows marked `sending` whose PushRequest could not be published go back to `retry` now
    /// rather than waiting for the lease to run out.
    async fn unsend(
        &self,
        failed: Vec<(OutboxId, String)>,
        written: &[Change],
    ) -> Result<usize, DispatchError> {
        let mut changes = Vec::with_capacity(failed.len());
        for (id, error) in failed {
            // The `sending` change just written holds the row's counters: no need to re-read it.
            let Some(sent) = written.iter().find(|c| c.id == id) else {
                continue;
            };
            tracing::warn!(outbox_id = %id, attempt = sent.transition.attempt, %error, "publishing PushRequest failed");
            let row = outbox::Row {
                status: Status::Sending,
                retry_count: sent.transition.retry_count,
                attempt: sent.transition.attempt,
            };
            if let Ok(t) = outbox::apply(row, Event::Transient, self.settings.retry.max_retries) {
                let mut c = Change::new(id, row, t);
                c.next_attempt_at =
                    Some(Utc::now() + self.settings.retry.delay(row.retry_count, None));
                c.last_error = Some(format!("publishing PushRequest: {error}"));
                changes.push(c);
            }
        }
        let won = self
            .write(&changes, "returning unpublished rows to retry")
            .await?;
        Ok(won.len())
    }

    async fn write(
        &self,
        changes: &[Change],
        what: &'static str,
    ) -> Result<HashSet<OutboxId>, DispatchError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(db("acquiring a connection"))?;
        let won = transition::apply(&mut conn, changes)
            .await
            .map_err(db(what))?;
        transition::record(changes, &won);
        Ok(won)
    }

    /// Dispatches until `shutdown`: straight on while batches come back full, otherwise after
    /// the poll interval, so a new or newly due row is picked up within that interval.
    pub async fn run(&self, shutdown: CancellationToken) {
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let room = self.room().await;
            let full = match self.dispatch_up_to(room).await {
                Ok(stats) => room > 0 && stats.claimed as i64 >= room,
                Err(e) => {
                    tracing::error!(error = %e, "dispatch batch failed");
                    false
                }
            };
            if !full {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(self.settings.poll_interval) => {}
                }
            }
        }
    }
}

fn urgency(trigger: &Trigger) -> Urgency {
    match trigger {
        // Stock comes and goes fast; a price alert can wait for a device's next wake-up.
        Trigger::BackInStock => Urgency::High,
        Trigger::PriceBelow { .. } | Trigger::PriceDrop { .. } => Urgency::Normal,
    }
}
