//! Sources a shop already has, through the real services: a watch on a mapped JSON API, one on
//! a schema.org product page (naming its offer) and one on Tidings' own protocol go end to end
//! side by side (the sources file the harness writes is the one docs/sources.md shows), and an
//! unchanged item costs a 304 and no evaluation. Change hints, over HTTP (signed by an
//! independent Standard Webhooks implementation) and NATS, make a price drop reach `sent` with
//! the scan interval at an hour.

use std::time::Duration;
use tidings_domain::outbox::Status;
use tidings_domain::trigger::Trigger;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{HINT_SECRETS, Pipeline};

const BELOW_1000: Trigger = Trigger::PriceBelow { threshold: 1000 };

/// The value of the sample `name{…}` whose labels include every one of `labels`, summed.
async fn sample(p: &Pipeline, service: &str, name: &str, labels: &[&str]) -> f64 {
    let text = reqwest::get(format!("{}/metrics", p.ops_url(service)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_watch_on_each_source_format_goes_end_to_end_side_by_side() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    // `shop:4711` is read from the shop's JSON API as `4711`, its price a decimal string.
    let json = s.watcher_at("shop:4711", BELOW_1000, 1299, &sub).await;
    s.catalog.set_price("4711", 1299);
    // `page:4712::sku:4712` is the offer with sku 4712 on the product page of `4712`, which also
    // offers a dearer gift-wrapped variant.
    let page = s
        .watcher_at("page:4712::sku:4712", BELOW_1000, 1299, &sub)
        .await;
    s.catalog.set_price("4712", 1299);
    let own = s.watcher_at("SKU-T", BELOW_1000, 1299, &sub).await;
    let p = Pipeline::start(&s, &[]).await;

    // Unchanged, scan after scan: the shop answers 304 and nothing is evaluated again.
    let not_modified = ["source=\"shop\"", "result=\"not_modified\""];
    let evaluated = "tidings_detector_evaluated_watches_total";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sample(
        &p,
        "detector",
        "tidings_source_requests_total",
        &not_modified,
    )
    .await
        < 1.0
    {
        assert!(tokio::time::Instant::now() < deadline, "no 304 in 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (answered_304, evaluations) = (
        sample(
            &p,
            "detector",
            "tidings_source_requests_total",
            &not_modified,
        )
        .await,
        sample(&p, "detector", evaluated, &[]).await,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        sample(
            &p,
            "detector",
            "tidings_source_requests_total",
            &not_modified
        )
        .await
            >= answered_304 + 2.0,
        "scans every 500 ms keep asking conditionally"
    );
    assert_eq!(sample(&p, "detector", evaluated, &[]).await, evaluations);
    assert!(s.catalog.not_modified() >= 3);

    s.catalog.set_price("4711", 999);
    s.catalog.set_price("4712", 997);
    s.catalog.set_price("SKU-T", 998);
    p.wait_for_rows(&s, &[Status::Sent], 3, 60).await;
    let got = push.received_by(&sub);
    assert_eq!(got.len(), 3, "rejected: {:?}", push.rejected());
    for (w, price) in [(&json, 999), (&page, 997), (&own, 998)] {
        let rows = s.rows(w.watch).await;
        assert_eq!(rows.len(), 1, "{}", w.item);
        let sent = rows[0].notification.sent_value.as_ref().unwrap();
        assert_eq!(
            (sent["price"].as_i64(), sent["currency"].as_str()),
            (Some(price), Some("EUR")),
            "{}",
            w.item
        );
        assert!(
            got.iter()
                .any(|m| m.json()["id"] == rows[0].notification.id.to_string()),
            "{} pushed",
            w.item
        );
    }
    // The re-check read the shop's API and page too (its fetch after the change was a full
    // answer).
    for source in ["source=\"shop\"", "source=\"pages\""] {
        assert!(
            sample(
                &p,
                "dispatcher",
                "tidings_source_requests_total",
                &[source, "result=\"fetched\""]
            )
            .await
                >= 1.0,
            "{source}"
        );
    }
    p.stop().await;
    s.cleanup().await;
}

/// Standard Webhooks headers for `body`, signed by PyPI's `standardwebhooks` (not our code)
/// with `secret` at unix time `at`.
fn signed_by_python(secret: &str, id: &str, at: i64, body: &str) -> Vec<(String, String)> {
    let python = tidings_tests::harness::tool("python").unwrap();
    let script = "import sys, datetime\n\
        from standardwebhooks.webhooks import Webhook\n\
        secret, msg_id, at, body = sys.argv[1:]\n\
        when = datetime.datetime.fromtimestamp(int(at), tz=datetime.timezone.utc)\n\
        print(Webhook(secret).sign(msg_id, when, body))";
    let signed = tidings_tests::harness::succeeds(
        std::process::Command::new(python).args(["-c", script, secret, id, &at.to_string(), body]),
        "signing with standardwebhooks",
    );
    let signature = String::from_utf8(signed).unwrap().trim().to_owned();
    [
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", at.to_string()),
        ("webhook-signature", signature),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

async fn hint(p: &Pipeline, headers: &[(String, String)], body: &str) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/items/changed", p.url("api")))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        request = request.header(k, v);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

#[tokio::test]
async fn a_hint_makes_a_price_drop_reach_sent_with_the_scan_interval_at_an_hour() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let by_http = s.watcher_at("shop:4721", BELOW_1000, 1299, &sub).await;
    s.catalog.set_price("4721", 1299);
    let by_nats = s
        .watcher_at("page:4722::sku:4722", BELOW_1000, 1299, &sub)
        .await;
    s.catalog.set_price("4722", 1299);
    let p = Pipeline::start(&s, &[("TIDINGS_SCAN_INTERVAL", "1h")]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sample(&p, "detector", "tidings_detector_scans_total", &[]).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no first scan in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.catalog.set_price("4721", 999);
    s.catalog.set_price("4722", 998);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        s.rows(by_http.watch).await.is_empty(),
        "no scan, no hint: nothing yet"
    );

    // Over HTTP, signed with the secret being rotated out (either signs while both are listed).
    let now = chrono::Utc::now().timestamp();
    let body = r#"{"items": ["4721"]}"#;
    let headers = signed_by_python(HINT_SECRETS[1], "msg_e2e_1", now, body);
    let (status, taken) = hint(&p, &headers, body).await;
    assert_eq!(
        (status, &taken["source"], &taken["items"]),
        (202, &"shop".into(), &1.into()),
        "{taken}"
    );
    // Over NATS, as a producer inside the cluster: the page's code, whichever offer is watched.
    let nats =
        tidings_tests::brokers::client_of(&tidings_tests::harness::stack().unwrap().nats_url)
            .await
            .unwrap();
    nats.publish(s.subjects.hints("pages"), r#"{"items": ["4722"]}"#.into())
        .await
        .unwrap();
    nats.flush().await.unwrap();
    p.wait_for_rows(&s, &[Status::Sent], 2, 30).await;
    for (w, price) in [(&by_http, 999), (&by_nats, 998)] {
        let rows = s.rows(w.watch).await;
        let sent = rows[0].notification.sent_value.as_ref().unwrap();
        assert_eq!(sent["price"].as_i64(), Some(price), "{}", w.item);
    }
    assert_eq!(
        sample(&p, "detector", "tidings_detector_scans_total", &[]).await,
        1.0,
        "one scan only: the hints did it"
    );
    assert!(
        sample(
            &p,
            "detector",
            "tidings_detector_hinted_items_total",
            &["result=\"fetched\""]
        )
        .await
            >= 2.0
    );

    // Refused: the same id again, a tampered body, a stale timestamp, an unknown secret.
    let (status, _) = hint(&p, &headers, body).await;
    assert_eq!(status, 409, "a replayed id");
    let (status, _) = hint(&p, &headers, r#"{"items": ["4711"]}"#).await;
    assert_eq!(status, 401, "a tampered body");
    let stale = signed_by_python(HINT_SECRETS[0], "msg_e2e_2", now - 600, body);
    assert_eq!(hint(&p, &stale, body).await.0, 401, "a stale timestamp");
    let stranger = "whsec_c29tZW9uZS1lbHNlcy1zZWNyZXQtMTIzNDU2Nzg=";
    let unknown = signed_by_python(stranger, "msg_e2e_3", now, body);
    assert_eq!(
        hint(&p, &unknown, body).await.0,
        401,
        "a secret no source has"
    );
    let current = signed_by_python(HINT_SECRETS[0], "msg_e2e_4", now, r#"{"items": []}"#);
    assert_eq!(
        hint(&p, &current, r#"{"items": []}"#).await.0,
        422,
        "no items"
    );
    // 100,000 empty signatures over a 15 KB body (a second of CPU each before): refused before
    // anything is hashed.
    let heavy = format!(r#"{{"items": ["{}"]}}"#, "x".repeat(15 * 1024));
    let flood = [
        ("webhook-id".to_owned(), "msg_flood".to_owned()),
        ("webhook-timestamp".to_owned(), now.to_string()),
        (
            "webhook-signature".to_owned(),
            vec!["v1,"; 100_000].join(" "),
        ),
    ];
    let started = std::time::Instant::now();
    let (status, problem) = hint(&p, &flood, &heavy).await;
    assert_eq!(status, 401, "{problem}");
    println!(
        "a hint with 100,000 signature entries refused in {:?}, round trip",
        started.elapsed()
    );
    for result in [
        "replayed",
        "unsigned",
        "stale",
        "invalid",
        "taken",
        "malformed",
    ] {
        let label = format!("result=\"{result}\"");
        assert!(
            sample(&p, "api", "tidings_api_hints_total", &[&label]).await >= 1.0,
            "{result}"
        );
    }
    p.stop().await;
    s.cleanup().await;
}
