//! The JetStream side of the foundation: per-test prefixes and the enqueue stream's dedup window.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use async_nats::jetstream;
use std::time::Duration;
use tidings_bus::streams::{StreamSettings, ensure_streams};
use tidings_domain::Channel;
use tidings_domain::subjects::StreamKind;
use tidings_testkit::harness::{delete_streams, nats, stream_len, test_subjects};

#[tokio::test]
async fn the_enqueue_stream_drops_a_republished_dedup_key() {
    let js = jetstream::new(nats().await.unwrap());
    let subjects = test_subjects();
    ensure_streams(&js, &subjects, &StreamSettings::default())
        .await
        .unwrap();
    // Idempotent: a second service starting up changes nothing.
    ensure_streams(&js, &subjects, &StreamSettings::default())
        .await
        .unwrap();

    let subject = subjects.subject(StreamKind::Enqueue, Channel::WebPush);
    let publish = |id: &'static str| {
        let js = js.clone();
        let subject = subject.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id);
            js.publish_with_headers(subject, headers, "{}".into())
                .await
                .unwrap()
                .await
                .unwrap()
        }
    };
    assert!(
        !publish("w:price_below:1200:2026-11-30:web_push")
            .await
            .duplicate
    );
    assert!(
        publish("w:price_below:1200:2026-11-30:web_push")
            .await
            .duplicate
    );
    assert!(
        !publish("w:price_below:1200:2026-12-01:web_push")
            .await
            .duplicate
    );

    assert_eq!(stream_len(&js, &subjects, StreamKind::Enqueue).await, 2);
    delete_streams(&js, &subjects).await;
}

/// The duplicate window follows the setting, also on a stream an earlier release made with
/// another (2 h before): the streams' other settings stay as they were made.
#[tokio::test]
async fn an_existing_enqueue_stream_takes_the_configured_duplicate_window() {
    let js = jetstream::new(nats().await.unwrap());
    let subjects = test_subjects();
    let old = StreamSettings {
        duplicate_window: Duration::from_secs(2 * 60 * 60),
        ..StreamSettings::default()
    };
    ensure_streams(&js, &subjects, &old).await.unwrap();
    let window = |js: jetstream::Context, name: String| async move {
        js.get_stream(name)
            .await
            .unwrap()
            .cached_info()
            .config
            .duplicate_window
    };
    let enqueue = subjects.stream(StreamKind::Enqueue);
    assert_eq!(
        window(js.clone(), enqueue.clone()).await,
        old.duplicate_window
    );
    let now = StreamSettings::default();
    assert_eq!(now.duplicate_window, Duration::from_secs(15 * 60));
    ensure_streams(&js, &subjects, &now).await.unwrap();
    assert_eq!(window(js.clone(), enqueue).await, now.duplicate_window);
    delete_streams(&js, &subjects).await;
}

#[tokio::test]
async fn two_prefixes_do_not_see_each_other() {
    let js = jetstream::new(nats().await.unwrap());
    let (a, b) = (test_subjects(), test_subjects());
    assert_ne!(a, b);
    for s in [&a, &b] {
        ensure_streams(&js, s, &StreamSettings::default())
            .await
            .unwrap();
    }
    js.publish(a.subject(StreamKind::Push, Channel::WebPush), "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(stream_len(&js, &a, StreamKind::Push).await, 1);
    assert_eq!(stream_len(&js, &b, StreamKind::Push).await, 0);
    for s in [&a, &b] {
        delete_streams(&js, s).await;
    }
}

/// Regression: publishing more messages than the client's cap on acks in flight must finish
/// (awaiting acks only after queueing every publish deadlocked the dispatcher benchmark).
#[tokio::test]
async fn pipelined_publishing_never_waits_on_itself() {
    use tidings_bus::publish::{Outgoing, publish_all};
    let client = nats().await.unwrap();
    let js = jetstream::ContextBuilder::new()
        .max_ack_inflight(10)
        .build(client);
    let subjects = test_subjects();
    ensure_streams(&js, &subjects, &StreamSettings::default())
        .await
        .unwrap();
    let subject = subjects.subject(StreamKind::Push, Channel::WebPush);
    let outgoing: Vec<Outgoing> = (0..200)
        .map(|i| Outgoing::deduplicated(subject.as_str(), &format!("m{i}"), b"{}".to_vec()))
        .collect();
    let acks = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        publish_all(&js, outgoing, 64),
    )
    .await
    .expect("publish_all finished");
    assert_eq!(acks.iter().filter(|a| a.is_ok()).count(), 200);
    assert_eq!(stream_len(&js, &subjects, StreamKind::Push).await, 200);
    delete_streams(&js, &subjects).await;
}

/// `TIDINGS_PUSH_STORAGE=memory` puts the push and result streams in memory, whose loss the lease
/// sweeper recovers; the enqueue stream and the dead letters stay on file whatever it says.
#[tokio::test]
async fn push_storage_moves_only_the_push_and_result_streams() {
    use async_nats::jetstream::stream::StorageType;
    use clap::Parser;
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        nats: tidings_bus::NatsArgs,
    }
    let flags = Flags::try_parse_from(["test", "--push-storage", "memory"]).unwrap();
    let settings = flags.nats.streams();
    let js = jetstream::new(nats().await.unwrap());
    let subjects = test_subjects();
    ensure_streams(&js, &subjects, &settings).await.unwrap();
    for (kind, want) in [
        (StreamKind::Push, StorageType::Memory),
        (StreamKind::Result, StorageType::Memory),
        (StreamKind::Enqueue, StorageType::File),
        (StreamKind::Dlq, StorageType::File),
    ] {
        let got = js
            .get_stream(subjects.stream(kind))
            .await
            .unwrap()
            .cached_info()
            .config
            .storage;
        assert_eq!(got, want, "{kind:?}");
    }
    // The default is file for every stream.
    let default = Flags::try_parse_from(["test"]).unwrap().nats.streams();
    assert_eq!(
        default.push_storage,
        tidings_bus::streams::PushStorage::File
    );
    delete_streams(&js, &subjects).await;
}

/// Purging a dead letter that is not there answers "not there" (by JetStream's error code, not
/// its text), and one that is there is deleted.
#[tokio::test]
async fn purging_a_dead_letter_that_is_gone_says_so() {
    let js = jetstream::new(nats().await.unwrap());
    let subjects = test_subjects();
    ensure_streams(&js, &subjects, &StreamSettings::default())
        .await
        .unwrap();
    let ack = js
        .publish(
            subjects.subject(StreamKind::Dlq, Channel::WebPush),
            "{}".into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let letters = tidings_bus::dead_letters::DeadLetters::new(js.clone(), subjects.clone());
    assert!(letters.purge(ack.sequence).await.unwrap());
    assert!(!letters.purge(ack.sequence).await.unwrap());
    assert!(!letters.purge(ack.sequence + 1000).await.unwrap());
    delete_streams(&js, &subjects).await;
}

/// A NATS failure reaches the caller as the error NATS gave, kinds and all, not as its text: a
/// log prints the chain, and code that must tell failures apart can.
#[tokio::test]
async fn a_delivery_log_that_cannot_open_keeps_the_nats_error_as_its_cause() {
    use async_nats::jetstream::context::{KeyValueError, KeyValueErrorKind};
    use std::error::Error as _;
    let js = jetstream::new(nats().await.unwrap());
    let subjects = test_subjects();
    // Not a creating log, and no dispatcher made the bucket: opening it fails.
    let log = tidings_bus::delivered::DeliveryLog::new(js, &subjects, &StreamSettings::default());
    let e = log.open().await.err().unwrap();
    let cause = e.source().and_then(|s| s.downcast_ref::<KeyValueError>());
    assert!(
        cause.is_some_and(|c| c.kind() == KeyValueErrorKind::GetBucket),
        "{e:?}"
    );
    let told = tidings_runtime::telemetry::with_causes(&e);
    assert!(
        told.starts_with(&format!("delivery log {}: open bucket: ", log.bucket())),
        "{told}"
    );
    assert_eq!(
        told.matches(&cause.unwrap().to_string()).count(),
        1,
        "{told}"
    );
}
