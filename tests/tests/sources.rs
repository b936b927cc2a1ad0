//! Sources a shop already has, through the real services: a watch on a mapped JSON API, one on
//! a schema.org product page (naming its offer) and one on Tidings' own protocol go end to end
//! side by side (the sources file the harness writes is the one docs/sources.md shows), and an
//! unchanged item costs a 304 and no evaluation.

use std::time::Duration;
use tidings_domain::outbox::Status;
use tidings_domain::trigger::Trigger;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

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
