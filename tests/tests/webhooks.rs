//! Webhooks, the second channel, through the real services: an API client with a key the
//! operator issued registers an endpoint, watches items with the endpoint's token, and receives
//! webhooks signed by the dispatcher and verified here by PyPI's `standardwebhooks` (not our
//! code), during a secret rotation too. Then each answer a receiver can give: 429 then 2xx, 410
//! (the endpoint is disabled), a timeout after the receiver took it (maybe delivered, sent again
//! with the same `webhook-id`), a value that stopped holding before the send (withheld), and a
//! receiver that hangs, which must not delay another receiver's webhooks.

use serde_json::{Value, json};
use std::time::Duration;
use tidings_api_types::doctor::Diagnosis;
use tidings_api_types::endpoints::{EndpointAttemptList, Recovered};
use tidings_domain::outbox::{DropReason, Reason, Status};
use tidings_tests::fake_webhooks::{Answer, FakeWebhookReceiver, Received};
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{ADMIN_TOKEN, Pipeline, call, watch_below};

/// Keys that seal webhook secrets (each the base64 of 32 bytes).
const SEALING_KEYS: [&str; 2] = [
    "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=",
];

/// A client key, as the operator issues it.
async fn client_key(p: &Pipeline) -> String {
    let (status, client) = call(
        reqwest::Method::POST,
        format!("{}/v1/admin/clients", p.ops_url("api")),
        Some(ADMIN_TOKEN),
        Some(json!({"name": "shop backend"})),
    )
    .await;
    assert_eq!(status, 201, "{client}");
    client["key"].as_str().unwrap().to_owned()
}

/// An endpoint registered with `key`: (its device token, its secret).
async fn endpoint(p: &Pipeline, key: &str, url: &str) -> (String, String) {
    let (status, created) = call(
        reqwest::Method::POST,
        format!("{}/v1/endpoints", p.url("api")),
        Some(key),
        Some(json!({"url": url, "description": "orders"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let secret = created["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    (
        created["token"].as_str().unwrap().to_owned(),
        secret.to_owned(),
    )
}

/// A watch for a price below 10.00 on `item`, made with the endpoint's token.
async fn watch(p: &Pipeline, token: &str, item: &str) -> String {
    let watch = watch_below(p, token, item, 1000).await;
    assert_eq!(watch["channel"], "webhook");
    watch["id"].as_str().unwrap().to_owned()
}

/// Whether PyPI's `standardwebhooks` verifies `got` with `secret`.
fn verified_by_python(secret: &str, got: &Received) -> Result<(), String> {
    let python = tidings_tests::harness::tool("python").unwrap();
    let script = "import sys\n\
        from standardwebhooks.webhooks import Webhook\n\
        secret, msg_id, at, signature, body = sys.argv[1:]\n\
        Webhook(secret).verify(body, {'webhook-id': msg_id, 'webhook-timestamp': at, 'webhook-signature': signature})";
    let out = std::process::Command::new(python)
        .args([
            "-c",
            script,
            secret,
            got.id.as_deref().unwrap_or_default(),
            got.timestamp.as_deref().unwrap_or_default(),
            got.signature.as_deref().unwrap_or_default(),
            &got.body,
        ])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

async fn wait_for_received(receiver: &FakeWebhookReceiver, name: &str, n: usize) -> Vec<Received> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = receiver.received_by(name);
        if got.len() >= n {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} received {} of {n} webhooks in 30 s",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn watch_id(id: &str) -> tidings_domain::WatchId {
    tidings_domain::WatchId(id.parse().unwrap())
}

/// An endpoint at `receiver`'s `name` watching `n` items (`<prefix>-0` …) that are at 12.99,
/// and its token; `drop_prices` then puts them all below the threshold.
async fn endpoint_watching(
    p: &Pipeline,
    s: &Scenario,
    receiver: &FakeWebhookReceiver,
    name: &str,
    n: usize,
) -> (String, Vec<String>) {
    let key = client_key(p).await;
    let (token, _) = endpoint(p, &key, &receiver.url(name)).await;
    let items: Vec<String> = (0..n).map(|i| format!("SKU-{name}-{i}")).collect();
    for item in &items {
        s.catalog.set_price(item, 1299);
        watch(p, &token, item).await;
    }
    (token, items)
}

fn drop_prices(s: &Scenario, items: &[String]) {
    for item in items {
        s.catalog.set_price(item, 900);
    }
}

/// An endpoint status whose circuit is closed: no failures counted, no pause.
fn assert_closed(status: &Value) {
    assert_eq!(
        (
            &status["consecutive_failures"],
            &status["paused_until"],
            &status["breaker"]
        ),
        (&json!(0), &Value::Null, &json!("closed")),
        "{status}"
    );
}

/// The pipeline with a breaker that opens after `failures` failing batches that lasted `after`,
/// for `pause` at first.
async fn with_breaker(s: &Scenario, failures: &str, after: &str, pause: &str) -> Pipeline {
    let breaker = [
        ("TIDINGS_WEBHOOK_BREAKER_FAILURES", failures),
        ("TIDINGS_WEBHOOK_BREAKER_AFTER", after),
        ("TIDINGS_WEBHOOK_BREAKER_PAUSE", pause),
    ];
    Pipeline::start(s, &breaker).await
}

/// `GET /v1/endpoints/me` with the endpoint's token.
async fn endpoint_status(p: &Pipeline, token: &str) -> Value {
    let url = format!("{}/v1/endpoints/me", p.url("api"));
    call(reqwest::Method::GET, url, Some(token), None).await.1
}

#[tokio::test]
async fn an_api_client_receives_signed_rechecked_webhooks_through_a_secret_rotation() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    // Secrets sealed in the database under the second key, opened by the dispatcher with either.
    let keys = format!("{},{}", SEALING_KEYS[1], SEALING_KEYS[0]);
    let p = Pipeline::start(&s, &[("TIDINGS_WEBHOOK_SECRET_KEYS", &keys)]).await;
    let api = p.url("api");

    // Only a client key registers an endpoint; and only a URL the pusher would post to.
    let anonymous = call(
        reqwest::Method::POST,
        format!("{api}/v1/endpoints"),
        None,
        Some(json!({"url": receiver.url("orders")})),
    )
    .await;
    assert_eq!(anonymous.0, 401, "{}", anonymous.1);
    let key = client_key(&p).await;
    for (url, why) in [
        ("http://93.184.215.14/in", "plain http"),
        ("https://user:pw@93.184.215.14/in", "user info"),
        // (Private addresses are refused too, but these tests' receivers are on loopback: the
        // guard's own tests cover them.)
        ("https://93.184.215.14/in#part", "a fragment"),
        ("not a url", "not a URL"),
    ] {
        let refused = call(
            reqwest::Method::POST,
            format!("{api}/v1/endpoints"),
            Some(&key),
            Some(json!({"url": url})),
        )
        .await;
        assert_eq!(refused.0, 422, "{why}: {}", refused.1);
    }
    let (token, secret) = endpoint(&p, &key, &receiver.url("orders")).await;
    // An endpoint's token is a device's for watches, but not a client key.
    let not_a_key = call(
        reqwest::Method::POST,
        format!("{api}/v1/endpoints"),
        Some(&token),
        Some(json!({"url": receiver.url("other")})),
    )
    .await;
    assert_eq!(not_a_key.0, 401, "{}", not_a_key.1);

    s.catalog.set_price("SKU-W1", 1299);
    let w1 = watch(&p, &token, "SKU-W1").await;
    s.catalog.set_price("SKU-W1", 999);
    let got = wait_for_received(&receiver, "orders", 1).await;
    let rows = s.rows(watch_id(&w1)).await;
    let hook = &got[0];
    assert_eq!(
        hook.id.as_deref(),
        Some(rows[0].notification.id.to_string().as_str())
    );
    assert_eq!(hook.content_type.as_deref(), Some("application/json"));
    verified_by_python(&secret, hook).unwrap();
    let body = hook.json();
    assert_eq!(body["type"], "watch.triggered");
    assert_eq!(body["data"]["watch_id"], w1.as_str());
    assert_eq!(body["data"]["item"], "SKU-W1");
    assert_eq!(
        body["data"]["checked"]["price"], 999,
        "the re-checked value"
    );
    assert!(body["data"]["valid_until"].is_string() && body["data"]["observed_at"].is_string());
    p.wait_for_rows(&s, &[Status::Sent], 1, 30).await;

    // A rotation: both secrets sign until the overlap ends.
    let (status, rotated) = call(
        reqwest::Method::POST,
        format!("{api}/v1/endpoints/me/secret"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, secret);
    s.catalog.set_price("SKU-W2", 1299);
    watch(&p, &token, "SKU-W2").await;
    s.catalog.set_price("SKU-W2", 998);
    let got = wait_for_received(&receiver, "orders", 2).await;
    verified_by_python(&new_secret, &got[1]).unwrap();
    verified_by_python(&secret, &got[1]).unwrap();
    let stranger = "whsec_c29tZW9uZS1lbHNlcy1zZWNyZXQtMTIzNDU2Nzg=";
    assert!(
        verified_by_python(stranger, &got[1]).is_err(),
        "another secret does not verify"
    );
    let mut tampered = got[1].clone();
    tampered.body = tampered.body.replace("998", "100");
    assert!(
        verified_by_python(&new_secret, &tampered).is_err(),
        "a tampered body does not verify"
    );

    let (status, me) = call(
        reqwest::Method::GET,
        format!("{api}/v1/endpoints/me"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!((status, &me["active"]), (200, &json!(true)), "{me}");
    assert!(me["previous_secret_until"].is_string(), "{me}");
    // Neither secret is in the database as it signs: a dump of it signs nothing.
    let (stored, previous): (String, String) = sqlx::query_as(
        "SELECT secret, previous_secret FROM push_subscriptions WHERE channel = 'webhook'",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    for (kept, given) in [(&stored, &new_secret), (&previous, &secret)] {
        assert!(kept.starts_with("sealed2."), "{kept}");
        assert!(!kept.contains(given.trim_start_matches("whsec_")), "{kept}");
    }
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn each_answer_of_a_receiver_ends_its_rows_as_for_web_push() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = Pipeline::start(&s, &[("TIDINGS_PUSH_HTTP_TIMEOUT", "1s")]).await;
    let key = client_key(&p).await;

    // 429 with Retry-After, then 2xx: sent on the second attempt.
    receiver.answer_next("busy", &[Answer::TooManyRequests { retry_after: "1" }]);
    let (busy, _) = endpoint(&p, &key, &receiver.url("busy")).await;
    // 410: the endpoint is disabled and its row ends with the reason.
    receiver.answer_always("gone", Answer::Status(410, "this endpoint was deleted"));
    let (gone, _) = endpoint(&p, &key, &receiver.url("gone")).await;
    // Taken, but answered after the pusher's 1 s timeout: maybe delivered, so sent again with the
    // same webhook-id (which a receiver deduplicates on).
    receiver.answer_next("slow", &[Answer::OkAfter(Duration::from_secs(3))]);
    let (slow, _) = endpoint(&p, &key, &receiver.url("slow")).await;
    // Refused for good: failed, with the receiver's words in the attempt.
    receiver.answer_always("refuses", Answer::Status(422, "unknown event type"));
    let (refuses, _) = endpoint(&p, &key, &receiver.url("refuses")).await;
    let mut watches = Vec::new();
    for (token, item) in [
        (&busy, "SKU-BUSY"),
        (&gone, "SKU-GONE"),
        (&slow, "SKU-SLOW"),
        (&refuses, "SKU-NO"),
    ] {
        s.catalog.set_price(item, 1299);
        watches.push(watch_id(&watch(&p, token, item).await));
    }
    // Recovered before the dispatcher's re-check: withheld, never posted.
    let (flicker, _) = endpoint(&p, &key, &receiver.url("flicker")).await;
    s.catalog.set_price("SKU-FLICKER", 1500);
    let flicker_watch = watch_id(&watch(&p, &flicker, "SKU-FLICKER").await);
    s.catalog.script("SKU-FLICKER", &[900]);
    for item in ["SKU-BUSY", "SKU-GONE", "SKU-SLOW", "SKU-NO"] {
        s.catalog.set_price(item, 950);
    }
    p.wait_for_rows(&s, &[Status::Sent, Status::Dropped, Status::Failed], 5, 60)
        .await;

    let s = &s;
    let row = |w| async move { s.rows(w).await.remove(0) };
    let busy_row = row(watches[0]).await;
    assert_eq!(busy_row.notification.status, Status::Sent);
    let attempts = s.attempts(busy_row.notification.id).await;
    assert_eq!(
        attempts
            .iter()
            .map(|(_, o, h)| (o.as_str(), *h))
            .collect::<Vec<_>>(),
        [("transient", Some(429)), ("delivered", Some(200))],
        "{attempts:?}"
    );

    let gone_row = row(watches[1]).await;
    assert_eq!(
        (gone_row.notification.status, gone_row.notification.reason),
        (
            Status::Dropped,
            Some(Reason::Dropped(DropReason::SubscriptionGone))
        )
    );
    let (_, me) = call(
        reqwest::Method::GET,
        format!("{}/v1/endpoints/me", p.url("api")),
        Some(&gone),
        None,
    )
    .await;
    assert_eq!(
        (&me["active"], &me["deactivation_reason"]),
        (&json!(false), &json!("gone")),
        "{me}"
    );

    let slow_row = row(watches[2]).await;
    assert_eq!(slow_row.notification.status, Status::Sent);
    assert!(
        slow_row.notification.maybe_delivered,
        "the first attempt may have arrived"
    );
    let slow_got = receiver.received_by("slow");
    assert_eq!(slow_got.len(), 2, "taken twice");
    assert_eq!(slow_got[0].id, slow_got[1].id, "with the same webhook-id");

    let refused_row = row(watches[3]).await;
    assert_eq!(refused_row.notification.status, Status::Failed);
    assert_eq!(
        refused_row.notification.reason.map(|r| r.as_str()),
        Some("webhook_rejected")
    );
    let attempt = tidings_store::attempts::of_row(&s.db.pool, refused_row.notification.id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        format!("{attempt:?}").contains("unknown event type"),
        "{attempt:?}"
    );
    // Once the receiver is fixed, the operator replays the failed row: re-checked and posted
    // again, as a new row with its own webhook-id.
    receiver.answer_always("refuses", Answer::Ok);
    let (status, replay) = call(
        reqwest::Method::POST,
        format!(
            "{}/v1/admin/outbox/{}/replay",
            p.ops_url("api"),
            refused_row.notification.id
        ),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 201, "{replay}");
    let got = wait_for_received(&receiver, "refuses", 2).await;
    assert_eq!(got[1].id.as_deref(), replay["id"].as_str());
    assert_ne!(got[1].id, got[0].id);

    let flicker_row = row(flicker_watch).await;
    assert_eq!(
        (
            flicker_row.notification.status,
            flicker_row.notification.reason
        ),
        (
            Status::Dropped,
            Some(Reason::Dropped(DropReason::ConditionLost))
        )
    );
    assert!(
        receiver.received_by("flicker").is_empty(),
        "a withheld row is never posted"
    );
    p.stop().await;
    s.cleanup().await;
}

/// A hanging receiver and a healthy one, in a pipeline started with `settings`, which
/// [`HangingBeside::healthy_latency`] measures the healthy one's webhook beside.
struct HangingBeside {
    s: Scenario,
    p: Pipeline,
    hanging: FakeWebhookReceiver,
    healthy: FakeWebhookReceiver,
}

impl HangingBeside {
    async fn start(settings: &[(&str, &str)]) -> Self {
        let s = Scenario::new().await;
        let hanging = FakeWebhookReceiver::start().await.unwrap();
        let healthy = FakeWebhookReceiver::start().await.unwrap();
        hanging.answer_always("stuck", Answer::Hang);
        let p = Pipeline::start(&s, settings).await;
        HangingBeside {
            s,
            p,
            hanging,
            healthy,
        }
    }

    /// `stuck` endpoints on the hanging receiver and one on the healthy receiver, each watching
    /// an item of its own; the stuck items drop below their thresholds; once `sending` rows are
    /// `sending` and the hanging receiver holds its host's 2 slots, so does the healthy one's
    /// item. Milliseconds from its detection to its webhook's arrival.
    async fn healthy_latency(&self, stuck: usize, sending: i64) -> i64 {
        let (s, p) = (&self.s, &self.p);
        let key = client_key(p).await;
        let mut items = Vec::new();
        for i in 0..stuck {
            let (token, _) = endpoint(p, &key, &self.hanging.url("stuck")).await;
            let item = format!("SKU-HANG-{i}");
            s.catalog.set_price(&item, 1299);
            watch(p, &token, &item).await;
            items.push(item);
        }
        let (token, _) = endpoint(p, &key, &self.healthy.url("fine")).await;
        s.catalog.set_price("SKU-FINE", 1299);
        let fine = watch_id(&watch(p, &token, "SKU-FINE").await);
        for item in &items {
            s.catalog.set_price(item, 900);
        }
        p.wait_for_rows(s, &[Status::Sending], sending, 20).await;
        wait_for_received(&self.hanging, "stuck", 2).await;
        s.catalog.set_price("SKU-FINE", 900);
        let got = wait_for_received(&self.healthy, "fine", 1).await;
        let rows = s.rows(fine).await;
        got[0].at_ms - rows[0].notification.detected_at.timestamp_millis()
    }

    async fn stop(self) {
        self.p.stop().await;
        self.s.cleanup().await;
    }
}

/// A few webhooks to a hanging host hold its own slots only: another host's goes on at once.
#[tokio::test]
async fn a_hanging_receiver_does_not_delay_another_receivers_webhooks() {
    // Few slots in all, fewer per host: without per-host slots the hanging host's requests would
    // take every one of them for the whole 10 s timeout.
    let t = HangingBeside::start(&[
        ("TIDINGS_PUSH_HTTP_TIMEOUT", "10s"),
        ("TIDINGS_PUSH_CONCURRENCY", "4"),
        ("TIDINGS_WEBHOOK_CONCURRENCY_PER_HOST", "2"),
    ])
    .await;
    // The hanging host's requests go out first and hold its slots.
    let latency = t.healthy_latency(6, 6).await;
    println!("detected → received by the healthy receiver beside a hanging one: {latency} ms");
    assert!(
        latency < 5_000,
        "{latency} ms: the healthy receiver waited on the hanging one's 10 s timeout"
    );
    assert_eq!(
        t.hanging.received_by("stuck").len(),
        2,
        "its 2 slots in flight at once on the hanging host"
    );
    t.stop().await;
}

/// More webhooks to a hanging host than the pusher's consumer has in flight (twice its slots,
/// one request a message): those waiting for the host's slots leave the window by their push
/// deadline (5 s), reported late, so another host's webhook waits for that at most, not for the
/// hanging requests' 15 s timeout.
#[tokio::test]
async fn a_burst_to_a_hanging_receiver_holds_another_receiver_up_only_until_its_deadline() {
    let t = HangingBeside::start(&[
        ("TIDINGS_PUSH_HTTP_TIMEOUT", "15s"),
        ("TIDINGS_PUSH_CONCURRENCY", "4"),
        ("TIDINGS_WEBHOOK_CONCURRENCY_PER_HOST", "2"),
        // A message a request: a batch would take one place in the window for all of them.
        ("TIDINGS_DISPATCH_PUSH_BATCH", "1"),
    ])
    .await;
    let latency = t.healthy_latency(12, 12).await;
    println!("detected → received beside a burst to a hanging receiver: {latency} ms");
    assert!(
        latency < 10_000,
        "{latency} ms: the burst held the consumer's window until the 15 s timeouts"
    );
    assert_eq!(
        t.hanging.received_by("stuck").len(),
        2,
        "only its 2 slots' requests went out; the rest were late, not sent"
    );
    t.stop().await;
}

#[tokio::test]
async fn a_failing_endpoint_is_held_back_by_its_circuit_breaker_and_says_so() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = with_breaker(&s, "3", "1s", "4s").await;
    let key = client_key(&p).await;
    receiver.answer_always("down", Answer::Status(503, "maintenance"));
    let (token, _) = endpoint(&p, &key, &receiver.url("down")).await;
    let items = ["SKU-DOWN-1", "SKU-DOWN-2", "SKU-DOWN-3"];
    for item in items {
        s.catalog.set_price(item, 1299);
        watch(&p, &token, item).await;
    }
    for item in items {
        s.catalog.set_price(item, 900);
    }
    let status = || async {
        call(
            reqwest::Method::GET,
            format!("{}/v1/endpoints/me", p.url("api")),
            Some(&token),
            None,
        )
        .await
        .1
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let open = loop {
        let me = status().await;
        if me["paused_until"].is_string() {
            break me;
        }
        assert!(tokio::time::Instant::now() < deadline, "never paused: {me}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(open["consecutive_failures"].as_i64() >= Some(3), "{open}");
    assert_eq!(open["active"], true, "paused, not disabled");
    // Operators see it in `doctor`, by subscription and host.
    let (_, diagnosis) = call(
        reqwest::Method::GET,
        format!("{}/v1/admin/doctor", p.ops_url("api")),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    let diagnosis: Diagnosis = serde_json::from_value(diagnosis).unwrap();
    let endpoints = (diagnosis.checks.iter())
        .find(|c| c.name == "webhook endpoints")
        .expect("a webhook endpoints check");
    let named = format!(
        "subscription {} (127.0.0.1:",
        open["subscription_id"].as_str().unwrap()
    );
    assert!(
        endpoints.detail.starts_with("1 breakers open"),
        "{endpoints:?}"
    );
    assert!(endpoints.detail.contains(&named), "{endpoints:?}");
    // Retries are due every ~0.5 s (TIDINGS_RETRY_BASE), but none reaches the receiver while
    // the circuit is open.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = receiver.received_by("down").len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        receiver.received_by("down").len(),
        during,
        "requests while the circuit was open"
    );
    // Back up: once the pause ends, the held rows are re-checked and sent, and a delivery
    // closes the circuit.
    receiver.answer_always("down", Answer::Ok);
    p.wait_for_rows(&s, &[Status::Sent], 3, 30).await;
    assert_closed(&status().await);
    p.stop().await;
    s.cleanup().await;
}

/// The pusher takes no proxy from its environment: behind `HTTPS_PROXY` or `ALL_PROXY` the proxy
/// would resolve the receiver's name itself, out of the address guard's sight. A listener stands
/// in as the proxy and counts what reaches it. Regression test: the client honoured them.
#[tokio::test]
async fn the_pusher_connects_to_receivers_itself_whatever_proxy_its_environment_names() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let proxied = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = proxied.clone();
    let listening = tokio::spawn(async move {
        while let Ok((connection, _)) = proxy.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(connection);
        }
    });
    let mut p = Pipeline::start(&s, &[]).await;
    p.kill("pusher");
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        p.set_env(var, &proxy_url);
    }
    p.set_env("NO_PROXY", "");
    p.spawn("pusher");
    p.wait_ready("pusher").await;

    let key = client_key(&p).await;
    let (token, _) = endpoint(&p, &key, &receiver.url("direct")).await;
    s.catalog.set_price("SKU-DIRECT", 1299);
    let watch = watch_id(&watch(&p, &token, "SKU-DIRECT").await);
    s.catalog.set_price("SKU-DIRECT", 950);
    wait_for_received(&receiver, "direct", 1).await;
    p.wait_for_rows(&s, &[Status::Sent], 1, 30).await;
    assert_eq!(s.rows(watch).await[0].notification.status, Status::Sent);
    assert_eq!(
        proxied.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a connection went to the environment's proxy"
    );
    listening.abort();
    p.stop().await;
}

/// Back-pressure is not failure (#53): a receiver answers the first attempt of each of 20
/// webhooks `429` with `Retry-After: 2`, then `200`. Every row is sent within 15 s, paced by the
/// receiver, and the endpoint's breaker never opens. Regression: the 20 answers counted as 20
/// failures in a row and held the endpoint for an hour.
#[tokio::test]
async fn a_burst_of_429s_paces_an_endpoint_and_never_opens_its_breaker() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = Pipeline::start(&s, &[]).await;
    let (token, items) = endpoint_watching(&p, &s, &receiver, "paced", 20).await;
    let busy = Answer::TooManyRequests { retry_after: "2" };
    receiver.answer_next("paced", &vec![busy; 20]);
    let started = tokio::time::Instant::now();
    drop_prices(&s, &items);
    let mut paces = Vec::new();
    loop {
        let me = endpoint_status(&p, &token).await;
        assert_eq!(me["breaker"], "closed", "the breaker opened: {me}");
        assert_eq!(me["paused_until"], Value::Null, "the breaker opened: {me}");
        assert_eq!(me["consecutive_failures"], 0, "{me}");
        if let Some(pace) = me["pace_per_second"].as_f64()
            && paces.last() != Some(&pace)
        {
            paces.push(pace);
        }
        let sent = s.db.rows_in(&[Status::Sent]).await;
        if sent == 20 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{sent} of 20 sent in 15 s: {me}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = receiver.received_by("paced");
    assert_eq!(
        got.len(),
        40,
        "each webhook twice: refused once, then taken"
    );
    println!("paces seen (webhooks a second): {paces:?}");
    assert!(
        paces.first().is_some_and(|first| *first <= 8.0),
        "the endpoint was never paced: {paces:?}"
    );
    p.stop().await;
    s.cleanup().await;
}

/// A receiver that is down for 2 minutes, then recovers (#53): the breaker opens once, then a
/// single probe goes per pause (2 s, 4 s, 8 s … 64 s) rather than every held row, and once a
/// probe is answered 2xx the circuit closes and every row it held is sent within the pause that
/// was running. Regression: each pause released every held row, a burst per pause to a receiver
/// still down; and retries kept backing off after the receiver had recovered.
#[tokio::test]
async fn a_receiver_down_for_two_minutes_gets_one_probe_per_pause_and_its_rows_on_recovery() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = with_breaker(&s, "2", "3s", "2s").await;
    receiver.answer_always("flaky", Answer::Status(500, "down"));
    let (token, items) = endpoint_watching(&p, &s, &receiver, "flaky", 5).await;
    drop_prices(&s, &items);
    let down = tokio::time::Instant::now();
    let status = || endpoint_status(&p, &token);
    while status().await["breaker"] != "open" {
        assert!(down.elapsed() < Duration::from_secs(30), "never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = tokio::time::Instant::now();
    // Requests that passed the gate before it opened may still arrive for a moment; the first
    // probe is due 2 s after it opened.
    let first_pause_ms = chrono::Utc::now().timestamp_millis() + 1_000;
    // Until the receiver recovers, the breaker never closes (it opens once: failed probes
    // only lengthen its pause).
    let mut last = status().await;
    while down.elapsed() < Duration::from_secs(120) {
        last = status().await;
        assert_ne!(
            last["breaker"], "closed",
            "closed while the receiver was down"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = receiver.received_by("flaky");
    let probes: Vec<_> = (during.iter())
        .filter(|r| r.at_ms >= first_pause_ms)
        .collect();
    // Pauses of 2, 4, 8, 16, 32 and 64 s after opening (a probe's round trip between each):
    // six probes at most, each alone (every held row each time: 5 per pause).
    let open_for = opened.elapsed().as_secs();
    println!(
        "open {open_for} s while down: {} probes, at {:?} ms",
        probes.len(),
        probes
            .iter()
            .map(|r| r.at_ms - probes[0].at_ms)
            .collect::<Vec<_>>()
    );
    assert!(
        (4..=6).contains(&probes.len()),
        "{} requests in {open_for} s down and open",
        probes.len()
    );
    assert!(
        probes.windows(2).all(|w| w[1].at_ms - w[0].at_ms >= 1_500),
        "two requests within a pause: {:?}",
        probes
            .iter()
            .map(|r| r.at_ms - first_pause_ms)
            .collect::<Vec<_>>()
    );
    let pause_ends = last["paused_until"].as_str().map(str::to_owned);
    receiver.answer_always("flaky", Answer::Ok);
    let recovered = tokio::time::Instant::now();
    p.wait_for_rows(&s, &[Status::Sent], 5, 120).await;
    let took = recovered.elapsed();
    println!("all 5 sent {took:?} after recovery; the pause running ended at {pause_ends:?}");
    // Within the pause running at recovery (64 s at most) and a probe's round trip.
    assert!(
        took < Duration::from_secs(70),
        "sent {took:?} after recovery"
    );
    let sent_at = chrono::Utc::now();
    if let Some(end) = pause_ends.and_then(|e| e.parse::<chrono::DateTime<chrono::Utc>>().ok()) {
        assert!(
            sent_at < end + chrono::Duration::seconds(5),
            "sent past the pause: {end}"
        );
    }
    assert_closed(&status().await);
    p.stop().await;
    s.cleanup().await;
}

/// A client sees its endpoint's failed deliveries and recovers them itself (#53): its receiver
/// was down until every webhook failed; `GET /v1/endpoints/me/attempts` lists each attempt with
/// its status and the receiver's answer. A recovery through the route while the receiver is still
/// down replays them (they fail again); one through the CLI once it is back replays those
/// replays, and each is re-checked and sent.
#[tokio::test]
async fn a_client_sees_its_failed_deliveries_and_recovers_them_through_the_route_and_the_cli() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = Pipeline::start(
        &s,
        &[
            ("TIDINGS_MAX_RETRIES", "1"),
            ("TIDINGS_WEBHOOK_BREAKER_FAILURES", "0"),
        ],
    )
    .await;
    let since = chrono::Utc::now().to_rfc3339();
    receiver.answer_always("outage", Answer::Status(500, "our side is down"));
    let (token, items) = endpoint_watching(&p, &s, &receiver, "outage", 4).await;
    drop_prices(&s, &items);
    p.wait_for_rows(&s, &[Status::Failed], 4, 60).await;

    let url = format!("{}/v1/endpoints/me/attempts?limit=2", p.url("api"));
    let (status, page) = call(reqwest::Method::GET, url, Some(&token), None).await;
    assert_eq!(status, 200, "{page}");
    let page: EndpointAttemptList = serde_json::from_value(page).unwrap();
    assert_eq!(page.items.len(), 4, "2 webhooks, 2 attempts each: {page:?}");
    for a in &page.items {
        assert_eq!(
            (a.status, a.http_status),
            (Status::Failed, Some(500)),
            "{a:?}"
        );
        assert!(
            a.answer
                .as_deref()
                .is_some_and(|t| t.contains("our side is down")),
            "{a:?}"
        );
        assert!(a.duration_ms.is_some(), "{a:?}");
    }
    let cursor = page.next_cursor.expect("a second page");
    let url = format!("{}/v1/endpoints/me/attempts?cursor={cursor}", p.url("api"));
    let rest: EndpointAttemptList =
        serde_json::from_value(call(reqwest::Method::GET, url, Some(&token), None).await.1)
            .unwrap();
    assert_eq!((rest.items.len(), rest.next_cursor), (4, None));

    // Too early: the receiver is still down, so the replays fail too. From further back than
    // the outbox is sure to keep rows means from 30 days ago.
    let recover = format!("{}/v1/endpoints/me/recover", p.url("api"));
    let (status, done) = call(
        reqwest::Method::POST,
        recover,
        Some(&token),
        Some(json!({ "since": "2020-01-01T00:00:00Z" })),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let done: Recovered = serde_json::from_value(done).unwrap();
    assert_eq!((done.replayed, done.more), (4, false));
    let month_ago = chrono::Utc::now() - chrono::Duration::days(30);
    assert!(
        (done.since - month_ago).num_seconds().abs() < 60,
        "{done:?}"
    );
    p.wait_for_rows(&s, &[Status::Failed], 8, 60).await;

    receiver.answer_always("outage", Answer::Ok);
    let run = tidings_tests::services::endpoint_cli(
        &p.url("api"),
        &token,
        &["--json", "endpoint", "recover", "--since", &since],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["replayed"], 4, "{run:?}");
    p.wait_for_rows(&s, &[Status::Sent], 4, 60).await;
    let run = tidings_tests::services::endpoint_cli(
        &p.url("api"),
        &token,
        &["--json", "endpoint", "recover", "--since", &since],
    );
    assert_eq!(
        run.json()["replayed"],
        0,
        "nothing left to recover: {run:?}"
    );
    let run = tidings_tests::services::endpoint_cli(
        &p.url("api"),
        &token,
        &["--json", "endpoint", "attempts", "--limit", "1"],
    );
    assert_eq!(run.json()[0]["outcome"], "delivered", "{run:?}");
    assert_eq!(receiver.received_by("outage").len(), 4 * 2 + 4 * 2 + 4);
    p.stop().await;
    s.cleanup().await;
}

/// Fairness is by the receiver's address, not its host name (#53): a client's 20 endpoints on
/// one receiver, half named `127.0.0.1` and half `localhost` (the names this test machine
/// resolves without a DNS of its own; a client's `a.hooks.example`, `b.hooks.example`, … are
/// the same case), share its 2 slots. Regression: slots were keyed on the host name, so each
/// name had 2 of its own and the hanging receiver got 4 requests at once.
#[tokio::test]
async fn endpoints_on_one_address_under_several_names_share_its_slots() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = Pipeline::start(&s, &[("TIDINGS_WEBHOOK_CONCURRENCY_PER_HOST", "2")]).await;
    let key = client_key(&p).await;
    let mut items = Vec::new();
    for i in 0..20 {
        let name = format!("named-{i}");
        receiver.answer_always(&name, Answer::Hang);
        let url = receiver.url(&name);
        let url = match i % 2 {
            0 => url,
            _ => url.replacen("https://127.0.0.1:", "https://localhost:", 1),
        };
        let (token, _) = endpoint(&p, &key, &url).await;
        let item = format!("SKU-NAMED-{i}");
        s.catalog.set_price(&item, 1299);
        watch(&p, &token, &item).await;
        items.push(item);
    }
    drop_prices(&s, &items);
    let in_flight = || -> Vec<String> {
        (0..20)
            .flat_map(|i| receiver.received_by(&format!("named-{i}")))
            .map(|r| r.endpoint)
            .collect()
    };
    let started = tokio::time::Instant::now();
    while in_flight().len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no webhook went out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every request hangs, so those in flight are all that were ever made; the other rows wait
    // for a slot until their deadline.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hanging = in_flight();
    assert_eq!(
        hanging.len(),
        2,
        "requests in flight to one address: {hanging:?}"
    );
    p.stop().await;
    s.cleanup().await;
}

/// A sealing key dropped too early (#53): a dispatcher that cannot open an endpoint's secret
/// holds its webhook (retried, counted by the key it needs), and the receiver, which counts,
/// gets no request at all, signed or not; once the key is back the webhook goes out, signed so
/// that PyPI's `standardwebhooks` verifies it.
#[tokio::test]
async fn a_webhook_whose_key_is_gone_is_held_never_unsigned_and_sent_signed_when_it_is_back() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let mut p = Pipeline::start(&s, &[("TIDINGS_WEBHOOK_SECRET_KEYS", SEALING_KEYS[0])]).await;
    let key = client_key(&p).await;
    let (token, secret) = endpoint(&p, &key, &receiver.url("keyed")).await;
    s.catalog.set_price("SKU-KEYED", 1299);
    watch(&p, &token, "SKU-KEYED").await;
    // The dispatcher restarts with only a new key: the secret was sealed under the old one.
    p.kill("dispatcher");
    p.set_env("TIDINGS_WEBHOOK_SECRET_KEYS", SEALING_KEYS[1]);
    p.spawn("dispatcher");
    p.wait_ready("dispatcher").await;
    s.catalog.set_price("SKU-KEYED", 900);
    let held = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("tidings_webhook_secrets_unopened_total{key=\""))
            .filter(|l| {
                !["none", "unsealed", "corrupt", "malformed", "missing"]
                    .iter()
                    .any(|k| l.contains(&format!("\"{k}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let metrics = format!("{}/metrics", p.ops_url("dispatcher"));
    let started = tokio::time::Instant::now();
    while held(&reqwest::get(&metrics).await.unwrap().text().await.unwrap()) < 2.0 {
        assert!(started.elapsed() < Duration::from_secs(30), "never held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(s.db.rows_in(&[Status::Retry]).await, 1, "held as a retry");
    assert_eq!(receiver.received_by("keyed").len(), 0, "a request was made");
    // The key is back (the new one first, as a rotation has it).
    p.kill("dispatcher");
    let both = format!("{},{}", SEALING_KEYS[1], SEALING_KEYS[0]);
    p.set_env("TIDINGS_WEBHOOK_SECRET_KEYS", &both);
    p.spawn("dispatcher");
    p.wait_ready("dispatcher").await;
    p.wait_for_rows(&s, &[Status::Sent], 1, 60).await;
    let got = receiver.received_by("keyed");
    assert_eq!(got.len(), 1, "{got:?}");
    verified_by_python(&secret, &got[0]).unwrap();
    p.stop().await;
    s.cleanup().await;
}

/// Every family a service shows in `/metrics` is one `FAMILIES` lists for it, after a run that
/// goes through the api's operator cancel (#54): a family fed through a code path the list
/// forgot is shown (`exported_or_fed`) and fails here. Regression: the api's cancels moved
/// `tidings_outbox_transitions`, which the api never exported, so they never reached `/metrics`.
#[tokio::test]
async fn an_operators_cancel_counts_on_the_api_and_each_service_shows_only_its_listed_families() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    // The row waits an hour in `retry` after its first failure: cancellable.
    let p = Pipeline::start(&s, &[("TIDINGS_RETRY_BASE", "1h")]).await;
    receiver.answer_always("cancelled", Answer::Status(500, "down"));
    let (_, items) = endpoint_watching(&p, &s, &receiver, "cancelled", 1).await;
    drop_prices(&s, &items);
    p.wait_for_rows(&s, &[Status::Retry], 1, 30).await;
    let ops = p.ops_url("api");
    let (_, listed) = call(
        reqwest::Method::GET,
        format!("{ops}/v1/admin/outbox?status=retry"),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    let listed: tidings_api_types::outbox::OutboxList = serde_json::from_value(listed).unwrap();
    let id = listed.items[0].notification.id;
    let (status, cancelled) = call(
        reqwest::Method::POST,
        format!("{ops}/v1/admin/outbox/{id}/cancel"),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200, "{cancelled}");
    let scrape = |name: &'static str| {
        let url = format!("{}/metrics", p.ops_url(name));
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let api = scrape("api").await;
    assert!(
        api.lines()
            .any(|l| l == r#"tidings_outbox_transitions_total{to="dropped",reason="cancelled"} 1"#),
        "the api's cancel is not counted:\n{api}"
    );
    for name in ["api", "dispatcher", "pusher", "detector"] {
        let text = scrape(name).await;
        let unlisted: Vec<&str> = (text.lines())
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
            .filter(|family| !tidings_runtime::metrics::exports(name, family))
            .collect();
        assert!(
            unlisted.is_empty(),
            "{name} feeds families FAMILIES does not list for it: {unlisted:?}"
        );
    }
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_digest_reaches_an_endpoint_as_one_signed_watch_digest_event() {
    let s = Scenario::new().await;
    let receiver = FakeWebhookReceiver::start().await.unwrap();
    let p = Pipeline::start(&s, &[("TIDINGS_WEBHOOK_SECRET_KEYS", SEALING_KEYS[0])]).await;
    let key = client_key(&p).await;
    let (token, secret) = endpoint(&p, &key, &receiver.url("digest")).await;
    let (status, me) = call(
        reqwest::Method::PATCH,
        format!("{}/v1/devices/me", p.url("api")),
        Some(&token),
        Some(json!({"preferences": {"digest": "hourly"}})),
    )
    .await;
    assert_eq!(status, 200, "{me}");
    let items: Vec<String> = (0..3).map(|i| format!("SKU-DG-{i}")).collect();
    for item in &items {
        s.catalog.set_price(item, 1299);
        watch(&p, &token, item).await;
    }
    drop_prices(&s, &items);
    let held = "SELECT count(*) FROM outbox WHERE held = 'digest' AND status = 'pending'";
    s.db.wait_for_count(held, 3, 15).await;
    assert!(receiver.received_by("digest").is_empty());
    // The hour comes.
    s.db.digest_time().await;
    let got = wait_for_received(&receiver, "digest", 1).await;
    verified_by_python(&secret, &got[0]).unwrap();
    let event: Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(event["type"], "watch.digest", "{event}");
    let members = event["data"]["members"].as_array().unwrap();
    let mut named: Vec<&str> = members
        .iter()
        .map(|m| m["item"].as_str().unwrap())
        .collect();
    named.sort();
    assert_eq!(named, items.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(members.iter().all(|m| m["checked"]["price"] == 900));
    assert_eq!(got[0].id.as_deref(), event["data"]["id"].as_str());
    assert_eq!(event["data"]["title"], "3 of your watches");
    let leader = got[0].id.as_deref().unwrap();
    let sent =
        format!("SELECT count(*) FROM outbox WHERE status = 'sent' AND digest_of = '{leader}'");
    s.db.wait_for_count(&sent, 3, 15).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received_by("digest").len(), 1, "one event");
    p.stop().await;
    s.cleanup().await;
}
