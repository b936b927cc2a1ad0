//! The dispatcher against real Postgres and NATS, with the fake catalog as the source. Each test
//! plays the detector (publishing EnqueueRequests) and the pusher (reading PushRequests,
//! answering PushResults) around the dispatcher's real loops.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/scenario.rs"]
mod scenario;

use chrono::{Duration as ChronoDuration, Utc};
use scenario::Scenario;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tidings_bus::consume::Handler as _;
use tidings_bus::delivered::{Delivery, DeliveryLog};
use tidings_dispatcher::ingest::IngestStats;
use tidings_dispatcher::{backlog, sweeper};
use tidings_domain::messages::{
    Ended, EnqueueRequest, EnqueueRequests, Outcome, PushRequest, PushResult, decode_enqueues,
    decode_requests, encode,
};
use tidings_domain::outbox::Status;
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_domain::validity;
use tidings_testkit::brokers::PrivateNats;
use tidings_testkit::fake_catalog::{Behavior, Item};
use tidings_testkit::fixtures;

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };
const WAIT: Duration = Duration::from_millis(300);

#[tokio::test]
async fn enqueued_three_times_and_concurrently_is_one_row_and_one_push() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let req = s.detection(&w, 1100, Utc::now());
    let key = req.dedup_key().to_string();

    // The detector republishes the same key three times, two of them concurrently.
    assert!(!s.publish_enqueue(&req, &key).await);
    let (a, b) = tokio::join!(s.publish_enqueue(&req, &key), s.publish_enqueue(&req, &key));
    assert!(
        a && b,
        "JetStream's duplicate window absorbs republished keys"
    );
    // Past the duplicate window (a different message id), the outbox's unique key absorbs it.
    assert!(
        !s.publish_enqueue(&req, &format!("{key}:after-window"))
            .await
    );

    let ingest = s.ingest().await;
    let mut stats = IngestStats::default();
    for _ in 0..3 {
        let got = ingest.run_once(WAIT).await.unwrap();
        stats.inserted += got.inserted;
        stats.duplicates += got.duplicates;
    }
    assert_eq!((stats.inserted, stats.duplicates), (1, 1));
    assert_eq!(s.rows(w.watch).await.len(), 1);

    // Two dispatchers race for it.
    let (d1, d2) = (s.dispatcher(), s.dispatcher());
    let (r1, r2) = tokio::join!(d1.dispatch_once(), d2.dispatch_once());
    assert_eq!(r1.unwrap().published + r2.unwrap().published, 1);
    let pushes = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(pushes.len(), 1);
    s.cleanup().await;
}

#[tokio::test]
async fn a_price_still_below_at_send_is_sent_with_the_refetched_price() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;

    // Between detection and send the price fell further: the user is told the current price.
    s.catalog.set_price("SKU-1", 1050);
    let stats = s.dispatcher().dispatch_once().await.unwrap();
    assert_eq!(stats.published, 1);

    let pushes = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(pushes.len(), 1);
    let push = &pushes[0];
    assert_eq!(push.payload.body, "Now 10.50 EUR (your limit: 12.00 EUR).");
    assert_eq!(push.payload.data["price"], 1050);
    assert_eq!(push.attempt, 1);
    assert_eq!(push.target.url(), "https://push.example/sub/1");
    // One topic and tag per watch and trigger; current for the price validity after the re-check,
    // which the push's TTL and deadline never outlast.
    assert_eq!(push.topic, validity::topic(w.watch, &w.trigger));
    assert_eq!(push.payload.tag, Some(validity::tag(w.watch, &w.trigger)));
    assert_eq!(push.payload.id, Some(push.outbox_id));
    let observed_at = push.payload.observed_at.unwrap();
    let valid_until = push.payload.valid_until.unwrap();
    assert_eq!(valid_until - observed_at, chrono::Duration::minutes(20));
    assert!(push.deadline > Utc::now() && push.deadline <= valid_until);
    assert!((1190..=1200).contains(&push.ttl), "TTL {}", push.ttl);

    let row = s.row(push.outbox_id).await;
    assert_eq!(row.notification.status, Status::Sending);
    assert_eq!(row.notification.detected_price, 1100, "what we detected");
    assert_eq!(
        row.notification.sent_value.unwrap()["price"],
        1050,
        "what we said"
    );
    // The row keeps the payload the push carries, as a JSON object.
    let stored: serde_json::Value = sqlx::query_scalar("SELECT payload FROM outbox WHERE id = $1")
        .bind(push.outbox_id.0)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(stored, serde_json::to_value(&push.payload).unwrap());
    s.cleanup().await;
}

#[tokio::test]
async fn a_device_reads_its_language_and_the_currencys_own_decimals() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    fixtures::set_locale(&s.db.pool, w.device.id, "ja-JP")
        .await
        .unwrap();
    s.ingested(&w, 1100).await;
    // Yen have no minor unit: 1100 is 1,100 JPY, not 11.00.
    s.catalog.set(
        "SKU-1",
        Item {
            currency: "JPY".into(),
            ..Item::priced(1100)
        },
    );
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().published, 1);
    let pushes = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(pushes[0].payload.title, "SKU-1が指定価格を下回りました");
    assert_eq!(
        pushes[0].payload.body,
        "現在 1,100 JPY（指定価格: 1,200 JPY）"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_price_that_reverted_before_send_is_dropped_and_nothing_is_published() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;

    s.catalog.set_price("SKU-1", 1300);
    let stats = s.dispatcher().dispatch_once().await.unwrap();
    assert_eq!((stats.published, stats.dropped), (0, 1));

    let rows = s.rows(w.watch).await;
    assert_eq!(rows[0].notification.status, Status::Dropped);
    assert_eq!(
        rows[0].notification.reason.map(|r| r.as_str()),
        Some("condition_lost")
    );
    assert_eq!(rows[0].notification.detected_price, 1100);
    assert_eq!(
        rows[0].notification.checked.as_ref().unwrap()["price"],
        1300
    );
    assert_eq!(s.stream_len(StreamKind::Push).await, 0);
    let baselines = s.db.count("SELECT count(*) FROM baselines").await;
    assert_eq!(baselines, 0, "a dropped row never moves the baseline");
    s.cleanup().await;
}

#[tokio::test]
async fn a_rate_limited_source_is_retried_with_backoff_then_failed_at_the_cap() {
    let mut s = Scenario::new().await;
    s.settings.retry.max_retries = 2;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    s.catalog.set_behavior("SKU-1", Behavior::RateLimited);
    let d = s.dispatcher();

    let before = Utc::now();
    assert_eq!(d.dispatch_once().await.unwrap().retried, 1);
    let row = &s.rows(w.watch).await[0];
    assert_eq!(
        (row.notification.status, row.retry_count),
        (Status::Retry, 1)
    );
    assert!(row.last_error.as_deref().unwrap().contains("rate_limited"));
    let wait = (row.next_attempt_at - before).num_milliseconds();
    assert!(
        (26_900..=33_500).contains(&wait),
        "first backoff 30 s ± 10 %, got {wait} ms"
    );

    // Not due yet: nothing happens.
    assert_eq!(d.dispatch_once().await.unwrap().claimed, 0);

    s.make_due().await;
    let before = Utc::now();
    assert_eq!(d.dispatch_once().await.unwrap().retried, 1);
    let row = &s.rows(w.watch).await[0];
    assert_eq!(row.retry_count, 2);
    let wait = (row.next_attempt_at - before).num_milliseconds();
    assert!(
        (53_900..=66_500).contains(&wait),
        "second backoff 60 s ± 10 %, got {wait} ms"
    );

    s.make_due().await;
    assert_eq!(d.dispatch_once().await.unwrap().failed, 1);
    let row = &s.rows(w.watch).await[0];
    assert_eq!(row.notification.status, Status::Failed);
    assert_eq!(
        row.notification.reason.map(|r| r.as_str()),
        Some("retries_exhausted")
    );
    assert_eq!(s.stream_len(StreamKind::Push).await, 0);
    s.cleanup().await;
}

#[tokio::test]
async fn a_source_that_hangs_is_a_timeout_and_a_retry() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    s.catalog.set_behavior("SKU-1", Behavior::Hang);

    let started = Instant::now();
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().retried, 1);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the source timeout"
    );
    let row = &s.rows(w.watch).await[0];
    assert_eq!(row.notification.status, Status::Retry);
    assert!(row.last_error.as_deref().unwrap().contains("unavailable"));
    s.cleanup().await;
}

#[tokio::test]
async fn an_item_that_no_longer_exists_is_dropped_not_found() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    s.catalog.set_behavior("SKU-1", Behavior::NotFound);

    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().dropped, 1);
    let row = &s.rows(w.watch).await[0];
    assert_eq!(
        (
            row.notification.status.as_str(),
            row.notification.reason.map(|r| r.as_str())
        ),
        ("dropped", Some("not_found"))
    );
    s.cleanup().await;
}

#[tokio::test]
async fn pre_guards_drop_paused_and_removed_watches_and_inactive_subscriptions() {
    let s = Scenario::new().await;
    let paused = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let removed = s.watcher("SKU-2", BELOW_1200, 1100).await;
    let unsubscribed = s.watcher("SKU-3", BELOW_1200, 1100).await;
    let pool = &s.db.pool;
    sqlx::query("UPDATE watches SET paused = true WHERE id = $1")
        .bind(paused.watch)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("UPDATE watches SET removed_at = now() WHERE id = $1")
        .bind(removed.watch)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE push_subscriptions SET active = false, deactivated_at = now(), deactivation_reason = 'test'
         WHERE device_id = $1",
    )
    .bind(unsubscribed.device.id)
    .execute(pool)
    .await
    .unwrap();
    for (i, w) in [&paused, &removed, &unsubscribed].into_iter().enumerate() {
        s.publish_enqueue(&s.detection(w, 1100, Utc::now()), &format!("k{i}"))
            .await;
    }
    s.ingest().await.run_once(WAIT).await.unwrap();

    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().dropped, 3);
    for (w, reason) in [
        (&paused, "watch_paused"),
        (&removed, "watch_removed"),
        (&unsubscribed, "subscription_inactive"),
    ] {
        assert_eq!(
            s.rows(w.watch).await[0]
                .notification
                .reason
                .map(|r| r.as_str()),
            Some(reason)
        );
    }
    assert_eq!(
        s.catalog.requests(),
        (0, 0),
        "guarded rows never reach the source"
    );
    s.cleanup().await;
}

/// An operator pauses a device (the store's operation behind `POST
/// /v1/admin/devices/{id}/pause`): its due rows are withheld at the re-check, as a paused
/// watch's are, and once it is resumed its next notification is sent.
#[tokio::test]
async fn a_paused_device_is_withheld_at_the_recheck_until_resumed() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let other = s.watcher("SKU-2", BELOW_1200, 1100).await;
    let pause = |paused: bool| {
        let pool = s.db.pool.clone();
        let device = w.device.id;
        async move {
            let found = tidings_store::devices::set_paused(&pool, device, paused).await;
            assert!(found.unwrap(), "pause {paused}");
        }
    };
    pause(true).await;
    s.ingested(&w, 1100).await;
    s.ingested(&other, 1100).await;
    let dispatched = s.dispatcher().dispatch_once().await.unwrap();
    assert_eq!((dispatched.dropped, dispatched.published), (1, 1));
    let row = &s.rows(w.watch).await[0];
    assert_eq!(
        (
            row.notification.status.as_str(),
            row.notification.reason.map(|r| r.as_str())
        ),
        ("dropped", Some("device_paused"))
    );
    assert_eq!(
        s.rows(other.watch).await[0].notification.status,
        Status::Sending,
        "another device is not paused"
    );

    pause(false).await;
    // The next day's detection of the same watch goes out.
    s.publish_enqueue(
        &s.detection(&w, 1050, Utc::now() + ChronoDuration::days(1)),
        "next-day",
    )
    .await;
    s.ingest().await.run_once(WAIT).await.unwrap();
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().published, 1);
    let rows = s.rows(w.watch).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].notification.status, Status::Sending);
    s.cleanup().await;
}

#[tokio::test]
async fn results_are_applied_once_and_move_the_baseline_only_on_sent() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    s.catalog.set_price("SKU-1", 1050);
    s.dispatcher().dispatch_once().await.unwrap();
    let push = s
        .take_pushes(&s.push_consumer().await, WAIT)
        .await
        .remove(0);

    let results = s.results().await;
    let delivered = Ended::Delivered {
        message_id: Some("https://push.example/m/1".into()),
    };
    let delivered = s.result(&push, delivered, Some(201));
    s.publish_result(&delivered).await;
    // A redelivered result (published without a message id here, so JetStream keeps both).
    s.publish_result(&delivered).await;
    let mut applied = 0;
    let mut ignored = 0;
    for _ in 0..2 {
        let st = results.run_once(WAIT).await.unwrap();
        applied += st.applied;
        ignored += st.ignored;
    }
    assert_eq!(
        (applied, ignored),
        (1, 1),
        "the duplicate result is a no-op"
    );

    let row = s.row(push.outbox_id).await;
    assert_eq!(
        (row.notification.status, row.http_status),
        (Status::Sent, Some(201))
    );
    assert_eq!(
        s.attempts(push.outbox_id).await,
        [(1, "delivered".to_owned(), Some(201))],
        "one attempt on record, however often its result came"
    );
    let baseline: (i64, bool, uuid::Uuid) =
        sqlx::query_as("SELECT price, in_stock, outbox_id FROM baselines WHERE watch_id = $1")
            .bind(w.watch)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(
        baseline,
        (1050, true, push.outbox_id.0),
        "baseline = the value that was sent"
    );

    // A late transient result for the same attempt cannot move a sent row.
    s.publish_result(&s.result(&push, Outcome::Transient, Some(500)))
        .await;
    assert_eq!(results.run_once(WAIT).await.unwrap().applied, 0);
    assert_eq!(
        s.row(push.outbox_id).await.notification.status,
        Status::Sent
    );
    // The attempt is on the row, which it ended: the repeated results wrote no record of their
    // own, and the record is still the delivery.
    s.db.assert_count(
        &format!(
            "SELECT count(*) FROM outbox_attempts WHERE outbox_id = '{}'",
            push.outbox_id
        ),
        0,
    )
    .await;
    assert_eq!(
        s.attempts(push.outbox_id).await,
        [(1, "delivered".to_owned(), Some(201))]
    );

    // All three results were acked, so a purge takes them (acks are not awaited: poll briefly).
    let deadline = Instant::now() + Duration::from_secs(2);
    while results.consumer().purge_acked(0).await.unwrap() < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.stream_len(StreamKind::Result).await, 0);
    s.cleanup().await;
}

#[tokio::test]
async fn results_batched_in_one_message_are_applied_and_a_bad_batch_is_dead_lettered() {
    let s = Scenario::new().await;
    let mut watchers = Vec::new();
    for item in ["SKU-1", "SKU-2", "SKU-3"] {
        let w = s.watcher(item, BELOW_1200, 1100).await;
        s.ingested(&w, 1100).await;
        watchers.push(w);
    }
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().published, 3);
    let pushes = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(pushes.len(), 3);

    let mut batch: Vec<PushResult> = pushes
        .iter()
        .map(|p| s.result(p, Outcome::Delivered, Some(201)))
        .collect();
    // One result twice in its batch (a redelivered request's, reported again).
    batch.push(batch[0].clone());
    s.publish_results(&batch).await;
    // Two that cannot be used: an empty batch, and one with a result of an unknown version.
    s.publish_results(&[]).await;
    let mut newer = batch[1].clone();
    newer.v = 2;
    s.publish_results(&[batch[1].clone(), newer]).await;

    let stats = s.results().await.run_once(WAIT).await.unwrap();
    assert_eq!(
        (stats.applied, stats.ignored, stats.dead_lettered),
        (3, 1, 2),
        "{stats:?}"
    );
    for p in &pushes {
        assert_eq!(s.row(p.outbox_id).await.notification.status, Status::Sent);
    }
    for w in &watchers {
        assert_eq!(s.baseline_price(w.watch).await, Some(1100));
    }
    let dlq = s.subjects.stream(StreamKind::Dlq);
    let mut dead = s.js.get_stream(&dlq).await.unwrap();
    let kept = dead.info().await.unwrap().state.messages;
    assert_eq!(kept, 2, "both bad batches kept in the DLQ");
    s.cleanup().await;
}

#[tokio::test]
async fn a_gone_subscription_drops_the_row_and_deactivates_the_subscription() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let push = s.dispatched(&w, 1100).await;

    s.publish_result(&s.result(&push, Outcome::Gone, Some(410)))
        .await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 1);
    let row = s.row(push.outbox_id).await;
    assert_eq!(
        (
            row.notification.status.as_str(),
            row.notification.reason.map(|r| r.as_str())
        ),
        ("dropped", Some("subscription_gone"))
    );
    let active: bool =
        sqlx::query_scalar("SELECT active FROM push_subscriptions WHERE device_id = $1")
            .bind(w.device.id)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert!(!active);
    s.cleanup().await;
}

/// A gone answer to a redelivered request that may have reached the user before: the row is
/// dropped, and keeps the maybe-delivered mark.
#[tokio::test]
async fn a_gone_result_that_may_follow_a_delivery_marks_the_row() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let push = s.dispatched(&w, 1100).await;
    let maybe_delivered = Ended::Gone {
        maybe_delivered: true,
    };
    let gone = s.result(&push, maybe_delivered, Some(410));
    s.publish_result(&gone).await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 1);
    let row = s.row(push.outbox_id).await;
    assert_eq!(
        (
            row.notification.status.as_str(),
            row.notification.reason.map(|r| r.as_str()),
            row.notification.maybe_delivered
        ),
        ("dropped", Some("subscription_gone"), true)
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_not_retried_sooner() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let push = s.dispatched(&w, 1100).await;

    let asked = Ended::Transient {
        retry_after: Some(120),
        maybe_delivered: false,
    };
    let throttled = s.result(&push, asked, Some(429));
    let before = Utc::now();
    s.publish_result(&throttled).await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 1);
    let row = s.row(push.outbox_id).await;
    assert_eq!(
        (row.notification.status, row.retry_count),
        (Status::Retry, 1)
    );
    assert!(row.next_attempt_at >= before + ChronoDuration::seconds(120));
    assert!(row.next_attempt_at <= Utc::now() + ChronoDuration::seconds(121));

    // When it is due again, the next attempt carries attempt 2.
    s.make_due().await;
    s.dispatcher().dispatch_once().await.unwrap();
    let again = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(again.iter().map(|p| p.attempt).collect::<Vec<_>>(), [2]);
    s.cleanup().await;
}

#[tokio::test]
async fn a_malformed_enqueue_message_is_dead_lettered_and_the_next_valid_one_ingested() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.publish_raw_enqueue(b"{this is not json".to_vec()).await;
    let mut unknown = s.detection(&w, 1100, Utc::now());
    unknown.watch_id = tidings_domain::WatchId::new();
    s.publish_enqueue(&unknown, "unknown-watch").await;
    s.publish_enqueue(&s.detection(&w, 1100, Utc::now()), "k1")
        .await;

    let ingest = s.ingest().await;
    let stats = ingest.run_once(WAIT).await.unwrap();
    assert_eq!((stats.inserted, stats.dead_lettered), (1, 2));
    assert_eq!(s.rows(w.watch).await.len(), 1);
    assert_eq!(s.stream_len(StreamKind::Dlq).await, 2);
    // What an operator's dashboard shows.
    let dlq = s.subjects.stream(StreamKind::Dlq);
    assert_eq!(
        tidings_runtime::ops::measure_dlq(&s.js, &dlq)
            .await
            .unwrap(),
        2
    );
    assert_eq!(tidings_runtime::metrics::metrics().dlq_messages.get(), 2);

    // The DLQ copy says why, and the consumer moved on: nothing is redelivered.
    let dlq =
        s.js.get_stream(s.subjects.stream(StreamKind::Dlq))
            .await
            .unwrap();
    let first = dlq.get_raw_message(1).await.unwrap();
    let reason = first
        .headers
        .get(tidings_bus::dlq::REASON_HEADER)
        .unwrap()
        .as_str()
        .to_owned();
    assert!(reason.contains("JSON"), "{reason}");
    assert_eq!(&first.payload[..], b"{this is not json");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ingest.run_once(WAIT).await.unwrap(), IngestStats::default());
    // Terminated messages count as done: the purge takes them with the committed one.
    assert_eq!(ingest.consumer().purge_acked(0).await.unwrap(), 4);
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 0);
    s.cleanup().await;
}

/// A batch's requests are inserted together; one naming a watch that does not exist is
/// dead-lettered alone (its batch-mates are not), and a batch refused whole is dead-lettered as
/// it came. A request in a batch carries its own trace to its row.
#[tokio::test]
async fn a_batch_is_ingested_but_for_the_requests_it_must_refuse() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let traced = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut requests = Vec::new();
    for threshold in [1200, 1300] {
        let mut req = s.detection(&w, 1100, Utc::now());
        req.trigger = Trigger::PriceBelow { threshold };
        req.traceparent = Some(traced.to_owned());
        requests.push(req);
    }
    let mut unknown = s.detection(&w, 1100, Utc::now());
    unknown.watch_id = tidings_domain::WatchId::new();
    requests.insert(1, unknown.clone());
    s.publish_raw_enqueue(encode(&EnqueueRequests::new(requests)))
        .await;
    let all_unknown: Vec<EnqueueRequest> = (0..2)
        .map(|_| {
            let mut r = s.detection(&w, 1100, Utc::now());
            r.watch_id = tidings_domain::WatchId::new();
            r
        })
        .collect();
    let whole = encode(&EnqueueRequests::new(all_unknown));
    s.publish_raw_enqueue(whole.clone()).await;

    let ingest = s.ingest().await;
    let stats = ingest.run_once(WAIT).await.unwrap();
    assert_eq!((stats.inserted, stats.dead_lettered), (2, 3));
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT trigger, traceparent FROM outbox WHERE watch_id = $1 ORDER BY 1")
            .bind(w.watch)
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
        ["price_below:1200", "price_below:1300"]
    );
    assert!(rows.iter().all(|(_, tp)| tp.as_deref() == Some(traced)));

    let dlq =
        s.js.get_stream(s.subjects.stream(StreamKind::Dlq))
            .await
            .unwrap();
    let mut letters = Vec::new();
    for seq in 1..=2 {
        letters.push(dlq.get_raw_message(seq).await.unwrap());
    }
    letters.sort_by_key(|m| m.payload.len());
    let part = &letters[0];
    assert_eq!(
        decode_enqueues(&part.payload).unwrap(),
        vec![unknown.clone()]
    );
    let reason = part
        .headers
        .get(tidings_bus::dlq::REASON_HEADER)
        .unwrap()
        .as_str();
    assert_eq!(reason, format!("watch {} does not exist", unknown.watch_id));
    assert_eq!(
        &letters[1].payload[..],
        &whole[..],
        "refused whole: as it came"
    );
    // Both messages are done: nothing is redelivered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ingest.run_once(WAIT).await.unwrap(), IngestStats::default());
    assert_eq!(ingest.consumer().purge_acked(0).await.unwrap(), 3);
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 0);
    s.cleanup().await;
}

#[tokio::test]
async fn ingest_purges_only_what_was_acked_and_the_duplicate_window_outlives_the_purge() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let ingest = s.ingest().await;
    let mut keys = Vec::new();
    for threshold in [1200, 1300, 1400] {
        let mut req = s.detection(&w, 1100, Utc::now());
        req.trigger = Trigger::PriceBelow { threshold };
        let key = req.dedup_key().to_string();
        assert!(!s.publish_enqueue(&req, &key).await);
        keys.push((req, key));
    }

    // A replica holds all three and has committed (acked) the first and the third.
    let consumer = s
        .consumer(StreamKind::Enqueue, tidings_dispatcher::ingest::CONSUMER)
        .await
        .unwrap();
    let held = tidings_bus::consume::fetch(&consumer, 3, WAIT)
        .await
        .unwrap();
    assert_eq!(held.len(), 3);
    held[0].double_ack().await.unwrap();
    held[2].double_ack().await.unwrap();
    assert_eq!(
        ingest.consumer().purge_acked(0).await.unwrap(),
        2,
        "purged below seq 2"
    );
    assert_eq!(
        s.stream_len(StreamKind::Enqueue).await,
        2,
        "the message still in flight, and every one after it, stay"
    );

    held[1].double_ack().await.unwrap();
    assert_eq!(ingest.consumer().purge_acked(2).await.unwrap(), 4);
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 0);
    assert_eq!(
        ingest.consumer().purge_acked(4).await.unwrap(),
        4,
        "nothing more to do"
    );

    // The detector re-publishing a purged key is still answered `duplicate`.
    let (req, key) = &keys[0];
    assert!(s.publish_enqueue(req, key).await);
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 0);
    s.cleanup().await;
}

/// Inserts `n` due rows straight into the outbox (ingest is tested above). Each row has its own
/// trigger key, so each has its own baseline: one row being sent must not make the others stale.
async fn seed_rows(s: &Scenario, item: &str, n: usize) {
    let w = s.watcher(item, BELOW_1200, 1100).await;
    let now = Utc::now();
    let reqs: Vec<_> = (0..n)
        .map(|i| {
            let mut r = s.detection(&w, 1100, now);
            r.trigger = Trigger::PriceBelow {
                threshold: 1200 + i as i64,
            };
            r
        })
        .collect();
    for chunk in reqs.chunks(1000) {
        let batch: Vec<_> = chunk.iter().map(|r| (r, None)).collect();
        let inserted = tidings_store::enqueue::insert(&s.db.pool, &batch)
            .await
            .unwrap();
        assert_eq!(inserted, chunk.len());
    }
}

/// Dispatches with `d` until a claim finds nothing due: how many requests it published.
async fn until_idle(d: tidings_dispatcher::dispatch::Dispatcher) -> usize {
    let mut published = 0;
    loop {
        let st = d.dispatch_once().await.unwrap();
        if st.claimed == 0 {
            return published;
        }
        published += st.published;
    }
}

/// The claim is planned once per connection: Postgres would otherwise plan it anew each time,
/// over every week's partition (~1.3 ms a claim), since a custom plan is all it tries for a
/// statement's first five runs, and it keeps to them when they look cheaper.
#[tokio::test]
async fn a_claim_is_planned_once_per_connection_and_still_claims_in_due_order() {
    use tidings_store::claim::{plan_by_due_index, statement};
    let s = Scenario::new().await;
    seed_rows(&s, "SKU-1", 30).await;
    let mut conn = s.db.pool.acquire().await.unwrap();
    let mut claimed = Vec::new();
    for _ in 0..3 {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        plan_by_due_index(&mut tx).await.unwrap();
        claimed.extend(statement(10, 30.0).fetch_all(&mut *tx).await.unwrap());
        tx.commit().await.unwrap();
    }
    let due: Vec<_> = claimed.iter().map(|c| c.next_attempt_at).collect();
    let ids: std::collections::HashSet<_> = claimed.iter().map(|c| c.id).collect();
    assert_eq!(
        (claimed.len(), ids.len()),
        (30, 30),
        "not every due row claimed once"
    );
    assert!(due.is_sorted(), "claimed out of due order: {due:?}");
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements
         WHERE statement LIKE 'WITH due AS%'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!((generic, custom), (3, 0), "the claim was planned again");
    drop(conn);
    s.cleanup().await;
}

/// Regression: on a young outbox (no statistics yet) Postgres planned the claim as a bitmap scan
/// of every due row plus a sort, reading 25,000 rows to take 500. The claim now runs with the
/// plans that ignore the due index's order turned off; this checks the plan it gets.
#[tokio::test]
async fn a_claim_reads_due_rows_in_index_order_even_without_statistics() {
    use sqlx::Execute;
    use tidings_store::claim::{plan_by_due_index, statement};
    let s = Scenario::new().await;
    seed_rows(&s, "SKU-1", 5000).await;
    let mut tx = s.db.pool.begin().await.unwrap();
    plan_by_due_index(&mut tx).await.unwrap();
    let claim = statement(500, 30.0).sql();
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN {}",
        claim.replace("$1", "500").replace("$2", "30")
    ))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let plan = plan.join("\n");
    // Each week's partition is read through its copy of the due index (`outbox_due` on the
    // partitioned table), merged in claim order.
    let due_scans = plan
        .lines()
        .filter(|l| l.contains("Index Scan using outbox_") && l.contains("_next_attempt_at_idx"))
        .count();
    assert!(due_scans >= 1 && plan.contains("Merge Append"), "{plan}");
    assert!(!plan.contains("Bitmap"), "{plan}");
    // No sort node (the Merge Append's "Sort Key" is the order it merges in).
    assert!(
        !plan.lines().any(|l| l
            .trim_start()
            .trim_start_matches("->  ")
            .starts_with("Sort  ")),
        "{plan}"
    );
    assert!(!plan.contains("Seq Scan"), "{plan}");
    s.cleanup().await;
}

#[tokio::test]
async fn two_dispatchers_never_claim_the_same_row() {
    let mut s = Scenario::new().await;
    s.settings.claim_lease = Duration::from_secs(30);
    seed_rows(&s, "SKU-1", 10_000).await;

    // Every publish, duplicates included, is seen by a plain subscriber on the push subject.
    let nats = tidings_testkit::harness::nats().await.unwrap();
    let mut seen = nats
        .subscribe(
            s.subjects
                .subject(StreamKind::Push, tidings_domain::Channel::WebPush),
        )
        .await
        .unwrap();
    nats.flush().await.unwrap();

    let (a, b) = tokio::join!(until_idle(s.dispatcher()), until_idle(s.dispatcher()));
    assert_eq!(a + b, 10_000);
    assert!(a > 0 && b > 0, "both dispatchers took part ({a} / {b})");

    let mut ids = HashSet::new();
    let mut total = 0;
    while let Ok(Some(m)) =
        tokio::time::timeout(Duration::from_secs(2), futures::StreamExt::next(&mut seen)).await
    {
        // One request or a batch of them (`TIDINGS_DISPATCH_PUSH_BATCH`).
        for p in decode_requests(&m.payload).unwrap() {
            total += 1;
            ids.insert(p.outbox_id);
            assert_eq!(p.attempt, 1, "a first attempt");
        }
        if total >= 10_000 {
            break;
        }
    }
    assert_eq!(
        (total, ids.len()),
        (10_000, 10_000),
        "one push per row, none twice"
    );
    assert_eq!(s.db.rows_in(&[Status::Sending]).await, 10_000);
    s.cleanup().await;
}

/// A cap holds across dispatchers: four racing over three capped devices' rows, a row a claim,
/// let go exactly each cap's worth and hold the rest for its release, however they interleave.
#[tokio::test]
async fn dispatchers_racing_never_let_a_device_past_its_cap() {
    let mut s = Scenario::new().await;
    s.settings.claim_batch = 1;
    for item in ["SKU-1", "SKU-2", "SKU-3"] {
        seed_rows(&s, item, 40).await;
    }
    sqlx::query(
        r#"UPDATE devices SET preferences = '{"cap": {"max": 15, "window_seconds": 3600}}'"#,
    )
    .execute(&s.db.pool)
    .await
    .unwrap();
    let racing = (0..4).map(|_| until_idle(s.dispatcher()));
    let published: usize = futures::future::join_all(racing).await.into_iter().sum();
    assert_eq!(published, 3 * 15);
    let per_device: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'sending'),
                count(*) FILTER (WHERE status = 'pending' AND held = 'cap' AND attempt = 0
                                   AND next_attempt_at > now() + interval '55 minutes')
         FROM outbox GROUP BY device_id",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(per_device, vec![(15, 25); 3]);
    s.cleanup().await;
}

/// `n` rows of one device on `item` held for its daily digest, then due (its time came): the
/// digest's PushRequest, once dispatched.
async fn digest_of(s: &Scenario, item: &str, n: usize) -> PushRequest {
    held_for_digest(s, item, n).await;
    let stats = s.dispatcher().digest_once().await.unwrap();
    assert_eq!((stats.claimed, stats.published), (n, 1));
    let mut pushes = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(pushes.len(), 1, "one message for the digest");
    pushes.remove(0)
}

/// `n` rows of one device on `item` held for its daily digest, then due (its time came).
async fn held_for_digest(s: &Scenario, item: &str, n: usize) {
    seed_rows(s, item, n).await;
    sqlx::query(r#"UPDATE devices SET preferences = '{"digest": "daily at 08:00"}'"#)
        .execute(&s.db.pool)
        .await
        .unwrap();
    until_idle(s.dispatcher()).await;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE held = 'digest' AND status = 'pending'
                                       AND next_attempt_at > now()",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert!(held >= n as i64, "each row waits for the digest");
    s.db.digest_time().await;
    assert_eq!(
        s.dispatcher().dispatch_once().await.unwrap().claimed,
        0,
        "a due digest row is the digest claim's alone"
    );
}

/// The push service refuses the digest `push` for now (503): each of its rows goes back to retry.
async fn refuse_digest(s: &Scenario, push: &PushRequest) {
    let refused = PushResult {
        members: push.members.clone(),
        ..s.result(push, Outcome::Transient, Some(503))
    };
    s.publish_result(&refused).await;
    let applied = s.results().await.run_once(WAIT).await.unwrap().applied;
    assert_eq!(applied, 1 + push.members.len());
}

/// The times the rows in `retry` are due again, earliest first, each once.
async fn retry_times(s: &Scenario) -> Vec<chrono::DateTime<Utc>> {
    sqlx::query_scalar(
        "SELECT DISTINCT next_attempt_at FROM outbox WHERE status = 'retry' ORDER BY 1",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap()
}

/// Waits until the first row in `retry` is due, and not much longer: rows due later (with a
/// retry base of 1 s, jittered up to 100 ms apart) are not due yet.
async fn until_first_retry(s: &Scenario) {
    let first = retry_times(s).await[0];
    let wait = (first - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(2)).await;
}

/// Each row's (status, attempt, digest_of), by id.
async fn digest_rows(s: &Scenario) -> Vec<(String, i32, Option<uuid::Uuid>)> {
    sqlx::query_as("SELECT status, attempt, digest_of FROM outbox ORDER BY id")
        .fetch_all(&s.db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_digests_one_result_ends_each_of_its_rows_once() {
    let s = Scenario::new().await;
    let push = digest_of(&s, "SKU-1", 4).await;
    assert_eq!(push.members.len(), 3, "the leader carries the other three");
    assert_eq!(push.urgency, tidings_domain::messages::Urgency::Low);
    let leader = push.outbox_id.0;
    assert!(
        push.members.iter().all(|m| m.id.0 > leader),
        "led by the lowest id"
    );
    let sending = digest_rows(&s).await;
    assert_eq!(sending, vec![("sending".to_owned(), 1, Some(leader)); 4]);

    let delivered = PushResult {
        members: push.members.clone(),
        ..s.result(&push, Outcome::Delivered, Some(201))
    };
    s.publish_result(&delivered).await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 4);
    assert_eq!(
        digest_rows(&s).await,
        vec![("sent".to_owned(), 1, Some(leader)); 4]
    );
    for m in &push.members {
        assert_eq!(
            s.attempts(m.id).await,
            [(1, "delivered".to_owned(), Some(201))],
            "each row has its attempt on record"
        );
    }
    // A redelivery of the result changes nothing.
    s.publish_result(&delivered).await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 0);
    s.cleanup().await;
}

#[tokio::test]
async fn a_row_that_leaves_a_digest_at_its_retry_no_longer_names_it() {
    let mut s = Scenario::new().await;
    s.settings.retry.base = Duration::from_millis(100);
    let push = digest_of(&s, "SKU-1", 4).await;
    refuse_digest(&s, &push).await;
    let leader = Some(push.outbox_id.0);
    assert_eq!(
        digest_rows(&s).await,
        vec![("retry".to_owned(), 1, leader); 4]
    );
    // At the retry the price is 12.01: the rows for 12.00 and 12.01 no longer hold.
    s.catalog.set_price("SKU-1", 1201);
    s.make_due().await;
    let stats = s.dispatcher().digest_once().await.unwrap();
    assert_eq!((stats.claimed, stats.published, stats.dropped), (4, 1, 2));
    let again = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(again.len(), 1);
    let new_leader = Some(again[0].outbox_id.0);
    let mut rows: Vec<(String, Option<uuid::Uuid>)> = digest_rows(&s)
        .await
        .into_iter()
        .map(|(status, _, of)| (status, of))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("dropped".to_owned(), None),
            ("dropped".to_owned(), None),
            ("sending".to_owned(), new_leader),
            ("sending".to_owned(), new_leader),
        ],
        "a dropped row names no digest; the others the one carrying their attempt"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_digests_rows_whose_leader_ended_without_them_are_retried_not_left_sending() {
    let s = Scenario::new().await;
    let push = digest_of(&s, "SKU-1", 3).await;
    // A pusher of the release before digests reports the leader's result alone.
    s.publish_result(&s.result(&push, Outcome::Delivered, Some(201)))
        .await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 1);
    let leader = Some(push.outbox_id.0);
    let states = |rows: Vec<(String, i32, Option<uuid::Uuid>)>| -> Vec<String> {
        rows.into_iter().map(|r| r.0).collect()
    };
    assert_eq!(
        states(digest_rows(&s).await),
        ["sent", "sending", "sending"]
    );
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    let stats = s.sweep().await;
    assert_eq!((stats.delivered, stats.expired), (0, 2));
    let rows: Vec<(String, bool, Option<uuid::Uuid>)> =
        sqlx::query_as("SELECT status, maybe_delivered, digest_of FROM outbox ORDER BY id")
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            ("sent".to_owned(), false, leader),
            ("retry".to_owned(), true, leader),
            ("retry".to_owned(), true, leader),
        ],
        "whether the leader's message carried them cannot be known"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn the_sweeper_decides_a_digests_rows_with_its_leader() {
    let s = Scenario::new().await;
    let push = digest_of(&s, "SKU-1", 3).await;
    // The pusher delivered it and died before its result went out.
    s.delivery_log()
        .record(
            push.outbox_id,
            &Delivery {
                attempt: push.attempt,
                message_id: None,
            },
        )
        .await
        .unwrap();
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    let stats = s.sweep().await;
    assert_eq!((stats.delivered, stats.expired), (3, 0));
    let leader = Some(push.outbox_id.0);
    assert_eq!(
        digest_rows(&s).await,
        vec![("sent".to_owned(), 1, leader); 3]
    );
    s.cleanup().await;

    // Nothing on record: every row back to retry, maybe delivered, none on its own.
    let s = Scenario::new().await;
    let push = digest_of(&s, "SKU-2", 3).await;
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    let stats = s.sweep().await;
    assert_eq!((stats.delivered, stats.expired), (0, 3));
    let rows: Vec<(String, bool, Option<String>)> =
        sqlx::query_as("SELECT status, maybe_delivered, held FROM outbox ORDER BY id")
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![("retry".to_owned(), true, Some("digest".to_owned())); 3],
        "retried together, by the digest claim"
    );
    assert_eq!(retry_times(&s).await.len(), 1, "at one time");
    // Retried as a digest again: one message, attempt 2.
    s.make_due().await;
    let stats = s.dispatcher().digest_once().await.unwrap();
    assert_eq!((stats.claimed, stats.published), (3, 1));
    let again = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!((again.len(), again[0].attempt), (1, 2));
    assert_eq!(again[0].outbox_id, push.outbox_id);
    s.cleanup().await;
}

#[tokio::test]
async fn a_digest_sent_back_to_retry_comes_back_as_one_message() {
    let mut s = Scenario::new().await;
    s.settings.retry.base = Duration::from_secs(1);
    let push = digest_of(&s, "SKU-1", 4).await;
    refuse_digest(&s, &push).await;
    assert_eq!(
        retry_times(&s).await.len(),
        1,
        "one retry time for its rows"
    );
    // When its first row is due, the whole digest is: one message, not one per row.
    until_first_retry(&s).await;
    let stats = s.dispatcher().digest_once().await.unwrap();
    assert_eq!((stats.claimed, stats.published), (4, 1));
    let again = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!((again.len(), again[0].members.len()), (1, 3));
    s.cleanup().await;
}

#[tokio::test]
async fn a_digest_whose_recheck_failed_comes_back_as_one_message() {
    let mut s = Scenario::new().await;
    s.settings.retry.base = Duration::from_secs(1);
    held_for_digest(&s, "SKU-1", 4).await;
    s.catalog.set_behavior("SKU-1", Behavior::ServerError);
    let stats = s.dispatcher().digest_once().await.unwrap();
    assert_eq!((stats.claimed, stats.published), (4, 0));
    assert_eq!(s.db.rows_in(&[Status::Retry]).await, 4);
    assert_eq!(
        retry_times(&s).await.len(),
        1,
        "one retry time for its rows"
    );
    s.catalog.set_behavior("SKU-1", Behavior::Normal);
    until_first_retry(&s).await;
    let stats = s.dispatcher().digest_once().await.unwrap();
    assert_eq!((stats.claimed, stats.published), (4, 1));
    s.cleanup().await;
}

#[tokio::test]
async fn a_dispatcher_killed_mid_batch_loses_nothing() {
    let mut s = Scenario::new().await;
    s.settings.claim_batch = 100;
    // Recovered rows should not sit out the production backoff (30 s) in a test.
    s.settings.retry.base = Duration::from_millis(200);
    seed_rows(&s, "SKU-1", 2_000).await;

    // Dispatcher A starts and is killed (its task dropped) while it is working.
    let a = s.dispatcher();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let killed = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { a.run(shutdown).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.push_requests_stored().await < 150 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    killed.abort();
    let _ = killed.await;
    // And every PushRequest it published is lost (JetStream may lose acknowledged messages on a
    // crash): only the lease sweeper can recover those rows.
    let published_by_a = s.push_requests_stored().await as u64;
    assert!(published_by_a >= 150);
    s.js.get_stream(s.subjects.stream(StreamKind::Push))
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();

    // A full dispatcher (all four loops) and a pusher that delivers everything take over.
    let stop = tokio_util::sync::CancellationToken::new();
    let dispatcher = running(&s, &stop);
    let pusher = s.push_consumer().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delivered = HashSet::new();
    loop {
        let pushes = s.take_pushes(&pusher, Duration::from_millis(100)).await;
        let results: Vec<_> = pushes
            .iter()
            .map(|p| s.result(p, Outcome::Delivered, Some(201)))
            .collect();
        futures::future::join_all(results.iter().map(|r| s.publish_result(r))).await;
        delivered.extend(pushes.iter().map(|p| (p.outbox_id, p.attempt)));
        let open = (s.db)
            .rows_in(&[Status::Pending, Status::Retry, Status::Sending])
            .await;
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} rows still not terminal");
    }
    stop.cancel();
    dispatcher.await.unwrap().unwrap();

    let sent = s.db.rows_in(&[Status::Sent]).await;
    assert_eq!(sent, 2_000, "every row reached sent");
    let rows_pushed: HashSet<_> = delivered.iter().map(|(id, _)| *id).collect();
    assert_eq!(rows_pushed.len(), 2_000);
    let recovered =
        s.db.count("SELECT count(*) FROM outbox WHERE attempt >= 2")
            .await;
    assert!(
        recovered as u64 >= published_by_a,
        "{recovered} rows recovered by the sweeper, {published_by_a} pushes were lost"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_late_delivered_result_ends_an_expired_row_sent_and_it_is_not_pushed_again() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let push = s.dispatched(&w, 1100).await;

    // No result arrives and nothing is on record; the lease is 3 s in this scenario.
    assert_eq!(s.sweep().await.moved(), 0, "lease still running");
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    assert_eq!(s.sweep().await.expired, 1);
    let row = s.row(push.outbox_id).await;
    assert_eq!(row.notification.status, Status::Retry);
    assert!(row.last_error.unwrap().starts_with("lease_expired"));
    assert!(
        row.notification.maybe_delivered,
        "nobody knows whether attempt 1 arrived"
    );
    assert_eq!(
        s.attempts(push.outbox_id).await,
        [(1, "lease_expired".to_owned(), None)]
    );

    // The attempt-1 result turns up late (a dispatcher died holding it): the user did get the
    // notification, so the row is sent, with its baseline, and never dispatched again.
    s.publish_result(&s.result(&push, Outcome::Delivered, Some(201)))
        .await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 1);
    let row = s.row(push.outbox_id).await;
    assert_eq!((row.notification.status, row.attempt), (Status::Sent, 1));
    assert_eq!(
        s.attempts(push.outbox_id).await,
        [(1, "delivered".to_owned(), Some(201))],
        "the late result replaced the sweeper's placeholder"
    );
    assert_eq!(
        s.baseline_price(w.watch).await,
        Some(1100),
        "the baseline is the value that was sent"
    );
    s.make_due().await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().claimed, 0);
    assert!(
        s.take_pushes(&s.push_consumer().await, WAIT)
            .await
            .is_empty()
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_late_transient_result_changes_nothing_and_a_stale_attempt_is_ignored() {
    let mut s = Scenario::new().await;
    s.settings.retry.base = Duration::from_millis(100);
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let first = s.dispatched(&w, 1100).await;
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    assert_eq!(s.sweep().await.expired, 1);

    // Attempt 1's late transient result: the row is already retrying.
    s.publish_result(&s.result(&first, Outcome::Transient, Some(503)))
        .await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 0);
    let row = s.row(first.outbox_id).await;
    assert_eq!(
        (row.notification.status, row.retry_count),
        (Status::Retry, 1)
    );

    // Attempt 2 starts; attempt 1's delivered result now comes too late to count.
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.make_due().await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().published, 1);
    let second = s.take_pushes(&s.push_consumer().await, WAIT).await;
    assert_eq!(second[0].attempt, 2);
    s.publish_result(&s.result(&first, Outcome::Delivered, Some(201)))
        .await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 0);
    assert_eq!(
        s.row(first.outbox_id).await.notification.status,
        Status::Sending
    );
    // Attempt 1 is on record with its first real result; attempt 2 has none yet.
    assert_eq!(
        s.attempts(first.outbox_id).await,
        [(1, "transient".to_owned(), Some(503))]
    );
    s.cleanup().await;
}

#[tokio::test]
async fn an_expired_lease_whose_delivery_is_on_record_ends_sent_without_its_result() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let push = s.dispatched(&w, 1100).await;
    // The pusher delivered and recorded it; its result never reached a dispatcher.
    s.delivery_log()
        .record(
            push.outbox_id,
            &Delivery {
                attempt: push.attempt,
                message_id: Some("https://push.example/m/1".into()),
            },
        )
        .await
        .unwrap();

    assert_eq!(s.sweep().await.moved(), 0, "lease still running");
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    let stats = s.sweep().await;
    assert_eq!((stats.delivered, stats.expired), (1, 0));
    let row = s.row(push.outbox_id).await;
    assert_eq!(row.notification.status, Status::Sent);
    assert!(!row.notification.maybe_delivered);
    assert_eq!(
        row.push_message_id.as_deref(),
        Some("https://push.example/m/1")
    );
    assert_eq!(s.baseline_price(w.watch).await, Some(1100));
    s.cleanup().await;
}

#[tokio::test]
async fn an_unconfirmed_publish_leaves_the_row_sending_until_its_outcome_is_known() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    // JetStream does not confirm the PushRequest (here: its stream is gone; in the chaos run the
    // broker died after storing it, and the request was pushed all the same).
    s.js.delete_stream(s.subjects.stream(StreamKind::Push))
        .await
        .unwrap();
    let stats = s.dispatcher().dispatch_once().await.unwrap();
    assert_eq!((stats.published, stats.unconfirmed), (0, 1));
    let row = &s.rows(w.watch).await[0];
    assert_eq!(
        (row.notification.status, row.attempt),
        (Status::Sending, 1),
        "not taken back: the request may be out there"
    );

    // It was delivered after all: once the lease runs out, the delivery log says so.
    s.delivery_log()
        .record(
            row.notification.id,
            &Delivery {
                attempt: 1,
                message_id: None,
            },
        )
        .await
        .unwrap();
    s.make_due().await;
    assert_eq!(s.dispatcher().dispatch_once().await.unwrap().claimed, 0);
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;
    assert_eq!(s.sweep().await.delivered, 1);
    assert_eq!(
        s.row(row.notification.id).await.notification.status,
        Status::Sent
    );
    assert_eq!(s.baseline_price(w.watch).await, Some(1100));
    s.cleanup().await;
}

#[tokio::test]
async fn a_sweeper_that_cannot_ask_the_delivery_log_leaves_the_row_sending() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let push = s.dispatched(&w, 1100).await;
    tokio::time::sleep(s.settings.sending_lease + Duration::from_millis(100)).await;

    // The delivery log's broker is not there: retrying now could push a delivered
    // notification twice, so the row waits.
    let nowhere = PrivateNats::reserve().unwrap();
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(&nowhere.url)
        .await
        .unwrap();
    let mut js = async_nats::jetstream::new(client);
    js.set_timeout(Duration::from_millis(200));
    let unreachable = DeliveryLog::new(js, &s.subjects, &s.settings.streams);
    let stats = sweeper::sweep_once(&s.db.pool, &s.settings, &unreachable)
        .await
        .unwrap();
    assert_eq!((stats.deferred, stats.moved()), (1, 0));
    assert_eq!(
        s.row(push.outbox_id).await.notification.status,
        Status::Sending
    );
    // What TidingsSendingPastLease watches.
    let overdue = || {
        tidings_dispatcher::metrics::metrics()
            .lease_overdue_seconds
            .get()
    };
    backlog::measure(&s.db.pool, 5).await.unwrap();
    assert!(overdue() > 0.0, "{}", overdue());

    // Once the log answers (nothing on record), the row is retried, marked maybe delivered.
    assert_eq!(s.sweep().await.expired, 1);
    let row = s.row(push.outbox_id).await;
    assert_eq!(row.notification.status, Status::Retry);
    assert!(row.notification.maybe_delivered);
    backlog::measure(&s.db.pool, 5).await.unwrap();
    assert_eq!(overdue(), 0.0);
    s.cleanup().await;
}

/// While Postgres is away the dispatch loop keeps trying, and says so in a metric an alert
/// reads (not only in its log).
#[tokio::test]
async fn failed_dispatch_batches_are_counted() {
    let s = Scenario::new().await;
    let gone = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(100))
        .connect_lazy("postgres://tidings@127.0.0.1:1/nowhere")
        .unwrap();
    let source = tidings_source::Sources::new(s.settings.source.clone()).unwrap();
    let dispatcher = tidings_dispatcher::dispatch::Dispatcher::new(
        gone,
        s.js.clone(),
        std::sync::Arc::new(source),
        s.settings(),
    );
    let failures = || {
        tidings_runtime::metrics::metrics()
            .failures
            .get_or_create(&tidings_runtime::metrics::OperationLabels {
                operation: "dispatch".into(),
            })
            .get()
    };
    assert_eq!(failures(), 0);
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { dispatcher.run(stop).await }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.cancel();
    running.await.unwrap();
    assert!(failures() >= 2, "{}", failures());
    s.cleanup().await;
}

#[tokio::test]
async fn a_running_dispatcher_picks_up_new_rows_by_itself() {
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = running(&s, &stop);
    let consumer = s.push_consumer().await;
    s.publish_enqueue(&s.detection(&w, 1100, Utc::now()), "k1")
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pushes = Vec::new();
    while pushes.is_empty() && Instant::now() < deadline {
        pushes = s.take_pushes(&consumer, Duration::from_millis(100)).await;
    }
    assert_eq!(
        pushes.len(),
        1,
        "ingested and dispatched without being driven"
    );
    // Ingest purges what it acked from the enqueue stream by itself.
    let purged_by = Instant::now() + 3 * tidings_bus::consume::PURGE_EVERY;
    while s.stream_len(StreamKind::Enqueue).await > 0 && Instant::now() < purged_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 0);
    stop.cancel();
    running.await.unwrap().unwrap();
    s.cleanup().await;
}

/// Regression (found by bench-pipeline): with a slow pusher, dispatch filled the push stream
/// until requests outlived their deadline and came back as retries. Now the backlog stays in the
/// outbox, where rows are re-checked when there is room to send them.
#[tokio::test]
async fn a_full_push_stream_pauses_dispatch_and_the_backlog_waits_in_the_outbox() {
    let mut s = Scenario::new().await;
    s.settings.push_backlog_limit = 4;
    // Counted in messages below: one request each. (With batches each waiting message counts
    // as a full batch: `with_push_batches_a_claims_requests_go_batch_by_batch…`.)
    s.settings.push_batch = 1;
    let mut watchers = Vec::new();
    for i in 0..10 {
        let w = s.watcher(&format!("SKU-{i}"), BELOW_1200, 1100).await;
        s.ingested(&w, 1100).await;
        watchers.push(w);
    }
    let d = s.dispatcher();
    for _ in 0..3 {
        let room = d.room().await;
        d.dispatch_up_to(room).await.unwrap();
    }
    assert_eq!(
        s.stream_len(StreamKind::Push).await,
        4,
        "no more than the limit queued"
    );
    let pending = s.db.rows_in(&[Status::Pending]).await;
    assert_eq!(pending, 6, "the rest wait in the outbox");

    // The pusher takes the queued requests; dispatch resumes with the rest.
    let consumer = s.push_consumer().await;
    assert_eq!(s.take_pushes(&consumer, WAIT).await.len(), 4);
    let room = room_once_acked(&d, 4).await;
    assert_eq!(room, 4);
    d.dispatch_up_to(room).await.unwrap();
    assert_eq!(s.take_pushes(&consumer, WAIT).await.len(), 4);
    s.cleanup().await;
}

/// The room `d` finds once it reaches `room` or 5 s pass: a pusher's acks reach the server
/// asynchronously, and the room opens as they do.
async fn room_once_acked(d: &tidings_dispatcher::dispatch::Dispatcher, room: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut found = d.room().await;
    while found < room && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        found = d.room().await;
    }
    found
}

/// Ten rows due; a push backlog limit of 10 requests, one a message, claims of 4; readings fresh
/// for a minute, however slow the machine.
async fn room_scenario() -> Scenario {
    let mut s = Scenario::new().await;
    s.settings.push_backlog_limit = 10;
    s.settings.push_reading_fresh = Duration::from_secs(60);
    s.settings.push_batch = 1;
    s.settings.claim_batch = 4;
    for i in 0..10 {
        let w = s.watcher(&format!("SKU-{i}"), BELOW_1200, 1100).await;
        s.ingested(&w, 1100).await;
    }
    s
}

/// The requests for the push stream's info, as NATS carries them.
struct InfoRequests(async_nats::Subscriber);

impl InfoRequests {
    async fn watch(s: &Scenario) -> InfoRequests {
        let nats = tidings_testkit::harness::nats().await.unwrap();
        let subject = format!(
            "$JS.API.STREAM.INFO.{}",
            s.subjects.stream(StreamKind::Push)
        );
        let sub = nats.subscribe(subject).await.unwrap();
        nats.flush().await.unwrap();
        InfoRequests(sub)
    }

    /// How many were made since the last count.
    async fn count(&mut self) -> usize {
        use futures::StreamExt as _;
        let mut n = 0;
        while let Ok(Some(_)) = tokio::time::timeout(WAIT, self.0.next()).await {
            n += 1;
        }
        n
    }
}

/// The dispatch workers of a process share one reading: together they ask NATS as often as one
/// would, and each counts the others' publishes.
#[tokio::test]
async fn dispatch_workers_share_the_push_streams_reading() {
    use tidings_dispatcher::dispatch::PushReadings;
    let s = room_scenario().await;
    let mut asked = InfoRequests::watch(&s).await;
    let readings = std::sync::Arc::new(PushReadings::default());
    let a = s.dispatcher().with_push_readings(readings.clone());
    let b = s.dispatcher().with_push_readings(readings);

    assert_eq!([a.room().await, b.room().await], [4, 4]);
    assert_eq!(a.dispatch_up_to(4).await.unwrap().published, 4);
    // 4 waiting by a's count: room for a claim still.
    assert_eq!(b.room().await, 4);
    assert_eq!(asked.count().await, 1, "b used a's reading");
    assert_eq!(b.dispatch_up_to(4).await.unwrap().published, 4);
    // 8 by both counts: a asks, and NATS agrees.
    assert_eq!(a.room().await, 2);
    assert_eq!(asked.count().await, 1);
    s.cleanup().await;
}

/// The push stream's info costs nats-server ~170 µs a request, and dispatch asked for it every
/// cycle. A reading now stands in for the next ones while it is fresh and, with what this
/// dispatcher has published since, leaves room for a whole claim; otherwise NATS is asked.
#[tokio::test]
async fn a_fresh_reading_of_the_push_stream_spares_asking_while_it_leaves_room() {
    let mut s = room_scenario().await;
    let mut asked = InfoRequests::watch(&s).await;
    let d = s.dispatcher();

    // The first cycle asks; the next ones, with the stream empty, need not.
    let rooms = [d.room().await, d.room().await, d.room().await];
    assert_eq!(rooms, [4, 4, 4]);
    // Published: 4 waiting, by the reading and this dispatcher's count; still room for 4.
    assert_eq!(d.dispatch_up_to(4).await.unwrap().published, 4);
    assert_eq!(d.room().await, 4);
    assert_eq!(asked.count().await, 1, "asked once in four cycles");

    // 8 waiting by its count leave room for 2, less than a claim: NATS is asked, and agrees.
    assert_eq!(d.dispatch_up_to(4).await.unwrap().published, 4);
    assert_eq!(d.room().await, 2);
    assert_eq!(asked.count().await, 1);
    assert_eq!(s.stream_len(StreamKind::Push).await, 8);

    // A pusher takes them; the cycles ask again while the room is short, and see it open.
    let consumer = s.push_consumer().await;
    assert_eq!(s.take_pushes(&consumer, WAIT).await.len(), 8);
    assert_eq!(room_once_acked(&d, 4).await, 4);
    assert!(asked.count().await >= 1);
    // Stale, a reading is asked again even with room for a claim.
    s.settings.push_reading_fresh = Duration::ZERO;
    let d = s.dispatcher();
    assert_eq!([d.room().await, d.room().await], [4, 4]);
    assert_eq!(asked.count().await, 2);
    s.cleanup().await;
}

/// Regression (chaos, after the push stream's reading was kept): a cycle that did not ask NATS
/// claimed rows while the broker was down and published them into the outage, leaving them
/// `sending`, unconfirmed, for the lease to decide. Now nothing is claimed until the connection
/// is back, however fresh the last reading.
#[tokio::test]
async fn while_nats_is_away_dispatch_claims_nothing() {
    let s = room_scenario().await;
    let mut nats = PrivateNats::started().await.unwrap();
    let client = nats.client().await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    tidings_bus::streams::ensure_streams(&js, &s.subjects, &s.streams)
        .await
        .unwrap();
    let d = s.dispatcher_on(js.clone(), s.settings.clone());
    let unlimited = tidings_dispatcher::Settings {
        push_backlog_limit: 0,
        ..s.settings.clone()
    };
    let unlimited = s.dispatcher_on(js, unlimited);
    assert_eq!(d.room().await, 4, "a fresh reading");

    nats.kill();
    connection_becomes(&client, false).await;
    let asked = Instant::now();
    // Without a backlog limit too.
    assert_eq!([d.room().await, unlimited.room().await], [0, 0]);
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "it waited for NATS"
    );
    let pending = s.db.rows_in(&[Status::Pending]).await;
    assert_eq!(pending, 10, "the rows wait, unclaimed");

    nats.restart().await.unwrap();
    connection_becomes(&client, true).await;
    assert_eq!(d.room().await, 4);
    s.cleanup().await;
}

/// Waits up to 10 s for `client` to be connected, or not.
async fn connection_becomes(client: &async_nats::Client, connected: bool) {
    use async_nats::connection::State;
    let started = Instant::now();
    while (client.connection_state() == State::Connected) != connected {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "connected is never {connected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Admission: a claim whose oldest row had waited past the bound closes ingest's gate, and
/// while it is closed the running ingest loop takes nothing; the requests wait in the enqueue
/// stream and are ingested, all of them, once dispatch has caught up.
#[tokio::test]
async fn ingest_waits_while_dispatch_is_behind_and_loses_nothing() {
    use tidings_dispatcher::admission::Admission;
    let s = Scenario::new().await;
    let admission = std::sync::Arc::new(Admission::new(Duration::from_millis(500)));
    let dispatcher = s.dispatcher().with_admission(admission.clone());

    // A row due for 5 s: dispatch is behind.
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    s.ingested(&w, 1100).await;
    // Raw SQL on purpose, a time only: the row became due 5 s ago.
    sqlx::query("UPDATE outbox SET next_attempt_at = now() - interval '5 seconds'")
        .execute(&s.db.pool)
        .await
        .unwrap();
    dispatcher.dispatch_once().await.unwrap();
    assert!(
        !admission.is_open(),
        "a 5 s wait past a 0.5 s bound closes ingest"
    );

    let ingest = s.ingest().await.with_gate(admission.gate());
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(ingest.run(stop.clone()));
    let mut others = Vec::new();
    for i in 0..20 {
        others.push(s.watcher(&format!("SKU-N{i}"), BELOW_1200, 1100).await);
    }
    for w in &others {
        let req = s.detection(w, 1100, Utc::now());
        s.publish_enqueue(&req, &req.dedup_key().to_string()).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        s.db.count("SELECT count(*) FROM outbox").await,
        1,
        "nothing is ingested while the gate is closed"
    );

    // A claim that finds nothing due: caught up, the gate opens and every request comes in.
    dispatcher.dispatch_once().await.unwrap();
    assert!(admission.is_open());
    let started = Instant::now();
    while s.db.count("SELECT count(*) FROM outbox").await < 21 {
        tidings_testkit::harness::poll_wait(started, 10, || {
            "the held requests were not ingested".into()
        })
        .await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    s.cleanup().await;
}

#[tokio::test]
async fn with_push_batches_a_claims_requests_go_batch_by_batch_and_every_row_is_sent() {
    let mut s = Scenario::new().await;
    s.settings.push_batch = 2;
    let mut watchers = Vec::new();
    for item in ["SKU-1", "SKU-2", "SKU-3"] {
        let w = s.watcher(item, BELOW_1200, 1100).await;
        s.ingested(&w, 1100).await;
        watchers.push(w);
    }
    let stats = s.dispatcher().dispatch_once().await.unwrap();
    assert_eq!(
        stats.published, 3,
        "published counts requests, not messages"
    );

    // Two messages: two requests, then one, each named by its first request and its size.
    let messages = s.take_push_messages(&s.push_consumer().await, WAIT).await;
    let sizes: Vec<usize> = messages.iter().map(|(_, r)| r.len()).collect();
    assert_eq!(sizes, [2, 1]);
    for (id, requests) in &messages {
        assert_eq!(id, &format!("{}+{}", requests[0].msg_id(), requests.len()));
    }
    let pushes: Vec<PushRequest> = messages.into_iter().flat_map(|(_, r)| r).collect();
    let mut rows = HashSet::new();
    for w in &watchers {
        let of_watch = s.rows(w.watch).await;
        assert_eq!(of_watch.len(), 1);
        assert_eq!(of_watch[0].notification.status, Status::Sending);
        rows.insert(of_watch[0].notification.id);
    }
    let requested: HashSet<_> = pushes.iter().map(|p| p.outbox_id).collect();
    assert_eq!(requested, rows, "one request per row");

    // Their results end every row `sent`, as with one request a message.
    let results: Vec<PushResult> = pushes
        .iter()
        .map(|p| s.result(p, Outcome::Delivered, Some(201)))
        .collect();
    s.publish_results(&results).await;
    assert_eq!(s.results().await.run_once(WAIT).await.unwrap().applied, 3);
    for p in &pushes {
        assert_eq!(s.row(p.outbox_id).await.notification.status, Status::Sent);
    }
    s.cleanup().await;
}

/// Regression for a claim that waited for the next poll: the ingest beside the dispatch loops
/// wakes one when it commits new rows. The poll interval is a minute here, so only the wake
/// can dispatch the row within the bound.
#[tokio::test]
async fn an_ingested_row_is_claimed_at_once_not_at_the_next_poll() {
    let mut s = Scenario::new().await;
    s.settings.poll_interval = Duration::from_secs(60);
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let dispatcher = running(&s, &stop);
    // The ingest's consumer is made before the loops start; once it is there, give the dispatch
    // loops time for their first (empty) round, so they are asleep when the row comes.
    let stream = s.subjects.stream(StreamKind::Enqueue);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s
        .js
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            tidings_dispatcher::ingest::CONSUMER,
            &stream,
        )
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the dispatcher did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let req = s.detection(&w, 1100, Utc::now());
    let published = Instant::now();
    s.publish_enqueue(&req, &req.dedup_key().to_string()).await;
    while s.push_requests_stored().await == 0 {
        assert!(
            published.elapsed() < Duration::from_secs(10),
            "the row waited for the next poll"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = &s.rows(w.watch).await[0];
    assert_eq!(row.notification.status, Status::Sending);
    stop.cancel();
    dispatcher.await.unwrap().unwrap();
    s.cleanup().await;
}

/// The whole dispatcher (every loop) on `s`'s world, until `stop`.
fn running(
    s: &Scenario,
    stop: &tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Result<(), tidings_dispatcher::StartError>> {
    tokio::spawn(tidings_dispatcher::run_with(
        s.db.pool.clone(),
        s.js.clone(),
        s.settings.clone(),
        stop.clone(),
    ))
}

/// Regression for a dispatch loop that waited a whole poll behind a full push stream: the
/// stream drains without waking it, and admission may have stopped the ingest that would. The
/// poll is a minute here; the loop must resume within its backlog pause once there is room.
#[tokio::test]
async fn a_full_push_stream_is_looked_at_again_soon_not_at_the_next_poll() {
    let mut s = Scenario::new().await;
    s.settings.poll_interval = Duration::from_secs(60);
    s.settings.push_backlog_limit = 2;
    s.settings.push_batch = 1;
    // One loop, so the room it reads is the room it fills.
    s.settings.dispatch_workers = 1;
    seed_rows(&s, "SKU-1", 3).await;
    let consumer = s.push_consumer().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let dispatcher = running(&s, &stop);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.stream_len(StreamKind::Push).await < 2 {
        assert!(
            Instant::now() < deadline,
            "the first two were not dispatched"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.db.rows_in(&[Status::Pending]).await, 1, "the third waits");

    // The pusher takes the two; the third must follow without a poll.
    let mut taken = s.take_pushes(&consumer, WAIT).await.len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while taken < 3 {
        assert!(
            Instant::now() < deadline,
            "dispatch waited for the next poll"
        );
        taken += s
            .take_pushes(&consumer, Duration::from_millis(100))
            .await
            .len();
    }
    assert_eq!(taken, 3);
    stop.cancel();
    dispatcher.await.unwrap().unwrap();
    s.cleanup().await;
}
