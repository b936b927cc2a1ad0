//! Dispatch: claim due rows → pre-guards → re-fetch (batched by item) → re-check → `sending` →
//! publish PushRequest. What to do with each row is decided by [`crate::plan`] (no I/O); this
//! module reads, fetches, writes and publishes around it.
//!
//! The order matters. A row is marked `sending` (with its attempt, deadline and lease) before its
//! PushRequest is published, so a crash between the two leaves a `sending` row that the lease
//! sweeper retries; publishing first could deliver a notification whose row still looks unsent.
//! A publish JetStream does not confirm leaves the row `sending` too: the request may have been
//! stored all the same, so its result, the delivery log or the sweeper decides.

use async_nats::jetstream;
use chrono::Utc;
use sqlx::{PgPool, Postgres, Transaction};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_domain::messages::{Batch, MAX_DIGEST_MEMBERS, encode};
use tidings_domain::outbox::Status;
use tidings_domain::subjects::StreamKind;
use tidings_domain::{Channel, ItemCode, OutboxId, WatchId};
use tidings_runtime::liveness::Progress;
use tidings_runtime::metrics::{HeldLabels, KeyLabels, ReleaseLabels};
use tidings_runtime::telemetry;
use tidings_source::{Fetched, Sources};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::admission::Admission;
use crate::config::Settings;
use crate::digest;
use crate::holding;
use crate::metrics::metrics;
use crate::plan::{self, Request};
use tidings_store::claim::{self, Claimed, Wait, WatchState};
use tidings_store::transition::{self, Change};
use tidings_store::{DbError, db};

/// PushRequests in flight at once per dispatch worker.
const PUBLISH_WINDOW: usize = 512;

/// Readers whose due digests one round claims.
const DIGEST_READERS: i64 = 50;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DispatchStats {
    pub claimed: usize,
    pub published: usize,
    pub dropped: usize,
    pub retried: usize,
    pub failed: usize,
    /// Changes that lost their compare-and-set to a concurrent writer.
    pub lost_races: usize,
    /// Rows left `sending` whose PushRequest JetStream did not confirm.
    pub unconfirmed: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("dispatch: {0}")]
    Db(#[from] DbError),
}

pub struct Dispatcher {
    pool: PgPool,
    js: jetstream::Context,
    source: Arc<Sources>,
    settings: Arc<Settings>,
    admission: Option<Arc<Admission>>,
    /// Rung by this process's ingest when it commits new rows.
    wake: Option<Arc<Notify>>,
    /// The push stream's last reading ([`Dispatcher::room`]), shared with the other dispatch
    /// workers of this process.
    reading: Arc<PushReadings>,
}

/// The push stream's last reading, shared by the dispatch workers of a process: each counts
/// the others' publishes into it, and together they ask NATS as often as one.
#[derive(Debug, Default)]
pub struct PushReadings(Mutex<Option<PushReading>>);

/// Messages in the push stream as NATS last said, plus those published since by the dispatch
/// workers sharing it: pushers only take messages away, so this many wait at most (but for
/// other processes' since).
#[derive(Debug, Clone, Copy)]
struct PushReading {
    at: Instant,
    messages: u64,
}

impl Dispatcher {
    pub fn new(
        pool: PgPool,
        js: jetstream::Context,
        source: Arc<Sources>,
        settings: Arc<Settings>,
    ) -> Self {
        Dispatcher {
            pool,
            js,
            source,
            settings,
            admission: None,
            wake: None,
            reading: Arc::default(),
        }
    }

    /// Keeps the push stream's readings in `readings`, shared with other dispatch workers.
    pub fn with_push_readings(mut self, readings: Arc<PushReadings>) -> Self {
        self.reading = readings;
        self
    }

    /// Looks for due rows as soon as `wake` rings, not only every poll interval: the ingest
    /// beside this loop rings it when it commits new rows, which would otherwise wait half a
    /// poll interval on average for their claim.
    pub fn with_wake(mut self, wake: Arc<Notify>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Tells `admission` after each claim how long its oldest row had been due.
    pub fn with_admission(mut self, admission: Arc<Admission>) -> Self {
        self.admission = Some(admission);
        self
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
    /// until their push deadline passes. NATS is asked again unless a reading younger than
    /// `push_reading_fresh` leaves room for a whole claim, counting what was published since.
    /// No room while the connection to NATS is down.
    pub async fn room(&self) -> i64 {
        // While this client is away from NATS, a claim's rows would be published into the
        // outage and left `sending`, unconfirmed, for the lease to decide: they wait instead.
        if self.js.client().connection_state() != async_nats::connection::State::Connected {
            return 0;
        }
        if self.settings.push_backlog_limit == 0 {
            return self.settings.claim_batch;
        }
        let fresh = self.settings.push_reading_fresh;
        if let Some(reading) = self.last_reading().filter(|r| r.at.elapsed() < fresh) {
            let room = self.room_beside(reading.messages);
            if room >= self.settings.claim_batch {
                return room;
            }
        }
        match self.push_backlog().await {
            Some(messages) => {
                self.set_reading(Some(PushReading {
                    at: Instant::now(),
                    messages,
                }));
                self.room_beside(messages)
            }
            None => {
                self.set_reading(None);
                self.settings.claim_batch
            }
        }
    }

    /// The room a claim has while the push stream holds `messages`.
    fn room_beside(&self, messages: u64) -> i64 {
        // Requests, counting every message as a full batch: with batches, dispatch pauses no
        // later than with one request a message.
        let waiting = messages.saturating_mul(self.settings.push_batch.max(1) as u64);
        let free = self.settings.push_backlog_limit.saturating_sub(waiting);
        // Room past `i64` is no limit on a claim.
        i64::try_from(free)
            .unwrap_or(i64::MAX)
            .min(self.settings.claim_batch)
    }

    fn last_reading(&self) -> Option<PushReading> {
        self.reading.0.lock().ok().and_then(|r| *r)
    }

    fn set_reading(&self, reading: Option<PushReading>) {
        if let Ok(mut slot) = self.reading.0.lock() {
            *slot = reading;
        }
    }

    /// Counts `messages` just published to the push stream into the last reading.
    fn published(&self, messages: u64) {
        if let Ok(mut slot) = self.reading.0.lock()
            && let Some(reading) = slot.as_mut()
        {
            reading.messages = reading.messages.saturating_add(messages);
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
        if let Some(admission) = &self.admission {
            let now = Utc::now();
            let oldest = rows.iter().map(|r| r.next_attempt_at).min();
            admission.observe(oldest.map(|at| (now - at).to_std().unwrap_or_default()));
        }
        self.handle(rows, false).await
    }

    /// Claims the due digests of up to [`DIGEST_READERS`] readers and sends each reader's as one
    /// message ([`digest`]).
    pub async fn digest_once(&self) -> Result<DispatchStats, DispatchError> {
        let members = i64::try_from(MAX_DIGEST_MEMBERS).unwrap_or(i64::MAX);
        let rows = claim::claim_digests(
            &self.pool,
            DIGEST_READERS,
            members,
            self.settings.claim_lease,
        )
        .await
        .map_err(db("claiming due digests"))?;
        self.handle(rows, true).await
    }

    /// Re-checks and sends claimed rows: each alone, unless their reader makes them wait
    /// ([`holding`]), or (`digests`) each reader's together as one digest.
    async fn handle(
        &self,
        rows: Vec<Claimed>,
        digests: bool,
    ) -> Result<DispatchStats, DispatchError> {
        let s = &self.settings;
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
        let spans = self.recheck_spans(&rows);

        let plan::Guards {
            guarded,
            withheld: mut changes,
            ..
        } = self.gate(&rows, &watches).await?;
        let fetched = self.refetch(&guarded, &watches, &spans).await;
        let mut decided = plan::decide(&guarded, &watches, &last_sent, &fetched, s, Utc::now());
        let recalls = claim::recalls(&self.pool, &rows)
            .await
            .map_err(db("reading what withdrawals recall"))?;
        plan::recall(&mut decided, &rows, &recalls);
        let (waits, caps) = if digests {
            let sizes = digest::fold(&mut decided, &guarded, &watches, s, Utc::now());
            for n in sizes {
                metrics().digest_members.observe(n as f64);
            }
            (Vec::new(), None)
        } else {
            self.wait_for_readers(&mut decided, &rows, &watches).await?
        };
        for key in decided.unsigned.drain(..) {
            (metrics().secrets_unopened)
                .get_or_create(&KeyLabels { key })
                .inc();
        }
        changes.extend(decided.changes);
        count_held(&decided.requests, &changes, &rows, &waits);

        let written = self
            .write(&changes, caps, "writing dispatch transitions")
            .await;
        let won = match written {
            Ok(won) => won,
            Err(e) => {
                telemetry::fail_all(spans.values(), &e.to_string());
                return Err(e);
            }
        };
        count_written(&changes, &won, &spans, &mut stats);
        let to_publish: Vec<Request> = decided
            .requests
            .into_iter()
            .filter(|(id, _)| won.contains(id))
            .map(|(_, r)| r)
            .collect();
        let (published, failed) = self.publish(to_publish, &traceparents(&rows, &spans)).await;
        stats.published = published;
        stats.unconfirmed = failed.len();
        unconfirmed(failed, &spans);
        Ok(stats)
    }

    /// The pre-guards and the webhook endpoints' gates ([`plan::guard`]), with what they hold
    /// written: held rows, probes (of two workers that found an endpoint half-open, one
    /// probes and the other holds its row too) and paced endpoints' next slots.
    async fn gate<'r>(
        &self,
        rows: &'r [Claimed],
        watches: &'r HashMap<WatchId, WatchState>,
    ) -> Result<plan::Guards<'r>, DispatchError> {
        let mut guards = plan::guard(rows, watches, &self.settings, Utc::now());
        let won = claim::probing(&self.pool, &guards.probes)
            .await
            .map_err(db("marking webhook endpoints probed"))?;
        plan::probes_lost(&mut guards, &won);
        claim::hold(&self.pool, &guards.held).await.map_err(db(
            "holding back rows of failing or paced webhook endpoints",
        ))?;
        claim::pacing(&self.pool, &guards.paced)
            .await
            .map_err(db("taking paced webhook endpoints' next slots"))?;
        Ok(guards)
    }

    /// Takes the rows that must wait for their readers (quiet hours, caps) out of `plan` and
    /// makes them wait, due at their release ([`holding`]). The caps counted stay locked by the
    /// transaction returned, in which what this batch sends is written ([`claim::lock_caps`]).
    async fn wait_for_readers(
        &self,
        plan: &mut plan::Plan,
        rows: &[Claimed],
        watches: &HashMap<WatchId, WatchState>,
    ) -> Result<(Vec<Wait>, Option<Transaction<'static, Postgres>>), DispatchError> {
        let (capped, window) = holding::capped(plan, rows, watches);
        let mut caps = None;
        let mut sent = HashMap::new();
        if !capped.is_empty() {
            let what = "reading capped devices' recent notifications";
            let mut tx = self.pool.begin().await.map_err(db(what))?;
            claim::lock_caps(&mut tx, &capped).await.map_err(db(what))?;
            sent = claim::sent_since(&mut tx, &capped, Utc::now() - window)
                .await
                .map_err(db(what))?;
            caps = Some(tx);
        }
        let waits = holding::wait(plan, rows, watches, sent, Utc::now());
        let what = "making held rows wait for their readers";
        match caps.as_mut() {
            Some(tx) => claim::wait(tx, &waits).await.map_err(db(what))?,
            None if waits.is_empty() => {}
            None => {
                let mut conn = self.pool.acquire().await.map_err(db(what))?;
                claim::wait(&mut conn, &waits).await.map_err(db(what))?;
            }
        }
        Ok((waits, caps))
    }

    /// One span per row while traces are exported, a child of its ingest span, covering
    /// pre-guards, re-fetch, re-check and publish; the PushRequest carries it on.
    fn recheck_spans(&self, rows: &[Claimed]) -> HashMap<OutboxId, tracing::Span> {
        if !telemetry::exporting() {
            return HashMap::new();
        }
        let subjects = &self.settings.subjects;
        rows.iter()
            .map(|r| {
                let push_subject = subjects.subject(StreamKind::Push, r.channel);
                let span = tracing::info_span!(
                    "recheck",
                    otel.kind = "producer",
                    messaging.system = "nats",
                    messaging.operation.type = "publish",
                    messaging.destination.name = push_subject.as_str(),
                    outbox_id = %r.id,
                    watch_id = %r.watch_id,
                    trigger = r.trigger.key.as_str(),
                    channel = r.channel.as_str(),
                    outcome = tracing::field::Empty,
                    reason = tracing::field::Empty,
                );
                telemetry::set_parent(&span, r.traceparent.as_deref());
                (r.id, span)
            })
            .collect()
    }

    /// Re-fetches the guarded rows' items, batched. A row's re-fetch is a CLIENT span under its
    /// re-check: the catalog's answer (or the error) for this notification's item, timed by the
    /// request that carried it.
    async fn refetch(
        &self,
        guarded: &[plan::Guarded<'_>],
        watches: &HashMap<WatchId, WatchState>,
        spans: &HashMap<OutboxId, tracing::Span>,
    ) -> HashMap<ItemCode, Fetched> {
        let items = plan::items(guarded, watches);
        let fetch_spans: Vec<(tracing::Span, ItemCode)> = guarded
            .iter()
            .filter(|_| !spans.is_empty())
            .filter_map(|g| {
                let parent = spans.get(&g.row.id)?;
                let item = plan::item_of(g, watches)?;
                let span = tracing::info_span!(
                    parent: parent,
                    "fetch",
                    otel.kind = "client",
                    server.address = self.source.host(&item),
                    item = item.as_str(),
                    outcome = tracing::field::Empty,
                );
                Some((span, item))
            })
            .collect();
        let fetched = self.source.fetch_many(&items).await;
        for (span, item) in fetch_spans {
            match fetched.get(&item) {
                Some(Ok(_)) => {
                    span.record("outcome", "ok");
                }
                Some(Err(e)) => {
                    span.record("outcome", e.kind.as_str());
                    telemetry::fail(&span, &e.to_string());
                }
                None => {}
            }
        }
        fetched
    }

    /// Publishes with many acks in flight, each channel's requests to its own subject; returns
    /// how many requests were stored and which failed. With `push_batch` above 1 the requests go
    /// `push_batch` to a message (`PushRequests`), each carrying its trace context; a message not
    /// confirmed fails all its requests.
    async fn publish(
        &self,
        requests: Vec<Request>,
        traceparents: &HashMap<OutboxId, Cow<'_, str>>,
    ) -> (usize, Vec<(OutboxId, String)>) {
        let batch = self.settings.push_batch.max(1);
        let mut outgoing = Vec::new();
        // The rows of each message, in publish order.
        let mut carried: Vec<Vec<OutboxId>> = Vec::new();
        let message = |subject: &str, msg_id: &str, traceparent: Option<&str>, payload| {
            let mut message = Outgoing::deduplicated(subject, msg_id, payload);
            if let Some(tp) = traceparent {
                message.headers.insert("traceparent", tp);
            }
            message
        };
        let mut by_channel: Vec<(Channel, Vec<Request>)> =
            Channel::ALL.map(|c| (c, Vec::new())).into();
        for r in requests {
            let channel = r.target.channel();
            if let Some((_, of)) = by_channel.iter_mut().find(|(c, _)| *c == channel) {
                of.push(r);
            }
        }
        for (channel, mut requests) in by_channel {
            let subject = self.settings.subjects.subject(StreamKind::Push, channel);
            if batch == 1 {
                for r in &requests {
                    let tp = traceparents.get(&r.outbox_id).map(|tp| tp.as_ref());
                    outgoing.push(message(&subject, &r.msg_id(), tp, encode(r)));
                    carried.push(vec![r.outbox_id]);
                }
                continue;
            }
            for r in &mut requests {
                r.traceparent = traceparents.get(&r.outbox_id).map(|tp| tp.to_string());
            }
            let mut rest = requests.into_iter().peekable();
            while rest.peek().is_some() {
                let m: Batch<Request> = Batch::new(rest.by_ref().take(batch).collect());
                outgoing.push(message(&subject, &m.msg_id(), None, encode(&m)));
                carried.push(m.requests.iter().map(|r| r.outbox_id).collect());
            }
        }
        let acks = publish_all(&self.js, outgoing, PUBLISH_WINDOW).await;
        // Unconfirmed messages may be stored all the same: all are counted.
        self.published(carried.len() as u64);
        let mut published = 0;
        let mut failed = Vec::new();
        for (rows, ack) in carried.iter().zip(acks) {
            match ack {
                Ok(_) => published += rows.len(),
                Err(e) => {
                    let error = telemetry::with_causes(&e);
                    failed.extend(rows.iter().map(|id| (*id, error.clone())));
                }
            }
        }
        (published, failed)
    }

    async fn write(
        &self,
        changes: &[Change],
        caps: Option<Transaction<'static, Postgres>>,
        what: &'static str,
    ) -> Result<HashSet<OutboxId>, DispatchError> {
        let won = match caps {
            // In the transaction that holds the caps' locks: what it sends is counted by the
            // next decision for these devices, here or in another dispatcher.
            Some(mut tx) => {
                let won = transition::apply(&mut tx, changes)
                    .await
                    .map_err(db(what))?;
                tx.commit().await.map_err(db(what))?;
                won
            }
            None => {
                let mut conn = (self.pool.acquire().await).map_err(db("acquiring a connection"))?;
                transition::apply(&mut conn, changes)
                    .await
                    .map_err(db(what))?
            }
        };
        transition::observe(changes, &won);
        Ok(won)
    }

    /// Sends due digests until `shutdown`: straight on while rounds find some, otherwise after
    /// [`digest_pause`]. One loop per dispatcher: digests are few, and a reader's are claimed
    /// whole by one dispatcher at a time.
    pub async fn run_digests(&self, shutdown: CancellationToken) {
        let round = || async { Ok(self.digest_once().await?.claimed > 0) };
        let pause = digest_pause(self.settings.poll_interval);
        self.repeat(
            &shutdown,
            "digests",
            "sending due digests failed",
            pause,
            None,
            round,
        )
        .await;
    }

    /// Dispatches until `shutdown`: straight on while batches come back full, otherwise after
    /// the poll interval or when the wake rings, so a newly due row is picked up within that
    /// interval and a newly ingested one at once. While the push stream is full it looks again
    /// every [`BACKLOG_PAUSE`].
    pub async fn run(&self, shutdown: CancellationToken) {
        let round = || async {
            let room = self.room().await;
            if room <= 0 {
                // The stream drains without ringing the wake, and while dispatch is behind
                // admission stops the ingest that would: a pusher must not wait a poll.
                tokio::time::sleep(BACKLOG_PAUSE).await;
                return Ok(true);
            }
            let stats = self.dispatch_up_to(room).await?;
            Ok(stats.claimed as i64 >= room)
        };
        let pause = self.settings.poll_interval;
        let wake = self.wake.as_deref();
        self.repeat(
            &shutdown,
            "dispatch",
            "dispatch batch failed",
            pause,
            wake,
            round,
        )
        .await;
    }

    /// Runs `round` until `shutdown` as liveness loop `name`: again at once while it says it was
    /// full, otherwise after `pause` or when `wake` rings. A failed round is counted and logged
    /// as `failed`.
    async fn repeat<F: Future<Output = Result<bool, DispatchError>>>(
        &self,
        shutdown: &CancellationToken,
        name: &'static str,
        failed: &'static str,
        pause: Duration,
        wake: Option<&Notify>,
        mut round: impl FnMut() -> F,
    ) {
        let progress = Progress::register(name);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            progress.idle_for(pause);
            let full = match round().await {
                Ok(full) => full,
                Err(e) => {
                    tidings_runtime::metrics::metrics()
                        .failed(tidings_runtime::metrics::Failure::Dispatch);
                    tracing::error!(error = %e, "{failed}");
                    false
                }
            };
            if !full {
                let rung = async {
                    match wake {
                        Some(wake) => wake.notified().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                    _ = rung => {}
                }
            }
        }
    }
}

/// How often a dispatch loop held back by a full push stream looks again: well under the time
/// the pushers take to drain `TIDINGS_PUSH_BACKLOG_LIMIT` (2,000 requests: 0.4 s at 5,000/s).
pub const BACKLOG_PAUSE: Duration = Duration::from_millis(50);

/// How long an idle digest loop waits before it looks again: the poll interval, but at least
/// [`DIGEST_POLL`].
pub fn digest_pause(poll_interval: Duration) -> Duration {
    poll_interval.max(DIGEST_POLL)
}

/// A digest is due at a minute of its reader's clock, so a second late is not seen. Looking every
/// poll interval (20–50 ms) cost Postgres a walk of every due row each time (digest rows have no
/// index of their own): in `bench pipeline 6000 30 only-load` more statement time than the
/// claims, 25.5 s in a run that sent 180,000.
pub const DIGEST_POLL: Duration = Duration::from_secs(1);

/// Counts the changes that were written (`won`) by where they took their rows, and records each
/// on its row's span.
fn count_written(
    changes: &[Change],
    won: &HashSet<OutboxId>,
    spans: &HashMap<OutboxId, tracing::Span>,
    stats: &mut DispatchStats,
) {
    for c in changes {
        if !won.contains(&c.id) {
            stats.lost_races += 1;
            continue;
        }
        match c.transition.to {
            Status::Dropped => stats.dropped += 1,
            Status::Retry => stats.retried += 1,
            Status::Failed => stats.failed += 1,
            // `sending` is counted where its request is published; a dispatch never moves a
            // row to `pending` or `sent`. Named, so a new state must say where it counts.
            Status::Sending | Status::Pending | Status::Sent => {}
        }
        if let Some(span) = spans.get(&c.id) {
            span.record("outcome", c.transition.to.as_str());
            if let Some(reason) = c.transition.reason {
                span.record("reason", reason.as_str());
            }
        }
    }
}

/// Counts the rows made to wait, and what became of held rows at their release.
fn count_held(
    requests: &HashMap<OutboxId, Request>,
    changes: &[Change],
    rows: &[Claimed],
    waits: &[Wait],
) {
    let m = metrics();
    for w in waits {
        (m.held)
            .get_or_create(&HeldLabels {
                held: w.held.as_str().to_owned(),
            })
            .inc();
    }
    for (held, outcome) in holding::released(requests, changes, rows, waits) {
        (m.released)
            .get_or_create(&ReleaseLabels {
                held: held.as_str().to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

/// The trace context each row's PushRequest carries: borrowed from the row unless a recheck
/// span stands in between.
fn traceparents<'a>(
    rows: &'a [Claimed],
    spans: &HashMap<OutboxId, tracing::Span>,
) -> HashMap<OutboxId, Cow<'a, str>> {
    rows.iter()
        .filter_map(|r| {
            let tp = match spans.get(&r.id) {
                Some(span) => telemetry::forward(span, r.traceparent.as_deref()).map(Cow::Owned),
                None => r.traceparent.as_deref().map(Cow::Borrowed),
            };
            Some((r.id, tp?))
        })
        .collect()
}

/// Reports the PushRequests JetStream did not confirm. A publish without its ack is not a
/// publish that failed: the request may be stored (the ack was lost when the broker died) or
/// sent on reconnect (the client buffers), and then pushed. Taking the row back now would
/// re-check and maybe withhold or resend a notification that arrives all the same. So it stays
/// `sending`: its result, the delivery log or, failing both, the lease sweeper decides.
fn unconfirmed(failed: Vec<(OutboxId, String)>, spans: &HashMap<OutboxId, tracing::Span>) {
    for (id, error) in failed {
        tidings_runtime::metrics::metrics().failed(tidings_runtime::metrics::Failure::PublishPush);
        let span = spans.get(&id).cloned().unwrap_or_else(tracing::Span::none);
        telemetry::fail(&span, &format!("PushRequest not confirmed: {error}"));
        tracing::warn!(parent: &span, outbox_id = %id, %error, "PushRequest not confirmed by JetStream; the row waits for its result or its lease");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_digest_loop_looks_at_most_once_a_second_and_never_more_often_than_dispatch() {
        for ms in [1, 20, 50, 999] {
            assert_eq!(digest_pause(Duration::from_millis(ms)), DIGEST_POLL);
        }
        let slow = Duration::from_secs(3);
        assert_eq!(digest_pause(slow), slow);
    }
}
