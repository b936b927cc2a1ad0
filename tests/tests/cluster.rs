//! Tidings on a three-node JetStream cluster, as production runs it: streams replicated three
//! times, the services given every node in `NATS_URL`, a node killed with SIGKILL during a burst,
//! a stream leader moved while ingest runs.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use async_nats::jetstream;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tidings_bus::consume::Handler as _;
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_bus::streams::ensure_streams;
use tidings_domain::Channel;
use tidings_domain::outbox::Status;
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_tests::brokers::{NatsCluster, free_port};
use tidings_tests::fake_push::FakePushService;
use tidings_tests::fixtures;
use tidings_tests::harness::poll_wait;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;
use tokio_util::sync::CancellationToken;

const KINDS: [StreamKind; 4] = [
    StreamKind::Enqueue,
    StreamKind::Push,
    StreamKind::Result,
    StreamKind::Dlq,
];

async fn stream_info(js: &jetstream::Context, stream: &str) -> jetstream::stream::Info {
    js.get_stream(stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone()
}

/// The server name of a stream's leader, once the stream has one and both followers are
/// current.
async fn leader(js: &jetstream::Context, stream: &str) -> String {
    let started = Instant::now();
    loop {
        let cluster = stream_info(js, stream).await.cluster.unwrap();
        if let Some(leader) = cluster.leader
            && cluster.replicas.len() == 2
            && cluster.replicas.iter().all(|r| r.current)
        {
            return leader;
        }
        poll_wait(started, 30, || {
            format!("{stream}: no leader with two current replicas")
        })
        .await;
    }
}

#[tokio::test]
async fn a_node_killed_mid_burst_loses_no_notification_and_repeats_none_unmarked() {
    const N: i64 = 600;
    let mut cluster = NatsCluster::started().await.unwrap();
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let url = cluster.url();
    // Short leases, so a push whose fate the node took with it is settled within the test.
    let p = Pipeline::start(
        &s,
        &[
            ("NATS_URL", &url),
            ("TIDINGS_STREAM_REPLICAS", "3"),
            ("TIDINGS_SCAN_INTERVAL", "1s"),
            ("TIDINGS_PUSH_DEADLINE", "2s"),
            ("TIDINGS_PUSH_HTTP_TIMEOUT", "2s"),
            ("TIDINGS_RESULT_ACK_WAIT", "3s"),
            ("TIDINGS_SENDING_LEASE", "15s"),
            ("TIDINGS_SWEEP_INTERVAL", "1s"),
        ],
    )
    .await;

    let js = jetstream::new(cluster.client().await.unwrap());
    for kind in KINDS {
        let name = s.subjects.stream(kind);
        assert_eq!(
            stream_info(&js, &name).await.config.num_replicas,
            3,
            "{name}"
        );
        leader(&js, &name).await;
    }

    fixtures::crowd(&s.db.pool, "SKU-1", &sub, usize::try_from(N).unwrap())
        .await
        .unwrap();
    s.catalog.set_price("SKU-1", 1000);

    // Mid-burst, kill the node that leads the push stream (every push request goes through it).
    let sent = [Status::Sent];
    let started = Instant::now();
    while s.db.rows_in(&sent).await < 30 {
        poll_wait(started, 60, || {
            format!("nothing sent:\n{}", p.log("dispatcher"))
        })
        .await;
    }
    let victim = leader(&js, &s.subjects.stream(StreamKind::Push)).await;
    cluster.node(&victim).unwrap().kill();
    let sent_at_kill = s.db.rows_in(&sent).await;
    eprintln!("killed {victim} with {sent_at_kill} of {N} sent");
    assert!(
        sent_at_kill < N,
        "the burst was over; the test proves nothing"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.node(&victim).unwrap().start().await.unwrap();

    let terminal = [Status::Sent, Status::Dropped, Status::Failed];
    let started = Instant::now();
    while s.db.rows_in(&terminal).await < N {
        poll_wait(started, 120, || {
            format!(
                "not every row terminal:\ndispatcher:\n{}\npusher:\n{}",
                p.log("dispatcher"),
                p.log("pusher")
            )
        })
        .await;
    }
    assert_eq!(
        s.db.count("SELECT count(*) FROM outbox").await,
        N,
        "one row per watch"
    );
    assert_eq!(s.db.rows_in(&sent).await, N, "every notification sent");

    // Deliveries per row, by the notification's id.
    let mut deliveries: HashMap<String, usize> = HashMap::new();
    for r in push.received() {
        *deliveries
            .entry(r.notification_id().unwrap_or_default())
            .or_default() += 1;
    }
    let rows: Vec<(uuid::Uuid, bool)> = sqlx::query_as("SELECT id, maybe_delivered FROM outbox")
        .fetch_all(&s.db.pool)
        .await
        .unwrap();
    let lost: Vec<_> = rows
        .iter()
        .filter(|(id, _)| !deliveries.contains_key(&id.to_string()))
        .collect();
    assert!(lost.is_empty(), "sent but never delivered: {lost:?}");
    // A second delivery is allowed only where the row says it may have happened (an attempt
    // whose outcome the killed node took with it); any other is a duplicate.
    let repeated_unmarked: Vec<_> = rows
        .iter()
        .filter(|(id, marked)| deliveries[&id.to_string()] > 1 && !marked)
        .collect();
    assert!(
        repeated_unmarked.is_empty(),
        "delivered twice without the maybe-delivered mark: {repeated_unmarked:?}"
    );
    assert_eq!(
        deliveries.len(),
        rows.len(),
        "no delivery of an unknown row"
    );
    let repeats: usize = deliveries.values().map(|n| n - 1).sum();
    eprintln!("deliveries beyond one per row (each row marked maybe-delivered): {repeats}");
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_stream_leader_change_during_ingest_loses_nothing() {
    const N: usize = 3000;
    let cluster = NatsCluster::started().await.unwrap();
    let mut s = Scenario::new().await;
    let js = jetstream::new(cluster.client().await.unwrap());
    s.js = js.clone();
    s.settings.streams.replicas = 3;
    ensure_streams(&js, &s.subjects, &s.settings.streams)
        .await
        .unwrap();

    let w = s
        .watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    let subject = s.subjects.subject(StreamKind::Enqueue, Channel::WebPush);
    let now = chrono::Utc::now();
    let outgoing = |requests: &[usize]| -> Vec<Outgoing> {
        requests
            .iter()
            .map(|&i| w.numbered_request(&subject, i, now))
            .collect()
    };

    let stop = CancellationToken::new();
    let ingest = tokio::spawn(s.ingest().await.run(stop.clone()));
    let stream = s.subjects.stream(StreamKind::Enqueue);
    let before = leader(&js, &stream).await;
    // Publish in chunks; move the leader after the first third. A publish the step-down left
    // unconfirmed is published again with the same message id, as the detector does; the
    // duplicate window and the outbox's key make that safe.
    for (chunk, range) in [(0..N / 3), (N / 3..2 * N / 3), (2 * N / 3..N)]
        .into_iter()
        .enumerate()
    {
        if chunk == 1 {
            let answer = cluster
                .client()
                .await
                .unwrap()
                .request(
                    format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                    "".into(),
                )
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&answer.payload).into_owned();
            assert!(text.contains("\"success\":true"), "step-down: {text}");
        }
        let mut pending: Vec<usize> = range.collect();
        let started = Instant::now();
        while !pending.is_empty() {
            let acks = publish_all(&js, outgoing(&pending), 256).await;
            pending = pending
                .into_iter()
                .zip(acks)
                .filter_map(|(i, ack)| ack.is_err().then_some(i))
                .collect();
            if !pending.is_empty() {
                poll_wait(started, 30, || {
                    format!("{} publishes never confirmed", pending.len())
                })
                .await;
            }
        }
    }
    let after = leader(&js, &stream).await;
    assert_ne!(before, after, "the stream's leader moved");

    let started = Instant::now();
    while s.db.count("SELECT count(*) FROM outbox").await < N as i64 {
        poll_wait(started, 60, || "not every enqueue request ingested".into()).await;
    }
    stop.cancel();
    ingest.await.unwrap().unwrap();
    // The outbox's unique key holds each request once, so N rows are all N requests.
    assert_eq!(s.db.count("SELECT count(*) FROM outbox").await, N as i64);
    s.cleanup().await;
}

/// Regression: a node whose route port another process took between the harness choosing it and
/// the node binding it reports healthy, then exits; the two left elect a leader but can place no
/// stream of three replicas, and the services waited in vain for their streams. Such a start now
/// fails at once, naming the exit and the node's log, so the harness can start the cluster again.
#[tokio::test]
async fn a_cluster_node_that_loses_its_port_fails_the_start_at_once_with_its_log() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let started = Instant::now();
    let ports = [port, free_port().unwrap(), free_port().unwrap()];
    let Err(error) = NatsCluster::try_start(None, ports).await else {
        panic!("a cluster formed with a node's route port taken");
    };
    let text = error.to_string();
    assert!(text.contains("exited"), "{text}");
    assert!(text.contains("address already in use"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the failure took {:?}",
        started.elapsed()
    );
    drop(taken);
}
