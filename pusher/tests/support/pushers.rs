//! A pusher to drive by hand in tests: its settings for the fake push service, its durable
//! consumer, and a delivery whose ack is lost. The pusher's own tests use it, and so do the
//! cross-service tests (`tidings_tests::pushers` is this file), so the pusher's tests build
//! without the other services.

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use std::time::Duration;
use tidings_bus::consume::{self, Handler};
use tidings_domain::messages::{Outcome, PushRequest};
use tidings_domain::subjects::{StreamKind, Subjects};
use tidings_pusher::worker::{Handled, Pusher};
use tidings_testkit::fake_push::CERT_PEM;
use tidings_testkit::fixtures::publish_push;

/// Pusher settings for delivering to a fake push service: a new VAPID key, 1 s timeouts,
/// endpoints on loopback allowed and the fake's certificate trusted.
pub fn pusher_settings(subjects: tidings_domain::subjects::Subjects) -> tidings_pusher::Settings {
    let (private, _) = tidings_webpush::vapid::VapidKey::generate().expect("VAPID key");
    let signer = tidings_webpush::vapid::VapidSigner::new(
        tidings_webpush::vapid::VapidKey::parse(&private).expect("VAPID key"),
        "mailto:ops@tidings.invalid",
    )
    .expect("VAPID signer");
    let mut settings = tidings_pusher::Settings::new(subjects, signer);
    settings.http_timeout = std::time::Duration::from_secs(1);
    settings.connect_timeout = std::time::Duration::from_secs(1);
    settings.concurrency = 64;
    settings.policy = tidings_endpoint_guard::EndpointPolicy {
        allowed_hosts: vec!["127.0.0.1:*".into()],
        private_hosts: vec!["*:*".into()],
        allow_http: false,
    };
    settings.extra_roots = vec![CERT_PEM.to_vec()];
    settings
}

/// The pushers' durable consumer (it exists once a `Pusher` was made).
pub async fn pusher_consumer(js: &jetstream::Context, subjects: &Subjects) -> PullConsumer {
    js.get_stream(subjects.stream(StreamKind::Push))
        .await
        .expect("push stream")
        .get_consumer(tidings_pusher::worker::CONSUMER)
        .await
        .expect("pusher consumer")
}

/// Every request available now, through the pusher's one path ([`Handler::run_once`]: its
/// consumer's next message, decoded, delivered, acked), until none is left: how each was
/// handled, in order.
pub async fn handle_available(pusher: &Pusher, wait: Duration) -> Vec<Handled> {
    let mut all = Vec::new();
    loop {
        let handled = pusher.run_once(wait).await.expect("a pusher's round");
        if handled.is_empty() {
            return all;
        }
        all.extend(handled);
    }
}

/// `msg` as a pusher that dies before its ack sees it: what it sends back to JetStream (ack,
/// progress) goes to a consumer that does not exist, so it is lost as a dead pusher's would be.
pub fn ack_lost(msg: &jetstream::Message) -> jetstream::Message {
    let reply = msg
        .reply
        .as_ref()
        .expect("a JetStream message has a reply subject");
    let mut tokens: Vec<&str> = reply.split('.').collect();
    // `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`
    assert_eq!((tokens.len(), tokens[1]), (9, "ACK"), "{reply}");
    tokens[3] = "died-before-ack";
    let mut lost = msg.clone();
    lost.message.reply = Some(tokens.join(".").into());
    lost
}

/// The next message on the pushers' consumer, taken and held as a pusher would hold it.
pub async fn take_one(js: &jetstream::Context, subjects: &Subjects) -> jetstream::Message {
    let consumer = pusher_consumer(js, subjects).await;
    let mut taken = consume::fetch(&consumer, 1, Duration::from_secs(2))
        .await
        .expect("fetch");
    assert_eq!(taken.len(), 1, "one message waits");
    taken.remove(0)
}

/// Publishes `req`; a pusher delivers it and dies before its ack (a NAK stands in for the ack
/// timeout, so the test does not wait it out); returns how the redelivery is handled.
pub async fn deliver_then_redeliver(
    pusher: &Pusher,
    js: &jetstream::Context,
    subjects: &Subjects,
    req: &PushRequest,
) -> Vec<Handled> {
    publish_push(js, subjects, req, &req.msg_id()).await;
    let msg = take_one(js, subjects).await;
    let first = pusher.decode_and_handle(vec![ack_lost(&msg)]).await;
    assert_eq!(
        first.expect("delivered"),
        [Handled::Reported(Outcome::Delivered)]
    );
    msg.ack_with(AckKind::Nak(None)).await.expect("nak");
    handle_available(pusher, Duration::from_secs(2)).await
}
