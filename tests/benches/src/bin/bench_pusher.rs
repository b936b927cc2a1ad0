//! Pusher benchmark: encryption alone (µs per message), and the whole pusher (pushes/s and CPU
//! µs per push) against a local HTTPS sink that answers 201, with real NATS. Each figure is the
//! median of several rounds. Run with `deploy/local/stack bench pusher [PUSHES] [ROUNDS]`.

use async_nats::jetstream::consumer::PullConsumer;
use aws_lc_rs::agreement::{self, ECDH_P256, PrivateKey, UnparsedPublicKey};
use chrono::{Duration as ChronoDuration, Utc};
use std::time::{Duration, Instant};
use tidings_benches::procstat::CpuSplit;
use tidings_benches::push::first_attempt;
use tidings_bus::consume::Handler as _;
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_bus::streams::{StreamSettings, ensure_streams};
use tidings_domain::messages::{
    MAX_REQUESTS_PER_MESSAGE, Payload, PushRequests, decode_batched, encode,
};
use tidings_domain::subjects::StreamKind;
use tidings_domain::{Channel, OutboxId};
use tidings_endpoint_guard::EndpointPolicy;
use tidings_pusher::Settings;
use tidings_pusher::worker::Pusher;
use tidings_tests::fake_push::{CERT_PEM, FakePushService, NAMED_HOSTS};
use tidings_tests::harness::{delete_streams, nats, test_subjects};
use tidings_webpush::encryption::{UaKeys, encrypt};
use tidings_webpush::vapid::{VapidKey, VapidSigner};
use tokio_util::sync::CancellationToken;

/// The allocator the `tidings-pusher` binary runs with (pusher/src/main.rs), so the pusher in
/// this process costs what the service does: with glibc's malloc it spent a visible share of
/// its samples waiting on malloc's arena locks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn payload() -> Payload {
    Payload {
        tag: Some("0193a1b2c3d47e5f8a9b0c1d2e3f4a5b/price_below:1200".into()),
        url: Some("https://shop.example/i/SKU-1".into()),
        data: serde_json::json!({"item": "SKU-1", "price": 1050}),
        ..Payload::new("SKU-1 is below your price", "x".repeat(900))
    }
}

async fn round(pushes: usize) -> (f64, CpuSplit) {
    let js = async_nats::jetstream::new(nats().await.expect("nats"));
    let subjects = test_subjects();
    ensure_streams(&js, &subjects, &StreamSettings::default())
        .await
        .expect("streams");
    let sink = FakePushService::start_sink().await.expect("sink");
    let sub = sink.named_subscription();
    let (private, _) = VapidKey::generate().expect("vapid");
    let signer = VapidSigner::new(
        VapidKey::parse(&private).expect("vapid"),
        "mailto:bench@tidings.invalid",
    )
    .expect("signer");
    let mut settings = Settings::new(subjects.clone(), signer);
    settings.policy = EndpointPolicy {
        allowed_hosts: NAMED_HOSTS.split(',').map(str::to_owned).collect(),
        private_hosts: vec!["*:*".into()],
        allow_http: false,
    };
    settings.extra_roots = vec![CERT_PEM.to_vec()];

    let subject = subjects.subject(StreamKind::Push, Channel::WebPush);
    let outgoing: Vec<Outgoing> = (0..pushes)
        .map(|_| {
            let id = OutboxId::new();
            let deadline = Utc::now() + ChronoDuration::minutes(10);
            let req = first_attempt(id, &sub, payload(), deadline);
            Outgoing::deduplicated(subject.as_str(), &req.msg_id(), encode(&req))
        })
        .collect();
    for ack in publish_all(&js, outgoing, 1024).await {
        ack.expect("publish");
    }

    let pusher = Pusher::new(js.clone(), settings).await.expect("pusher");
    let stop = CancellationToken::new();
    let cpu0 = CpuSplit::now();
    let started = Instant::now();
    let task = tokio::spawn(pusher.run(stop.clone()));
    // Done when every request is acked: the pusher acks one once its result is stored.
    let mut push_consumer: PullConsumer = js
        .get_stream(subjects.stream(StreamKind::Push))
        .await
        .expect("push stream")
        .get_consumer(tidings_pusher::worker::CONSUMER)
        .await
        .expect("push consumer");
    loop {
        let info = push_consumer.info().await.expect("consumer info");
        if info.ack_floor.stream_sequence >= pushes as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    let cpu = CpuSplit::since(cpu0);
    stop.cancel();
    let _ = task.await;
    assert_eq!(sink.hits(), pushes, "every push reached the sink once");
    delete_streams(&js, &subjects).await;
    let _ = js.delete_key_value(subjects.bucket("delivered")).await;
    (pushes as f64 / took.as_secs_f64(), cpu.per_unit_us(pushes))
}

/// µs to decode one request of a full PushRequests message as the pusher does, median of 7
/// rounds: the first thing the pusher does with each.
fn decode_us(sub: &tidings_domain::messages::Subscription) -> f64 {
    let deadline = Utc::now() + ChronoDuration::minutes(10);
    let requests = (0..MAX_REQUESTS_PER_MESSAGE)
        .map(|_| first_attempt(OutboxId::new(), sub, payload(), deadline))
        .collect();
    let message = encode(&PushRequests::new(requests));
    let rounds = (0..7).map(|_| {
        let started = Instant::now();
        for _ in 0..200 {
            let requests = decode_batched::<tidings_pusher::Request>(&message).expect("decode");
            std::hint::black_box(requests);
        }
        started.elapsed().as_secs_f64() * 1e6 / (200 * MAX_REQUESTS_PER_MESSAGE) as f64
    });
    median(rounds.collect())
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let pushes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);

    // Encryption alone: 1 KB JSON payloads, one fresh key and salt each.
    let sub = FakePushService::start_sink()
        .await
        .expect("sink")
        .subscription();
    let keys = UaKeys::parse(&sub.p256dh, &sub.auth).expect("keys");
    let body = serde_json::to_vec(&payload()).expect("json");
    // Encryption and the two P-256 operations RFC 8291 requires for every message (a fresh key
    // pair and an ECDH), timed in alternating rounds so each ratio compares the same minutes of
    // this noisy machine: the P-256 operations are the floor, the rest is what encryption adds.
    let sender = PrivateKey::generate(&ECDH_P256).expect("key");
    let ua_public = aws_lc_rs::agreement::PrivateKey::generate(&ECDH_P256)
        .and_then(|k| k.compute_public_key())
        .expect("ua key");
    let per_call = |n: u32, f: &mut dyn FnMut()| {
        let started = Instant::now();
        for _ in 0..n {
            f();
        }
        started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    };
    let (mut enc, mut keygen, mut ecdh, mut ratio) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        let e = per_call(3_000, &mut || {
            std::hint::black_box(encrypt(&keys, &body).expect("encrypt"));
        });
        let k = per_call(3_000, &mut || {
            std::hint::black_box(PrivateKey::generate(&ECDH_P256).expect("key"));
        });
        let a = per_call(3_000, &mut || {
            agreement::agree(
                &sender,
                UnparsedPublicKey::new(&ECDH_P256, ua_public.as_ref()),
                (),
                |secret| Ok(std::hint::black_box(secret.len())),
            )
            .expect("agree");
        });
        enc.push(e);
        keygen.push(k);
        ecdh.push(a);
        ratio.push(e / (k + a));
    }
    let (keygen_us, ecdh_us) = (median(keygen), median(ecdh));
    let (private, _) = VapidKey::generate().expect("vapid");
    let key = VapidKey::parse(&private).expect("vapid");
    let started = Instant::now();
    for _ in 0..2_000 {
        std::hint::black_box(
            key.sign_jwt("https://fcm.googleapis.com", "mailto:x@y.z", Utc::now())
                .expect("sign"),
        );
    }
    let sign_us = started.elapsed().as_secs_f64() * 1e6 / 2_000.0;
    println!("pusher benchmark; payload {} bytes of JSON", body.len());
    println!(
        "  encryption (RFC 8291, aws-lc-rs): median {:.1} µs per message over 7 rounds of 3,000",
        median(enc)
    );
    println!(
        "    of which, alone: P-256 key generation {keygen_us:.1} µs, ECDH {ecdh_us:.1} µs (both required per message)"
    );
    println!(
        "    encryption / (key generation + ECDH), median of the rounds' ratios: {:.2}×",
        median(ratio)
    );
    println!(
        "  VAPID ES256 signature: {sign_us:.1} µs (once per push-service origin per ~11 h, not per message)"
    );
    println!(
        "  PushRequest decode: median {:.2} µs per request, {MAX_REQUESTS_PER_MESSAGE} to a message",
        decode_us(&sub)
    );

    let mut rates = Vec::new();
    let mut cpus = Vec::new();
    for i in 1..=rounds {
        let (rate, cpu) = round(pushes).await;
        println!(
            "  round {i}: {rate:>7.0} pushes/s, CPU µs per push: {:>6.1} pusher + sink (one process), {:>5.1} nats-server",
            cpu.this, cpu.nats
        );
        rates.push(rate);
        cpus.push(cpu);
    }
    let this = median(cpus.iter().map(|c| c.this).collect());
    let nats = median(cpus.iter().map(|c| c.nats).collect());
    println!(
        "  median: {:>7.0} pushes/s, CPU µs per push: {this:.1} pusher + sink, {nats:.1} nats-server; \
         2 cores / {:.1} µs = at most {:.0} pushes/s here ({pushes} pushes per round, concurrency 256, HTTP/2 over TLS to a local sink)",
        median(rates),
        this + nats,
        2e6 / (this + nats)
    );
}
