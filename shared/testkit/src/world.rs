//! A test world with no service in it: a fresh database, a fresh subject prefix with its
//! streams, a fake catalog, and helpers to play the services' parts around the one under test —
//! publish what a detector would, read what a pusher would get, answer as a pusher would, read
//! the outbox as the store does. The dispatcher's tests build their `Scenario` on it.

use async_nats::jetstream::{self, consumer::PullConsumer, consumer::pull};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use std::time::Duration;
use tidings_bus::publish::Outgoing;
use tidings_bus::streams::{StreamSettings, ensure_streams};
use tidings_domain::messages::{
    Ended, EnqueueRequest, PushRequest, PushResult, PushResults, Subscription, decode_enqueues,
    decode_requests, encode,
};
use tidings_domain::subjects::{StreamKind, Subjects};
use tidings_domain::trigger::Trigger;
use tidings_domain::{Channel, OutboxId, WatchId};
use tidings_store::history;

use crate::fake_catalog::FakeCatalog;
use crate::fixtures::{self, Device};
use crate::harness::{self, TestDb, delete_streams};

pub struct World {
    pub db: TestDb,
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub streams: StreamSettings,
    pub catalog: FakeCatalog,
}

/// A device with an active subscription and a watch.
pub struct Watcher {
    pub device: Device,
    pub watch: WatchId,
    pub item: String,
    pub trigger: Trigger,
}

impl Watcher {
    /// Detection number `i` of this watcher (see [`Watcher::numbered_request`]).
    pub fn numbered_detection(&self, i: usize, at: DateTime<Utc>) -> EnqueueRequest {
        let mut r =
            fixtures::enqueue_request(&self.device, self.watch, self.trigger.clone(), 1100, at);
        r.trigger = Trigger::PriceBelow {
            threshold: 1200 + i64::try_from(i).unwrap_or(i64::MAX - 1200),
        };
        r
    }

    /// Detection number `i` of this watcher as the detector publishes it (with its
    /// `Nats-Msg-Id`), each with its own trigger threshold (1200 + i) and so its own dedup key:
    /// for tests and benchmarks that need many distinct requests from few watches.
    pub fn numbered_request(&self, subject: &str, i: usize, at: DateTime<Utc>) -> Outgoing {
        let r = self.numbered_detection(i, at);
        Outgoing::deduplicated(subject, &r.dedup_key().to_string(), encode(&r))
    }
}

/// An outbox row as tests look at it: the store's own reading, typed (its notification, and
/// its delivery record).
pub type OutboxRow = tidings_store::history::Delivery;

impl World {
    /// A fresh database, subject prefix (with its streams) and catalog.
    pub async fn new() -> Self {
        let db = TestDb::new().await.expect("test database");
        let js = jetstream::new(harness::nats().await.expect("NATS"));
        let subjects = harness::test_subjects();
        let streams = harness::stream_settings();
        ensure_streams(&js, &subjects, &streams)
            .await
            .expect("streams");
        let catalog = FakeCatalog::start().await.expect("fake catalog");
        World {
            db,
            js,
            subjects,
            streams,
            catalog,
        }
    }

    /// A device with a subscription, watching `item` with `trigger`; the catalog serves `price`.
    pub async fn watcher(&self, item: &str, trigger: Trigger, price: i64) -> Watcher {
        let sub = Subscription {
            endpoint: "https://push.example/sub/1".into(),
            p256dh: "p256dh".into(),
            auth: "auth".into(),
        };
        self.watcher_at(item, trigger, price, &sub).await
    }

    /// [`World::watcher`] whose device pushes to `sub` (a fake push service's, say).
    pub async fn watcher_at(
        &self,
        item: &str,
        trigger: Trigger,
        price: i64,
        sub: &Subscription,
    ) -> Watcher {
        let pool = &self.db.pool;
        let device = fixtures::device(pool, "UTC").await.expect("device");
        fixtures::subscription(pool, device.id, sub)
            .await
            .expect("subscription");
        let watch = fixtures::watch(
            pool,
            device.id,
            item,
            std::slice::from_ref(&trigger),
            Some(price),
        )
        .await
        .expect("watch");
        self.catalog.set_price(item, price);
        Watcher {
            device,
            watch,
            item: item.to_owned(),
            trigger,
        }
    }

    /// The EnqueueRequest a detector would publish for `w` seeing `price` at `at`.
    pub fn detection(&self, w: &Watcher, price: i64, at: DateTime<Utc>) -> EnqueueRequest {
        fixtures::enqueue_request(&w.device, w.watch, w.trigger.clone(), price, at)
    }

    /// Publishes as the detector does; returns whether JetStream called it a duplicate.
    pub async fn publish_enqueue(&self, req: &EnqueueRequest, msg_id: &str) -> bool {
        self.publish_enqueue_traced(req, msg_id, None).await
    }

    /// [`World::publish_enqueue`] within the trace `traceparent` names, as a detector's span
    /// would send it.
    pub async fn publish_enqueue_traced(
        &self,
        req: &EnqueueRequest,
        msg_id: &str,
        traceparent: Option<&str>,
    ) -> bool {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id);
        if let Some(tp) = traceparent {
            headers.insert("traceparent", tp);
        }
        self.js
            .publish_with_headers(
                self.subjects.subject(StreamKind::Enqueue, req.channel),
                headers,
                encode(req).into(),
            )
            .await
            .expect("publish")
            .await
            .expect("publish ack")
            .duplicate
    }

    /// Publishes raw bytes on the enqueue subject (for malformed-message tests).
    pub async fn publish_raw_enqueue(&self, payload: Vec<u8>) {
        self.js
            .publish(
                self.subjects.subject(StreamKind::Enqueue, Channel::WebPush),
                payload.into(),
            )
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }

    /// The consumer a test uses in place of the pusher.
    pub async fn push_consumer(&self) -> PullConsumer {
        let stream = self
            .js
            .get_stream(self.subjects.stream(StreamKind::Push))
            .await
            .expect("push stream");
        stream
            .get_or_create_consumer(
                "test-pusher",
                pull::Config {
                    durable_name: Some("test-pusher".into()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ..Default::default()
                },
            )
            .await
            .expect("push consumer")
    }

    /// Every PushRequest available now (acked), waiting up to `wait` for the first.
    pub async fn take_pushes(&self, consumer: &PullConsumer, wait: Duration) -> Vec<PushRequest> {
        self.take_push_messages(consumer, wait)
            .await
            .into_iter()
            .flat_map(|(_, requests)| requests)
            .collect()
    }

    /// Every push-stream message available now (acked), waiting up to `wait` for the first: its
    /// `Nats-Msg-Id` and the requests it carries (one, or a batch).
    pub async fn take_push_messages(
        &self,
        consumer: &PullConsumer,
        wait: Duration,
    ) -> Vec<(String, Vec<PushRequest>)> {
        take(consumer, wait)
            .await
            .into_iter()
            .map(|(id, payload)| {
                let requests = decode_requests(&payload).expect("decodable PushRequest(s)");
                (id, requests)
            })
            .collect()
    }

    /// The enqueue stream's durable consumer as the dispatcher's ingest makes it (by its name),
    /// for a test that plays ingest's part.
    pub async fn ingest_consumer(&self) -> PullConsumer {
        let name = tidings_bus::streams::consumer_of(StreamKind::Enqueue);
        let stream = self
            .js
            .get_stream(self.subjects.stream(StreamKind::Enqueue))
            .await
            .expect("enqueue stream");
        stream
            .get_or_create_consumer(
                name,
                pull::Config {
                    durable_name: Some(name.into()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ..Default::default()
                },
            )
            .await
            .expect("ingest consumer")
    }

    /// Every EnqueueRequest available now, acked as ingest acks what it stored, waiting up to
    /// `wait` for the first.
    pub async fn take_enqueues(
        &self,
        consumer: &PullConsumer,
        wait: Duration,
    ) -> Vec<EnqueueRequest> {
        take(consumer, wait)
            .await
            .into_iter()
            .flat_map(|(_, payload)| {
                decode_enqueues(&payload).expect("decodable EnqueueRequest(s)")
            })
            .collect()
    }

    /// The durable consumer `name` on a stream of this world, if it exists yet.
    pub async fn consumer(&self, kind: StreamKind, name: &str) -> Option<PullConsumer> {
        let stream = self.js.get_stream(self.subjects.stream(kind)).await.ok()?;
        stream.get_consumer::<pull::Config>(name).await.ok()
    }

    /// Messages of a stream that its durable consumer `name` has not acknowledged yet (waiting or
    /// in flight); 0 when the consumer does not exist yet.
    pub async fn unacked(&self, kind: StreamKind, name: &str) -> u64 {
        let Some(consumer) = self.consumer(kind, name).await else {
            return 0;
        };
        let info = consumer.cached_info();
        info.num_pending + info.num_ack_pending as u64
    }

    /// Number of messages stored in a stream of this world.
    pub async fn stream_len(&self, kind: StreamKind) -> u64 {
        harness::stream_len(&self.js, &self.subjects, kind).await
    }

    /// The messages stored in a stream of this world, oldest first.
    async fn stored(&self, kind: StreamKind) -> Vec<jetstream::message::StreamMessage> {
        let mut stream = self
            .js
            .get_stream(self.subjects.stream(kind))
            .await
            .expect("stream");
        let state = stream.info().await.expect("stream info").state.clone();
        let mut out = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            if let Ok(m) = stream.get_raw_message(seq).await {
                out.push(m);
            }
        }
        out
    }

    /// PushRequests stored in this world's push stream, counting each request of a batch.
    pub async fn push_requests_stored(&self) -> usize {
        self.stored(StreamKind::Push)
            .await
            .iter()
            .map(|m| {
                decode_requests(&m.payload)
                    .expect("decodable PushRequest(s)")
                    .len()
            })
            .sum()
    }

    /// The EnqueueRequests stored in this world's enqueue stream, oldest first, each request
    /// of a batch on its own.
    pub async fn enqueued(&self) -> Vec<EnqueueRequest> {
        self.stored(StreamKind::Enqueue)
            .await
            .iter()
            .flat_map(|m| decode_enqueues(&m.payload).expect("decodable EnqueueRequest(s)"))
            .collect()
    }

    /// A PushResult as the pusher reports it.
    pub fn result(
        &self,
        push: &PushRequest,
        ended: impl Into<Ended>,
        http_status: Option<u16>,
    ) -> PushResult {
        PushResult {
            http_status,
            latency_ms: 5,
            ..PushResult::new(push.outbox_id, push.attempt, ended)
        }
    }

    pub async fn publish_result(&self, result: &PushResult) {
        self.publish_result_body(encode(result)).await;
    }

    /// Several results in one message, as the pusher reports them.
    pub async fn publish_results(&self, results: &[PushResult]) {
        self.publish_result_body(encode(&PushResults::new(results.to_vec())))
            .await;
    }

    async fn publish_result_body(&self, body: Vec<u8>) {
        self.js
            .publish(
                self.subjects.subject(StreamKind::Result, Channel::WebPush),
                body.into(),
            )
            .await
            .expect("publish result")
            .await
            .expect("result ack");
    }

    /// Watch `watch`'s rows, oldest first.
    pub async fn rows(&self, watch: WatchId) -> Vec<OutboxRow> {
        let filter = history::Filter {
            watch_id: Some(watch),
            ..history::Filter::default()
        };
        let mut rows = history::deliveries(&self.db.pool, &filter, None, 100_000)
            .await
            .expect("outbox rows");
        rows.reverse();
        rows
    }

    pub async fn row(&self, id: OutboxId) -> OutboxRow {
        history::delivery(&self.db.pool, id)
            .await
            .expect("outbox row")
            .expect("the row exists")
    }

    /// The row's recorded attempts: (attempt, outcome, HTTP status), first to last.
    pub async fn attempts(&self, id: OutboxId) -> Vec<(i32, String, Option<i32>)> {
        tidings_store::attempts::of_row(&self.db.pool, id)
            .await
            .expect("attempts")
            .expect("the row")
            .0
            .into_iter()
            .map(|r| {
                (
                    r.attempt.attempt,
                    r.attempt.outcome.as_str().to_owned(),
                    r.attempt.http_status,
                )
            })
            .collect()
    }

    /// The price the baseline of `watch` holds (what was last sent), if one was sent.
    pub async fn baseline_price(&self, watch: WatchId) -> Option<i64> {
        sqlx::query_scalar("SELECT price FROM baselines WHERE watch_id = $1")
            .bind(watch)
            .fetch_optional(&self.db.pool)
            .await
            .expect("baseline")
    }

    /// Makes every waiting row due now, as if its backoff had passed (a time only, so raw SQL:
    /// no state changes).
    pub async fn make_due(&self) {
        sqlx::query(
            "UPDATE outbox SET next_attempt_at = now() WHERE status IN ('pending', 'retry')",
        )
        .execute(&self.db.pool)
        .await
        .expect("make due");
    }

    pub async fn cleanup(&self) {
        delete_streams(&self.js, &self.subjects).await;
    }
}

/// Every message `consumer` has now (acked), waiting up to `wait` for the first: its
/// `Nats-Msg-Id` and its payload.
async fn take(consumer: &PullConsumer, wait: Duration) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(wait)
            .messages()
            .await
            .expect("fetch");
        let mut got = 0;
        while let Some(Ok(m)) = batch.next().await {
            got += 1;
            m.ack().await.expect("ack");
            let id = tidings_bus::consume::message_id(&m)
                .unwrap_or_default()
                .to_owned();
            out.push((id, m.payload.to_vec()));
        }
        if got == 0 {
            return out;
        }
    }
}
