//! The pusher against real NATS and the fake HTTPS push service, which decrypts every body with
//! an independent RFC 8291 implementation and verifies the VAPID JWT.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use async_nats::jetstream::AckKind;
use async_nats::jetstream::{self, consumer::PullConsumer, consumer::pull};
use chrono::{Duration as ChronoDuration, Utc};
use futures::StreamExt;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tidings_bus::consume::{self, Handler as _};
use tidings_bus::streams::{StreamSettings, ensure_streams};
use tidings_domain::messages::{
    Ended, Outcome, PushRequest, PushRequests, PushResult, Subscription, decode_results,
};
use tidings_domain::outbox::FailReason;
use tidings_domain::subjects::{StreamKind, Subjects};
use tidings_domain::{Channel, OutboxId};
use tidings_pusher::Settings;
use tidings_pusher::report::{BATCH, ReportError, Reporter};
use tidings_pusher::worker::{Handled, Pusher};
use tidings_testkit::fake_push::{Answer, FakePushService, NAMED_HOSTS};
use tidings_testkit::fixtures;
use tidings_testkit::harness::{delete_streams, nats, test_subjects};

#[path = "support/pushers.rs"]
mod pushers;
use pushers::pusher_settings;
use tidings_endpoint_guard::EndpointPolicy;

const WAIT: Duration = Duration::from_millis(300);

struct World {
    js: jetstream::Context,
    subjects: Subjects,
    push: FakePushService,
    settings: Settings,
    results: PullConsumer,
}

impl World {
    async fn new() -> Self {
        let js = jetstream::new(nats().await.unwrap());
        let subjects = test_subjects();
        ensure_streams(&js, &subjects, &StreamSettings::default())
            .await
            .unwrap();
        let push = FakePushService::start().await.unwrap();
        let settings = pusher_settings(subjects.clone());
        let results = js
            .get_stream(subjects.stream(StreamKind::Result))
            .await
            .unwrap()
            .get_or_create_consumer(
                "test-dispatcher",
                pull::Config {
                    durable_name: Some("test-dispatcher".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        World {
            js,
            subjects,
            push,
            settings,
            results,
        }
    }

    /// A world and a pusher on it with the default test settings.
    async fn with_pusher() -> (Self, Pusher) {
        let w = World::new().await;
        let pusher = w.pusher().await;
        (w, pusher)
    }

    async fn pusher(&self) -> Pusher {
        Pusher::new(self.js.clone(), self.settings.clone())
            .await
            .unwrap()
    }

    fn request(&self, sub: &Subscription) -> PushRequest {
        fixtures::push_request(sub)
    }

    /// A request whose deadline (its re-check plus the freshness bound) passed a second ago.
    fn expired_request(&self, sub: &Subscription) -> PushRequest {
        PushRequest {
            deadline: Utc::now() - ChronoDuration::seconds(1),
            ..self.request(sub)
        }
    }

    async fn publish(&self, req: &impl tidings_domain::messages::Message, msg_id: &str) {
        fixtures::publish_push(&self.js, &self.subjects, req, msg_id).await;
    }

    /// Every PushResult available now.
    async fn results(&self) -> Vec<PushResult> {
        self.result_messages().await.into_iter().flatten().collect()
    }

    /// Every message on the result stream available now (acked), as the results each carries.
    async fn result_messages(&self) -> Vec<Vec<PushResult>> {
        let mut out = Vec::new();
        let mut batch = self
            .results
            .fetch()
            .max_messages(10_000)
            .expires(WAIT)
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            m.ack().await.unwrap();
            out.push(decode_results(&m.payload).unwrap());
        }
        out
    }

    /// Publishes one request for `sub`, lets the pusher handle it, returns its result.
    async fn push_one(&self, pusher: &Pusher, req: &PushRequest) -> PushResult {
        self.publish(req, &req.msg_id()).await;
        let handled = pushers::handle_available(pusher, WAIT).await;
        assert_eq!(handled.len(), 1, "{handled:?}");
        let mut results = self.results().await;
        assert_eq!(results.len(), 1);
        results.remove(0)
    }

    async fn cleanup(&self) {
        delete_streams(&self.js, &self.subjects).await;
        let _ = self
            .js
            .delete_key_value(self.subjects.bucket("delivered"))
            .await;
    }
}

#[tokio::test]
async fn the_push_service_decrypts_exactly_the_body_with_a_valid_vapid_token() {
    let (w, pusher) = World::with_pusher().await;
    let sub = w.push.subscription();
    let req = w.request(&sub);

    let result = w.push_one(&pusher, &req).await;
    assert_eq!(
        (result.outcome(), result.http_status),
        (Outcome::Delivered, Some(201))
    );
    assert!(
        result.ended.message_id().unwrap().contains("/m/"),
        "Location kept"
    );

    let got = w.push.received_by(&sub);
    assert_eq!(got.len(), 1, "rejected: {:?}", w.push.rejected());
    assert_eq!(got[0].plaintext, serde_json::to_vec(&req.payload).unwrap());
    assert_eq!(
        got[0].json()["body"],
        "Now 10.50 EUR (your limit: 12.00 EUR)."
    );
    // The request allows an hour; what is left of the notification's twenty minutes wins.
    let ttl: u32 = got[0].ttl.as_deref().unwrap().parse().unwrap();
    assert!((1190..=1200).contains(&ttl), "TTL {ttl}");
    assert_eq!(got[0].urgency.as_deref(), Some("high"));
    assert_eq!(got[0].topic.as_deref(), Some(req.topic.as_str()));
    assert_eq!(
        got[0].vapid_claims["aud"],
        format!("https://127.0.0.1:{}", w.push.addr.port())
    );
    assert_eq!(got[0].vapid_public_key, w.settings.vapid.public_key());
    w.cleanup().await;
}

#[tokio::test]
async fn an_endpoint_by_host_name_is_signed_for_that_origin_and_delivered() {
    let mut w = World::new().await;
    w.settings.policy.allowed_hosts = NAMED_HOSTS.split(',').map(str::to_owned).collect();
    let pusher = w.pusher().await;
    let sub = w.push.named_subscription();
    for _ in 0..3 {
        let req = w.request(&sub);
        let result = w.push_one(&pusher, &req).await;
        assert_eq!(result.outcome(), Outcome::Delivered, "{result:?}");
    }
    let got = w.push.received_by(&sub);
    assert_eq!(got.len(), 3, "rejected: {:?}", w.push.rejected());
    let origin = format!("https://localhost:{}", w.push.addr.port());
    assert!(got.iter().all(|g| g.vapid_claims["aud"] == origin.as_str()));
    w.cleanup().await;
}

#[tokio::test]
async fn each_answer_of_the_push_service_becomes_the_right_outcome() {
    let (w, pusher) = World::with_pusher().await;
    let cases = [
        (Answer::NotFound, Outcome::Gone, Some(404), None),
        (Answer::Gone, Outcome::Gone, Some(410), None),
        (Answer::TooLarge, Outcome::Permanent, Some(413), None),
        (Answer::Unauthorized, Outcome::Permanent, Some(401), None),
        (Answer::ServerError, Outcome::Transient, Some(500), None),
        (
            Answer::TooManyRequests {
                retry_after: "120".into(),
            },
            Outcome::Transient,
            Some(429),
            Some(120),
        ),
    ];
    for (answer, outcome, status, retry_after) in cases {
        let sub = w.push.subscription();
        w.push.answer_always(&sub, answer.clone());
        let r = w.push_one(&pusher, &w.request(&sub)).await;
        assert_eq!(
            (r.outcome(), r.http_status, r.ended.retry_after()),
            (outcome, status, retry_after),
            "{answer:?}"
        );
        if outcome != Outcome::Delivered {
            assert!(r.error.is_some(), "{answer:?} carries an error text");
        }
    }
    w.cleanup().await;
}

#[tokio::test]
async fn a_hung_endpoint_is_transient_after_the_timeout() {
    let (w, pusher) = World::with_pusher().await;
    let sub = w.push.subscription();
    w.push.answer_always(&sub, Answer::Hang);
    let started = Instant::now();
    let r = w.push_one(&pusher, &w.request(&sub)).await;
    assert_eq!(r.outcome(), Outcome::Transient);
    assert!(
        r.error.as_deref().unwrap().starts_with("timeout"),
        "{:?}",
        r.error
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    w.cleanup().await;
}

/// Regression: the error text carried the whole URL, so a token in its path or query landed in
/// attempts and logs.
#[tokio::test]
async fn a_transport_error_names_no_path_or_query_of_the_endpoint() {
    let (w, pusher) = World::with_pusher().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut sub = w.push.subscription();
    sub.endpoint = format!("https://127.0.0.1:{port}/push/tok_s3cret?auth=hunter2");
    let r = w.push_one(&pusher, &w.request(&sub)).await;
    assert_eq!(r.outcome(), Outcome::Transient);
    let error = r.error.unwrap();
    assert!(error.starts_with("connect"), "{error}");
    assert!(
        !error.contains("tok_s3cret") && !error.contains("hunter2"),
        "{error}"
    );
    w.cleanup().await;
}

#[tokio::test]
async fn a_request_past_its_deadline_is_never_sent() {
    let (w, pusher) = World::with_pusher().await;
    let r = w
        .push_one(&pusher, &w.expired_request(&w.push.subscription()))
        .await;
    assert_eq!(r.outcome(), Outcome::Expired);
    assert!(
        !r.ended.maybe_delivered(),
        "a first delivery: nothing was sent before"
    );
    assert_eq!(w.push.hits(), 0, "no request reached the push service");
    w.cleanup().await;
}

#[tokio::test]
async fn a_request_whose_validity_ran_out_is_not_sent_and_says_so() {
    let (w, pusher) = World::with_pusher().await;
    let mut req = w.request(&w.push.subscription());
    req.payload.valid_until = Some(Utc::now() - ChronoDuration::milliseconds(10));
    let r = w.push_one(&pusher, &req).await;
    let outlived = Ended::Expired {
        outlived: true,
        maybe_delivered: false,
    };
    assert_eq!(r.ended, outlived);
    assert!(
        r.error.as_deref().unwrap().contains("validity ran out"),
        "{:?}",
        r.error
    );
    assert_eq!(w.push.hits(), 0, "no request reached the push service");
    // Past its deadline but still current: expired as before, to be retried.
    let r = w
        .push_one(&pusher, &w.expired_request(&w.push.subscription()))
        .await;
    assert_eq!(r.ended, Ended::of(Outcome::Expired));
    w.cleanup().await;
}

/// A withdrawal first asks the push service to delete the message it withdraws (RFC 8030): one
/// still waiting for its device is deleted and the withdrawal is not sent; one already
/// delivered is not, and the withdrawal goes out; a resource of another origin is never asked.
#[tokio::test]
async fn a_withdrawal_deletes_its_undelivered_original_or_else_is_sent() {
    let (w, pusher) = World::with_pusher().await;
    let sub = w.push.subscription();
    w.push.set_offline(&sub, true);
    let original = w.push_one(&pusher, &w.request(&sub)).await;
    assert_eq!(original.outcome(), Outcome::Delivered);
    let location = original.ended.message_id().unwrap().to_owned();
    assert_eq!(w.push.waiting().len(), 1);
    let withdrawal = |recall: &str| PushRequest {
        recall: Some(recall.to_owned()),
        ..w.request(&sub)
    };

    let r = w.push_one(&pusher, &withdrawal(&location)).await;
    assert_eq!((r.outcome(), r.http_status), (Outcome::Recalled, Some(204)));
    assert!(!r.ended.maybe_delivered());
    assert!(w.push.waiting().is_empty(), "deleted at the push service");
    assert_eq!(w.push.deleted().len(), 1);
    w.push.set_offline(&sub, false);
    assert!(w.push.received().is_empty(), "the device never gets either");

    // Delivered already: the push service answers 404 and the withdrawal is sent.
    let shown = w.push_one(&pusher, &w.request(&sub)).await;
    let location = shown.ended.message_id().unwrap().to_owned();
    let r = w.push_one(&pusher, &withdrawal(&location)).await;
    assert_eq!(r.outcome(), Outcome::Delivered);
    assert_eq!(w.push.received().len(), 2);

    // Another origin is not the push service's resource: not asked, the withdrawal is sent.
    let hits = w.push.hits();
    let r = w
        .push_one(&pusher, &withdrawal("https://elsewhere.example/m/1"))
        .await;
    assert_eq!(r.outcome(), Outcome::Delivered);
    assert_eq!(w.push.hits(), hits + 1, "one push, no DELETE");
    assert!(w.push.rejected().is_empty(), "{:?}", w.push.rejected());
    w.cleanup().await;
}

#[tokio::test]
async fn a_push_without_a_ttl_topic_or_urgency_is_refused_by_the_fake_as_by_a_real_service() {
    let push = tidings_testkit::fake_push::FakePushService::start()
        .await
        .unwrap();
    let sub = push.subscription();
    let client = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(tidings_testkit::fake_push::CERT_PEM).unwrap(),
        )
        .build()
        .unwrap();
    for (ttl, urgency, topic) in [
        (None, Some("high"), Some("t")),
        (Some("soon"), Some("high"), Some("t")),
        (Some("60"), None, Some("t")),
        (Some("60"), Some("urgent"), Some("t")),
        (Some("60"), Some("high"), None),
        (Some("60"), Some("high"), Some("a/b")),
        (
            Some("60"),
            Some("high"),
            Some("0123456789abcdef0123456789abcdef0"),
        ),
    ] {
        let mut r = client.post(&sub.endpoint).body("x");
        for (name, value) in [("ttl", ttl), ("urgency", urgency), ("topic", topic)] {
            if let Some(v) = value {
                r = r.header(name, v);
            }
        }
        let status = r.send().await.unwrap().status();
        assert_eq!(status, 400, "{ttl:?} {urgency:?} {topic:?}");
    }
    assert_eq!(push.rejected().len(), 7);
    assert!(
        push.rejected().iter().all(|e| e.contains("headers")),
        "{:?}",
        push.rejected()
    );
    assert!(push.received().is_empty());
}

/// Regression (found by the CI chaos run): a pusher killed after the push service accepted a
/// request and before recording it leaves the request to be redelivered past its deadline; the
/// `expired` result of that redelivery must say the push may have arrived, or the row is taken
/// for not delivered.
#[tokio::test]
async fn a_redelivery_answered_gone_may_have_been_delivered() {
    let (w, pusher) = World::with_pusher().await;
    let sub = w.push.subscription();
    // Another pusher took the request and died holding it, maybe after the push service took
    // it; the subscription is gone when it comes round again.
    let held = w.request(&sub);
    w.publish(&held, &held.msg_id()).await;
    let consumer = pushers::pusher_consumer(&w.js, &w.subjects).await;
    let taken = consume::fetch(&consumer, 1, WAIT).await.unwrap();
    assert_eq!(taken.len(), 1);
    taken[0].ack_with(AckKind::Nak(None)).await.unwrap();
    w.push.answer_next(&sub, &[Answer::Gone]);
    assert_eq!(
        pushers::handle_available(&pusher, WAIT).await,
        [Handled::Reported(Outcome::Gone)]
    );
    let results = w.results().await;
    assert_eq!(results.len(), 1);
    assert!(results[0].ended.maybe_delivered(), "{:?}", results[0]);
    w.cleanup().await;
}

#[tokio::test]
async fn a_redelivery_past_its_deadline_may_have_been_delivered() {
    let (w, pusher) = World::with_pusher().await;
    // Another pusher took the request and died holding it (a NAK stands in for its ack wait).
    let held = w.expired_request(&w.push.subscription());
    w.publish(&held, &held.msg_id()).await;
    let consumer = pushers::pusher_consumer(&w.js, &w.subjects).await;
    let taken = consume::fetch(&consumer, 1, WAIT).await.unwrap();
    assert_eq!(taken.len(), 1);
    taken[0].ack_with(AckKind::Nak(None)).await.unwrap();
    assert_eq!(
        pushers::handle_available(&pusher, WAIT).await,
        [Handled::Reported(Outcome::Expired)]
    );
    let results = w.results().await;
    assert_eq!(results.len(), 1);
    assert!(results[0].ended.maybe_delivered(), "{:?}", results[0]);
    assert_eq!(w.push.hits(), 0, "nothing was sent past its deadline");
    w.cleanup().await;
}

#[tokio::test]
async fn endpoints_that_fail_the_guard_are_refused_without_a_connection() {
    let mut w = World::new().await;
    // Production policy, plus "localhost" on the allowlist: it resolves to 127.0.0.1.
    w.settings.policy = EndpointPolicy::default();
    w.settings.policy.allowed_hosts.push("localhost:*".into());
    let pusher = w.pusher().await;
    let port = w.push.addr.port();
    let good = w.push.subscription();
    for endpoint in [
        "http://fcm.googleapis.com/fcm/send/x".to_owned(),
        "https://10.0.0.1/push/x".to_owned(),
        "https://169.254.169.254/latest/meta-data".to_owned(),
        "https://evil.example/push/x".to_owned(),
        format!("https://localhost:{port}/push/x"),
        format!("https://127.0.0.1:{port}/push/x"),
        // 127.0.0.1 and 10.0.0.5 behind NAT64, 6to4 and IPv4-compatible forms (regression:
        // judged as public IPv6).
        format!("https://[64:ff9b::7f00:1]:{port}/push/x"),
        format!("https://[2002:7f00:1::1]:{port}/push/x"),
        "https://[::a00:5]/push/x".to_owned(),
    ] {
        let sub = Subscription {
            endpoint: endpoint.clone(),
            ..good.clone()
        };
        let r = w.push_one(&pusher, &w.request(&sub)).await;
        assert_eq!(
            (r.ended, r.http_status),
            (
                Ended::Permanent {
                    refused: Some(FailReason::EndpointRefused),
                    maybe_delivered: false
                },
                None
            ),
            "{endpoint}"
        );
    }
    assert_eq!(w.push.hits(), 0, "no refused endpoint was ever contacted");
    w.cleanup().await;
}

#[tokio::test]
async fn a_redelivered_request_that_was_delivered_is_not_sent_again() {
    let (w, pusher) = World::with_pusher().await;
    let sub = w.push.subscription();
    let req = w.request(&sub);

    // The pusher delivers and reports, then dies before its ack: JetStream redelivers (a NAK
    // stands in for the ack timeout, so the test does not wait it out).
    assert_eq!(
        pushers::deliver_then_redeliver(&pusher, &w.js, &w.subjects, &req).await,
        [Handled::AlreadyDelivered]
    );
    assert_eq!(
        w.push.received_by(&sub).len(),
        1,
        "the push service saw it once"
    );
    assert_eq!(w.push.hits(), 1);
    // Both handlings reported (results travel in batches, which carry no per-result message id
    // for JetStream to drop a repeat by), and they say the same: the dispatcher's
    // compare-and-set applies the first and ignores the second.
    let results = w.results().await;
    assert_eq!(results.len(), 2, "{results:?}");
    for r in &results {
        assert_eq!(
            (r.outbox_id, r.attempt, r.outcome()),
            (req.outbox_id, req.attempt, Outcome::Delivered)
        );
        assert_eq!(r.ended.message_id(), results[0].ended.message_id());
        assert!(r.ended.message_id().is_some());
    }
    w.cleanup().await;
}

#[tokio::test]
async fn a_pusher_killed_mid_batch_leaves_every_request_with_exactly_one_result() {
    let w = World::new().await;
    let sub = w.push.subscription();
    let requests: Vec<PushRequest> = (0..300).map(|_| w.request(&sub)).collect();
    for r in &requests {
        w.publish(r, &r.msg_id()).await;
    }

    let first = w.pusher().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let killed = tokio::spawn(first.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.push.hits() < 50 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    killed.abort();
    let _ = killed.await;

    let second = w.pusher().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(second.run(stop.clone()));
    let mut results = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while results.len() < requests.len() && Instant::now() < deadline {
        results.extend(w.results().await);
    }
    stop.cancel();
    running.await.unwrap().unwrap();

    let ids: HashSet<OutboxId> = results.iter().map(|r| r.outbox_id).collect();
    assert_eq!(ids.len(), requests.len(), "every request has a result");
    assert_eq!(results.len(), requests.len(), "and only one");
    let undelivered: Vec<(Outcome, Option<String>)> = results
        .iter()
        .filter(|r| r.outcome() != Outcome::Delivered)
        .map(|r| (r.outcome(), r.error.clone()))
        .collect();
    assert!(undelivered.is_empty(), "{undelivered:?}");
    let delivered_rows: HashSet<String> = w
        .push
        .received_by(&sub)
        .iter()
        .filter_map(|r| r.notification_id())
        .collect();
    assert_eq!(
        delivered_rows.len(),
        requests.len(),
        "nothing lost at the push service"
    );
    w.cleanup().await;
}

#[tokio::test]
async fn results_reported_together_share_messages_of_at_most_a_batch() {
    let w = World::new().await;
    let subject = w.subjects.subject(StreamKind::Result, Channel::WebPush);
    let reporter = Reporter::start(w.js.clone(), subject);
    let sent: Vec<PushResult> = (0..BATCH * 2 + 50)
        .map(|i| PushResult {
            http_status: Some(201),
            ..PushResult::new(OutboxId::new(), 1 + (i % 2) as u32, Outcome::Delivered)
        })
        .collect();
    let reported = futures::future::join_all(sent.iter().map(|r| reporter.report(r.clone()))).await;
    assert!(reported.iter().all(Result::is_ok), "{reported:?}");

    let messages = w.result_messages().await;
    let mut sizes: Vec<usize> = messages.iter().map(Vec::len).collect();
    let mut got: Vec<PushResult> = messages.into_iter().flatten().collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [50, BATCH, BATCH], "all at once: full batches");
    got.sort_by_key(|r| r.outbox_id);
    let mut want = sent.clone();
    want.sort_by_key(|r| r.outbox_id);
    assert_eq!(got, want, "each result once, as reported");
    w.cleanup().await;
}

#[tokio::test]
async fn a_result_that_cannot_be_stored_is_an_error_for_its_handler() {
    let w = World::new().await;
    // No stream takes this subject: JetStream has no one to store it.
    let reporter = Reporter::start(w.js.clone(), format!("{}.nowhere", w.subjects.prefix()));
    let failed = reporter
        .report(PushResult::new(OutboxId::new(), 1, Outcome::Delivered))
        .await;
    assert!(
        matches!(failed, Err(ReportError::Publish { count: 1, .. })),
        "{failed:?}"
    );
    w.cleanup().await;
}

#[tokio::test]
async fn a_stopping_pusher_hands_back_what_it_pulled_within_a_second() {
    let mut w = World::new().await;
    w.settings.concurrency = 4;
    // Long enough that the stopping pusher's own pushes are still in flight when we look.
    w.settings.http_timeout = Duration::from_secs(5);
    let sub = w.push.subscription();
    // The first four pushes hang: they keep the stopping pusher's four slots busy, so what it
    // pulled beyond them sits unstarted.
    w.push.answer_next(
        &sub,
        &[Answer::Hang, Answer::Hang, Answer::Hang, Answer::Hang],
    );
    let requests: Vec<PushRequest> = (0..8).map(|_| w.request(&sub)).collect();
    for r in &requests {
        w.publish(r, &r.msg_id()).await;
    }
    let stopping = w.pusher().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let first = tokio::spawn(stopping.run(stop.clone()));
    let started = Instant::now();
    while w.push.hits() < 4 {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A second pusher is up; JetStream has nothing left to give it but what the first holds.
    let other = w.pusher().await;
    let keep = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn(other.run(keep.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(w.push.hits(), 4, "the rest is held by the first pusher");

    // SIGTERM: the four it pulled but never started reach the other pusher at once.
    stop.cancel();
    let stopped = Instant::now();
    let mut delivered = Vec::new();
    while delivered.len() < 4 && stopped.elapsed() < Duration::from_secs(3) {
        delivered.extend(
            w.results()
                .await
                .into_iter()
                .filter(|r| r.outcome() == Outcome::Delivered),
        );
    }
    assert_eq!(delivered.len(), 4, "handed over: {delivered:?}");
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "took {:?}",
        stopped.elapsed()
    );
    first.await.unwrap().unwrap();
    keep.cancel();
    second.await.unwrap().unwrap();
    w.cleanup().await;
}

/// `n` requests, each for a subscription of its own and with a trace context of its own.
fn traced_requests(w: &World, n: usize) -> Vec<(Subscription, PushRequest)> {
    (0..n)
        .map(|i| {
            let sub = w.push.subscription();
            let req = PushRequest {
                traceparent: Some(format!(
                    "00-{:032x}-{:016x}-01",
                    0xabc0_u128 + i as u128,
                    0x10_u64 + i as u64
                )),
                ..w.request(&sub)
            };
            (sub, req)
        })
        .collect()
}

#[tokio::test]
async fn a_batch_is_delivered_request_by_request_in_the_pushers_slots_and_acked_once() {
    let mut w = World::new().await;
    // Fewer slots than requests: the batch waits for them instead of pushing all at once.
    w.settings.concurrency = 2;
    let pusher = w.pusher().await;
    let requests = traced_requests(&w, 5);
    let batch = PushRequests::new(requests.iter().map(|(_, r)| r.clone()).collect());
    w.publish(&batch, &batch.msg_id()).await;

    let handled = pushers::handle_available(&pusher, WAIT).await;
    assert_eq!(handled, [Handled::Reported(Outcome::Delivered); 5]);
    for (sub, req) in &requests {
        let got = w.push.received_by(sub);
        assert_eq!(
            got.len(),
            1,
            "{} reached its subscription once",
            req.outbox_id
        );
        let body: serde_json::Value = serde_json::from_slice(&got[0].plaintext).unwrap();
        assert_eq!(body["title"], req.payload.title.as_str());
        assert_eq!(got[0].topic.as_deref(), Some(req.topic.as_str()));
    }
    let results = w.results().await;
    assert_eq!(results.len(), 5, "{results:?}");
    for (_, req) in &requests {
        let r = results
            .iter()
            .find(|r| r.outbox_id == req.outbox_id)
            .unwrap_or_else(|| panic!("no result for {}", req.outbox_id));
        assert_eq!((r.outcome(), r.attempt), (Outcome::Delivered, req.attempt));
        assert_eq!(
            r.traceparent, req.traceparent,
            "each result continues its own request's trace"
        );
    }
    // One message, acked once its five results were stored.
    let info = pushers::pusher_consumer(&w.js, &w.subjects)
        .await
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(
        (
            info.num_ack_pending,
            info.num_pending,
            info.delivered.stream_sequence
        ),
        (0, 0, 1),
        "{info:?}"
    );
    w.cleanup().await;
}

#[tokio::test]
async fn a_redelivered_batch_sends_again_only_what_was_not_delivered() {
    let (w, pusher) = World::with_pusher().await;
    let requests = traced_requests(&w, 3);
    // The second subscription's push service fails once.
    w.push.answer_next(&requests[1].0, &[Answer::ServerError]);
    let batch = PushRequests::new(requests.iter().map(|(_, r)| r.clone()).collect());
    w.publish(&batch, &batch.msg_id()).await;

    // The pusher handles the batch, then dies before its ack: JetStream redelivers it (a NAK
    // stands in for the ack timeout).
    let msg = pushers::take_one(&w.js, &w.subjects).await;
    assert_eq!(
        pusher
            .decode_and_handle(vec![pushers::ack_lost(&msg)])
            .await
            .unwrap(),
        [
            Handled::Reported(Outcome::Delivered),
            Handled::Reported(Outcome::Transient),
            Handled::Reported(Outcome::Delivered),
        ]
    );
    msg.ack_with(AckKind::Nak(None)).await.unwrap();
    assert_eq!(
        pushers::handle_available(&pusher, Duration::from_secs(2)).await,
        [
            Handled::AlreadyDelivered,
            Handled::Reported(Outcome::Delivered),
            Handled::AlreadyDelivered,
        ]
    );
    for (sub, _) in &requests {
        assert_eq!(w.push.received_by(sub).len(), 1, "each arrived once");
    }
    assert_eq!(w.push.hits(), 4, "three pushes and the one that failed");
    w.cleanup().await;
}

#[tokio::test]
async fn an_undecodable_batch_is_dead_lettered_whole_and_nothing_is_sent() {
    let (w, pusher) = World::with_pusher().await;
    let requests = traced_requests(&w, 2);
    let mut batch = PushRequests::new(requests.iter().map(|(_, r)| r.clone()).collect());
    batch.requests[1].attempt = 0;
    w.publish(&batch, &batch.msg_id()).await;

    assert_eq!(
        pushers::handle_available(&pusher, WAIT).await,
        [Handled::DeadLettered]
    );
    assert_eq!(w.push.hits(), 0);
    assert!(w.results().await.is_empty());
    let dlq =
        w.js.get_stream(w.subjects.stream(StreamKind::Dlq))
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages;
    assert_eq!(dlq, 1, "the batch is in the dead-letter stream");
    w.cleanup().await;
}
