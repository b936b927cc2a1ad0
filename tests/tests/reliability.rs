//! Crashes and late answers: the real dispatcher loops and the real pusher, a fake push service
//! that decrypts what it receives, and faults placed where production met them. Each test checks
//! what reached the push service against what the outbox says.

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tidings_bus::consume::Handler as _;
use tidings_bus::streams::ensure_streams;
use tidings_dispatcher::results;
use tidings_domain::messages::{Outcome, PushRequest, decode_results};
use tidings_domain::outbox::Status;
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_pusher::worker::{Handled, Pusher};
use tidings_tests::brokers::PrivateNats;
use tidings_tests::fake_push::{Answer, FakePushService};
use tidings_tests::fixtures;
use tidings_tests::harness::{delete_streams, poll_wait, test_subjects};
use tidings_tests::pushers::{self, pusher_settings};
use tidings_tests::scenario::{Scenario, Watcher};

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };
const WAIT: Duration = Duration::from_millis(300);

async fn pusher(s: &Scenario) -> Pusher {
    Pusher::new(s.js.clone(), pusher_settings(s.subjects.clone()))
        .await
        .unwrap()
}

/// `n` watchers of different items pushing to `push`, each detected at 1100 and ingested.
async fn ingested_watchers(s: &Scenario, push: &FakePushService, n: usize) -> Vec<Watcher> {
    let mut watchers = Vec::new();
    for i in 0..n {
        let w = s
            .watcher_at(&format!("SKU-{i}"), BELOW_1200, 1100, &push.subscription())
            .await;
        s.ingested(&w, 1100).await;
        watchers.push(w);
    }
    watchers
}

/// Outbox row → how many times the push service accepted a notification of it.
fn deliveries(push: &FakePushService) -> HashMap<String, usize> {
    let mut by_row = HashMap::new();
    for r in push.received() {
        *by_row
            .entry(r.notification_id().unwrap_or_default())
            .or_default() += 1;
    }
    by_row
}

#[tokio::test]
async fn results_a_frozen_dispatcher_holds_past_the_lease_change_nothing_the_user_saw() {
    let mut s = Scenario::new().await;
    // A dispatcher frozen (or cut off from Postgres) holds results well past the 3 s lease.
    s.settings.result_ack_wait = Duration::from_secs(30);
    // A retry would be due at once: if the sweeper retried, the test would see a second push.
    s.settings.retry.base = Duration::from_millis(100);
    let push = FakePushService::start().await.unwrap();
    let watchers = ingested_watchers(&s, &push, 10).await;
    let results = s.results().await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().published, 10);
    let pusher = pusher(&s).await;
    let handled = pushers::handle_available(&pusher, WAIT).await;
    assert_eq!(handled.len(), 10);

    // Dispatcher A pulls the ten `delivered` results and freezes before committing them.
    let consumer = s
        .consumer(StreamKind::Result, results::CONSUMER)
        .await
        .unwrap();
    let held: Vec<jetstream::Message> = consumer
        .fetch()
        .max_messages(100)
        .expires(WAIT)
        .messages()
        .await
        .unwrap()
        .filter_map(|m| async { m.ok() })
        .collect()
        .await;
    let held_results: usize = held
        .iter()
        .map(|m| decode_results(&m.payload).unwrap().len())
        .sum();
    assert_eq!(held_results, 10);

    // The leases run out; the sweeper finds every delivery in the delivery log.
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(200)).await;
    let swept = s.sweep().await;
    assert_eq!((swept.delivered, swept.expired), (10, 0));
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.make_due().await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().claimed, 0);
    assert!(pushers::handle_available(&pusher, WAIT).await.is_empty());

    // A thaws: its results are redelivered and change nothing.
    for m in &held {
        m.ack_with(AckKind::Nak(None)).await.unwrap();
    }
    assert_eq!(results.run_once(WAIT).await.unwrap().applied, 0);

    let by_row = deliveries(&push);
    assert_eq!(
        by_row.len(),
        10,
        "every notification reached the push service"
    );
    assert!(by_row.values().all(|n| *n == 1), "and once: {by_row:?}");
    for w in &watchers {
        let rows = s.rows(w.watch).await;
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!((row.notification.status, row.attempt), (Status::Sent, 1));
        assert!(row.push_message_id.is_some());
        assert_eq!(row.notification.sent_value.as_ref().unwrap()["price"], 1100);
        assert_eq!(s.baseline_price(w.watch).await, Some(1100));
    }
    s.cleanup().await;
}

#[tokio::test]
async fn a_push_accepted_after_the_timeout_then_withheld_is_recorded_as_maybe_delivered() {
    let mut s = Scenario::new().await;
    s.settings.retry.base = Duration::from_millis(100);
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let w = s.watcher_at("SKU-1", BELOW_1200, 1100, &sub).await;
    s.ingested(&w, 1100).await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().published, 1);

    // The push service accepts it but answers after the pusher's 1 s timeout.
    push.answer_next(&sub, &[Answer::CreatedAfter(Duration::from_secs(3))]);
    let handled = pushers::handle_available(&pusher(&s).await, WAIT).await;
    assert_eq!(handled, [Handled::Reported(Outcome::Transient)]);
    assert_eq!(push.received_by(&sub).len(), 1, "the user got it");
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 1);
    let row = &s.rows(w.watch).await[0];
    assert_eq!(row.notification.status, Status::Retry);
    assert!(row.notification.maybe_delivered);

    // Before the retry the price goes back up: the retry is withheld, and the record says the
    // first attempt may have arrived.
    s.catalog.set_price("SKU-1", 1300);
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.make_due().await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().dropped, 1);
    let row = &s.rows(w.watch).await[0];
    assert_eq!(
        (
            row.notification.status.as_str(),
            row.notification.reason.map(|r| r.as_str())
        ),
        ("dropped", Some("condition_lost"))
    );
    assert!(
        row.notification.maybe_delivered,
        "history shows may have been delivered"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn the_deadline_is_the_re_check_plus_the_freshness_bound() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    let before = chrono::Utc::now();
    s.dispatcher().dispatch_once().await.unwrap();
    let after = chrono::Utc::now();
    let pushes: Vec<PushRequest> = s.take_pushes(&s.push_consumer().await, WAIT).await;
    let bound = chrono::Duration::from_std(s.settings.push_deadline).unwrap();
    assert!(pushes[0].deadline > before + bound);
    assert!(pushes[0].deadline <= after + bound);
    assert!(
        tidings_dispatcher::Settings::new(s.subjects.clone(), s.settings.source.clone())
            .push_deadline
            <= Duration::from_secs(5),
        "the default freshness bound is small"
    );
    s.cleanup().await;
}

/// A pusher on a broker of the test's own, which the test restarts.
struct Broker {
    nats: PrivateNats,
    js: jetstream::Context,
    subjects: tidings_domain::subjects::Subjects,
}

impl Broker {
    async fn start() -> Broker {
        let nats = PrivateNats::started().await.unwrap();
        let js = jetstream::new(nats.client().await.unwrap());
        let subjects = test_subjects();
        ensure_streams(&js, &subjects, &Default::default())
            .await
            .unwrap();
        Broker { nats, js, subjects }
    }
}

#[tokio::test]
async fn after_a_broker_restart_a_running_pusher_still_sends_a_redelivered_push_once() {
    let mut b = Broker::start().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let pusher = Pusher::new(b.js.clone(), pusher_settings(b.subjects.clone()))
        .await
        .unwrap();

    // kill -9 of the broker under the running pusher, which reconnects by itself.
    b.nats.restart().await.unwrap();
    let started = Instant::now();
    while b
        .js
        .get_stream(b.subjects.stream(StreamKind::Push))
        .await
        .is_err()
    {
        poll_wait(started, 10, || "no reconnect".into()).await;
    }
    // Then even a delivery log lost outright is made again by the dispatcher's sweeper (the
    // pusher may not make it), and the running pusher uses it again.
    for (sent, lose_the_log) in [(1, false), (2, true)] {
        if lose_the_log {
            let bucket = b.subjects.bucket(tidings_bus::delivered::BUCKET);
            b.js.delete_key_value(&bucket).await.unwrap();
            // A log that may not make the bucket (the pusher's) leaves it gone.
            let pushers = tidings_bus::delivered::DeliveryLog::new(
                b.js.clone(),
                &b.subjects,
                &Default::default(),
            );
            assert!(!pushers.restore_if_lost().await.unwrap());
            assert!(
                b.js.get_key_value(&bucket).await.is_err(),
                "the pusher made it"
            );
            let dispatchers = tidings_bus::delivered::DeliveryLog::new(
                b.js.clone(),
                &b.subjects,
                &Default::default(),
            )
            .creating();
            assert!(dispatchers.restore_if_lost().await.unwrap(), "was lost");
            assert!(!dispatchers.restore_if_lost().await.unwrap(), "is back");
        }
        let req = fixtures::push_request(&sub);
        assert_eq!(
            pushers::deliver_then_redeliver(&pusher, &b.js, &b.subjects, &req).await,
            [Handled::AlreadyDelivered]
        );
        let received = push.received_by(&sub).len();
        assert_eq!(received, sent, "each request reached it once");
    }
    delete_streams(&b.js, &b.subjects).await;
}

#[tokio::test]
async fn an_in_memory_delivery_log_left_by_an_older_tidings_is_replaced_by_one_on_disk() {
    use async_nats::jetstream::{kv, stream::StorageType};
    use tidings_bus::delivered::{BUCKET, Delivery, DeliveryLog};
    let js = jetstream::new(tidings_tests::harness::nats().await.unwrap());
    let subjects = test_subjects();
    js.create_key_value(kv::Config {
        bucket: subjects.bucket(BUCKET),
        history: 1,
        max_age: Duration::from_secs(600),
        storage: StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();

    let log = DeliveryLog::new(js.clone(), &subjects, &Default::default()).creating();
    log.ensure().await.unwrap();
    let mut stream = js
        .get_stream(format!("KV_{}", subjects.bucket(BUCKET)))
        .await
        .unwrap();
    assert_eq!(
        stream.info().await.unwrap().config.storage,
        StorageType::File
    );
    let id = tidings_domain::OutboxId::new();
    let delivery = Delivery {
        attempt: 2,
        message_id: Some("m".into()),
    };
    log.record(id, &delivery).await.unwrap();
    assert_eq!(log.lookup(id).await.unwrap(), Some(delivery));
    delete_streams(&js, &subjects).await;
}

/// `/livez` means the work loops make progress: a dispatcher whose dispatch loop hangs (here on
/// a lock an operator's statement holds on the outbox) fails its liveness probe once the loop has
/// made no progress for TIDINGS_STALL_AFTER, naming the loop, so Kubernetes restarts it; once the
/// loop moves again, `/livez` answers 200 again.
#[tokio::test]
async fn a_dispatcher_whose_loop_hangs_fails_liveness_until_it_moves_again() {
    let s = Scenario::new().await;
    let p = tidings_tests::services::Pipeline::start_only(
        &s,
        &["dispatcher"],
        &[("TIDINGS_STALL_AFTER", "2s")],
    )
    .await;
    let livez = format!("{}/livez", p.ops_url("dispatcher"));
    let answer = |url: String| async move {
        let r = reqwest::get(url).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(answer(livez.clone()).await.0, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        answer(livez.clone()).await.0,
        200,
        "an idle dispatcher is live"
    );

    let mut frozen = s.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *frozen)
        .await
        .unwrap();
    let started = Instant::now();
    let stalled = loop {
        let (status, body) = answer(livez.clone()).await;
        if status == 503 {
            break body;
        }
        poll_wait(started, 15, || format!("still live: {body}")).await;
    };
    let took = started.elapsed();
    assert!(stalled.contains("dispatch: no progress for"), "{stalled}");
    assert!(took >= Duration::from_secs(2), "stalled after {took:?}");
    eprintln!("stalled after {took:?}: {stalled}");
    frozen.rollback().await.unwrap();

    let started = Instant::now();
    loop {
        let (status, body) = answer(livez.clone()).await;
        if status == 200 {
            break;
        }
        poll_wait(started, 15, || format!("still stalled: {body}")).await;
    }
    eprintln!("live again {:?} after the lock went", started.elapsed());
    p.stop().await;
}
