//! A pusher to drive by hand in tests: its settings for the fake push service, its durable
//! consumer, and a delivery whose ack is lost. The pusher's own tests use it, and so do the
//! cross-service tests (`tidings_tests::pushers` is this file), so the pusher's tests build
//! without the other services.

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use futures::StreamExt;
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
pub async fn pusher_consumer(
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
) -> PullConsumer {
    js.get_stream(subjects.stream(StreamKind::Push))
        .await
        .expect("push stream")
        .get_consumer(tidings_pusher::worker::CONSUMER)
        .await
        .expect("pusher consumer")
}

/// Publishes `req`; a pusher delivers it and dies before its ack would (a NAK stands in for the
/// ack timeout, so the test does not wait it out); returns how the redelivery is handled.
pub async fn deliver_then_redeliver(
    pusher: &Pusher,
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
    req: &PushRequest,
) -> Vec<Handled> {
    publish_push(js, subjects, req, &req.msg_id()).await;
    let wait = std::time::Duration::from_secs(2);
    let mut batch = pusher_consumer(js, subjects)
        .await
        .fetch()
        .max_messages(1)
        .expires(wait)
        .messages()
        .await
        .expect("fetch");
    let msg = batch.next().await.expect("a request").expect("a message");
    assert_eq!(
        pusher.process(&msg).await,
        [Handled::Reported(Outcome::Delivered)]
    );
    msg.ack_with(AckKind::Nak(None)).await.expect("nak");
    pusher.handle_available(wait).await.expect("redelivery")
}
