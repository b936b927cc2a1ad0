//! Pusher benchmark: encryption alone (µs per message), and the whole pusher (pushes/s and CPU
//! µs per push) against a local HTTPS sink that answers 201, with real NATS. Each figure is the
//! median of several rounds. Run with `deploy/local/stack bench pusher [PUSHES] [ROUNDS]
//! [BATCHES]`: the requests go BATCHES to a message as the dispatcher publishes them (its
//! `TIDINGS_DISPATCH_PUSH_BATCH`, 50 by default); a list (`1,50`) alternates the sizes round by
//! round.

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
    Batch, MAX_REQUESTS_PER_MESSAGE, Payload, PushRequests, decode_batched, encode,
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

/// One round: `pushes` requests, `batch` to a message, delivered by a fresh pusher.
async fn round(pushes: usize, batch: usize) -> (f64, CpuSplit) {
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
    let deadline = Utc::now() + ChronoDuration::minutes(10);
    let requests: Vec<_> = (0..pushes)
        .map(|_| first_attempt(OutboxId::new(), &sub, payload(), deadline))
        .collect();
    // As the dispatcher publishes them: one request a message, or `PushRequests` of `batch`.
    let outgoing: Vec<Outgoing> = if batch == 1 {
        (requests.iter())
            .map(|req| Outgoing::deduplicated(subject.as_str(), &req.msg_id(), encode(req)))
            .collect()
    } else {
        (requests.chunks(batch))
            .map(|chunk| {
                let m = Batch::new(chunk.to_vec());
                Outgoing::deduplicated(subject.as_str(), &m.msg_id(), encode(&m))
            })
            .collect()
    };
    let messages = outgoing.len() as u64;
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
        if info.ack_floor.stream_sequence >= messages {
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
    let batches: Vec<usize> = match args.next() {
        None => vec![50],
        Some(list) => (list.split(','))
            .map(|b| match b.trim().parse() {
                Ok(n) if (1..=MAX_REQUESTS_PER_MESSAGE).contains(&n) => n,
                _ => panic!("BATCHES: sizes from 1 to {MAX_REQUESTS_PER_MESSAGE}, comma-separated"),
            })
            .collect(),
    };

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

    // A round first that is not counted: the process's first pushes grow its heap, and the kernel
    // zeroes every page on first touch (2 MiB at a time where mimalloc asks for huge pages): a
    // running pusher pays it as its heap grows, not per push. Counted, it added ~40 µs a push to
    // the first round (a profile: `clear_page_erms` under mimalloc's fresh pages, 17 % of it).
    let warm_up = round(pushes.min(5_000), batches[0]).await;
    println!(
        "  warm-up round, not counted: {:.0} pushes/s, {:.1} µs a push",
        warm_up.0, warm_up.1.this
    );
    // Rounds alternate the sizes, so each size is measured over the same minutes of this machine.
    let mut measured: Vec<(Vec<f64>, Vec<CpuSplit>)> =
        vec![(Vec::new(), Vec::new()); batches.len()];
    for i in 1..=rounds {
        for (&batch, (rates, cpus)) in batches.iter().zip(&mut measured) {
            let (rate, cpu) = round(pushes, batch).await;
            println!(
                "  round {i}, {batch} to a message: {rate:>7.0} pushes/s, CPU µs per push: {:>6.1} pusher + sink (one process), {:>5.1} nats-server",
                cpu.this, cpu.nats
            );
            rates.push(rate);
            cpus.push(cpu);
        }
    }
    for (&batch, (rates, cpus)) in batches.iter().zip(measured) {
        let this = median(cpus.iter().map(|c| c.this).collect());
        let nats = median(cpus.iter().map(|c| c.nats).collect());
        println!(
            "  median, {batch} to a message: {:>7.0} pushes/s, CPU µs per push: {this:.1} pusher + sink, {nats:.1} nats-server; \
             2 cores / {:.1} µs = at most {:.0} pushes/s here ({pushes} pushes per round, concurrency 256, HTTP/2 over TLS to a local sink)",
            median(rates),
            this + nats,
            2e6 / (this + nats)
        );
    }
}
