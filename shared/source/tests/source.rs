//! The HTTP source client against the fake catalog: classification, batching, timeouts.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};
use tidings_domain::ItemCode;
use tidings_domain::trigger::SourceErrorKind;
use tidings_source::Sources;
use tidings_testkit::fake_catalog::{Behavior, FakeCatalog, Item};

fn codes(names: &[&str]) -> Vec<ItemCode> {
    names.iter().map(|n| ItemCode::parse(n).unwrap()).collect()
}

async fn catalog() -> FakeCatalog {
    let c = FakeCatalog::start().await.unwrap();
    c.set_price("OK", 1100);
    c.set_behavior("GONE", Behavior::NotFound);
    c.set_behavior("EMPTY", Behavior::Empty);
    c.set_behavior("SLOW-DOWN", Behavior::RateLimited);
    c.set_behavior("BROKEN", Behavior::ServerError);
    c.set(
        "OUT",
        Item {
            in_stock: false,
            ..Item::priced(900)
        },
    );
    c
}

#[tokio::test]
async fn every_answer_is_classified_the_same_with_and_without_the_batch_endpoint() {
    let c = catalog().await;
    let items = codes(&[
        "OK",
        "GONE",
        "EMPTY",
        "SLOW-DOWN",
        "BROKEN",
        "OUT",
        "NEVER-HEARD-OF",
    ]);
    for batch in [false, true] {
        let source = Sources::new(c.source_config(batch)).unwrap();
        let got = source.fetch_many(&items).await;
        let kind = |code: &str| {
            got[&ItemCode::parse(code).unwrap()]
                .as_ref()
                .err()
                .map(|e| e.kind)
        };
        let ok = got[&ItemCode::parse("OK").unwrap()].as_ref().unwrap();
        assert_eq!(
            (ok.price, ok.currency.as_str(), ok.in_stock),
            (1100, "EUR", true)
        );
        let out = got[&ItemCode::parse("OUT").unwrap()].as_ref().unwrap();
        assert!(!out.in_stock);
        for (code, expected) in [
            ("GONE", SourceErrorKind::NotFound),
            ("NEVER-HEARD-OF", SourceErrorKind::NotFound),
            ("EMPTY", SourceErrorKind::Empty),
            ("SLOW-DOWN", SourceErrorKind::RateLimited),
            ("BROKEN", SourceErrorKind::Unavailable),
        ] {
            assert_eq!(kind(code), Some(expected), "{code}, batch={batch}");
        }
    }
}

#[tokio::test]
async fn the_batch_endpoint_asks_each_item_once_in_few_requests() {
    let c = FakeCatalog::start().await.unwrap();
    let names: Vec<String> = (0..250).map(|i| format!("I-{i}")).collect();
    for n in &names {
        c.set_price(n, 100);
    }
    let mut config = c.source_config(true);
    config.sources[0].batch_size = 100;
    let source = Sources::new(config).unwrap();
    // Duplicates in the input are asked once.
    let mut items: Vec<ItemCode> = names.iter().map(|n| ItemCode::parse(n).unwrap()).collect();
    items.extend(items.clone());
    let got = source.fetch_many(&items).await;
    assert_eq!(got.len(), 250);
    assert!(got.values().all(|r| r.is_ok()));
    assert_eq!(c.requests(), (0, 3), "250 items in batches of 100");
}

#[tokio::test]
async fn a_hanging_item_costs_at_most_the_timeout_and_does_not_block_the_others() {
    let c = catalog().await;
    c.set_behavior("HANGS", Behavior::Hang);
    let mut config = c.source_config(false);
    config.set_timeout(Duration::from_millis(300));
    let source = Sources::new(config).unwrap();
    let started = Instant::now();
    let got = source.fetch_many(&codes(&["HANGS", "OK"])).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        got[&ItemCode::parse("HANGS").unwrap()]
            .as_ref()
            .unwrap_err()
            .kind,
        SourceErrorKind::Unavailable
    );
    assert!(got[&ItemCode::parse("OK").unwrap()].is_ok());
}

#[tokio::test]
async fn requests_per_host_are_limited() {
    let c = catalog().await;
    for i in 0..4 {
        c.set_behavior(&format!("H{i}"), Behavior::Hang);
    }
    let mut config = c.source_config(false);
    config.set_timeout(Duration::from_millis(300));
    config.sources[0].max_concurrency_per_host = 2;
    let source = Sources::new(config).unwrap();
    let started = Instant::now();
    source.fetch_many(&codes(&["H0", "H1", "H2", "H3"])).await;
    // Four hanging requests, two at a time: two rounds of the timeout.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_limit_holds_when_the_item_code_is_part_of_the_host() {
    // Regression: the limit was looked up by the host of each request, which for a template
    // with `{item}` in its host was never the one configured, so no limit applied.
    let c = catalog().await;
    c.set_behavior("1", Behavior::Hang);
    let mut config = c.source_config(false);
    let port = config.sources[0].item_url.split(':').nth(2).unwrap();
    let port = port.split('/').next().unwrap().to_owned();
    config.sources[0].item_url = format!("http://127.0.0.{{item}}:{port}/items/1");
    config.set_timeout(Duration::from_millis(300));
    config.sources[0].max_concurrency_per_host = 2;
    let source = Sources::new(config).unwrap();
    let one = ItemCode::parse("1").unwrap();
    let started = Instant::now();
    let answers = futures::future::join_all((0..4).map(|_| source.fetch(&one))).await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().unwrap_err().kind == SourceErrorKind::Unavailable)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_mapped_json_api_and_the_tidings_protocol_answer_side_by_side() {
    let c = catalog().await;
    c.set(
        "4711",
        Item {
            currency: "JPY".into(),
            ..Item::priced(1200)
        },
    );
    c.set(
        "4712",
        Item {
            in_stock: false,
            ..Item::priced(1299)
        },
    );
    c.set_behavior("4713", Behavior::Empty);
    let mut config = c.source_config(true);
    config.sources.push(c.shop_source());
    let source = Sources::new(config).unwrap();
    let got = source
        .fetch_many(&codes(&[
            "shop:4711",
            "shop:4712",
            "shop:4713",
            "shop:NONE",
            "OK",
        ]))
        .await;
    let yen = got[&ItemCode::parse("shop:4711").unwrap()]
        .as_ref()
        .unwrap();
    assert_eq!(
        (yen.price, yen.currency.as_str(), yen.in_stock),
        (1200, "JPY", true)
    );
    let out = got[&ItemCode::parse("shop:4712").unwrap()]
        .as_ref()
        .unwrap();
    assert_eq!(
        (out.price, out.currency.as_str(), out.in_stock),
        (1299, "EUR", false)
    );
    let kind = |code: &str| {
        got[&ItemCode::parse(code).unwrap()]
            .as_ref()
            .err()
            .map(|e| e.kind)
    };
    assert_eq!(kind("shop:4713"), Some(SourceErrorKind::Empty));
    assert_eq!(kind("shop:NONE"), Some(SourceErrorKind::NotFound));
    assert_eq!(
        got[&ItemCode::parse("OK").unwrap()].as_ref().unwrap().price,
        1100
    );
    // The shop's four went one by one; the tidings item in one batch.
    assert_eq!(c.requests(), (4, 1));
    assert_eq!(
        source.source_of(&ItemCode::parse("shop:4711").unwrap()),
        Some("shop")
    );
}

#[tokio::test]
async fn an_unchanged_item_is_answered_304_and_its_last_value_is_reused() {
    let c = catalog().await;
    c.set_price("4711", 1299);
    let mut config = c.source_config(false);
    config.sources.push(c.shop_source());
    let source = Sources::new(config).unwrap();
    for code in ["shop:4711", "OK"] {
        let item = ItemCode::parse(code).unwrap();
        let first = source.fetch(&item).await.unwrap();
        let again = source.fetch(&item).await.unwrap();
        assert_eq!(
            (again.price, again.in_stock),
            (first.price, first.in_stock),
            "{code}"
        );
        assert!(again.observed_at >= first.observed_at);
    }
    assert_eq!(
        c.not_modified(),
        2,
        "the second ask of each was answered 304"
    );
    // A change makes a new version: fetched in full, the new value seen.
    c.set_price("4711", 999);
    let changed = source
        .fetch(&ItemCode::parse("shop:4711").unwrap())
        .await
        .unwrap();
    assert_eq!(changed.price, 999);
    assert_eq!(c.not_modified(), 2);
    let text = tidings_runtime::metrics::metrics().encode();
    assert!(
        text.lines()
            .any(|l| l.starts_with("tidings_source_requests_total{")
                && l.contains("source=\"shop\"")
                && l.contains("result=\"not_modified\"")),
        "{text}"
    );
}

#[tokio::test]
async fn a_product_page_answers_for_the_offer_its_code_names_each_remembered_on_its_own() {
    let c = catalog().await;
    c.set_price("P1", 1299);
    let mut config = c.source_config(false);
    config.sources.push(c.page_source());
    let source = Sources::new(config).unwrap();
    let item = |code: &str| ItemCode::parse(code).unwrap();
    // The page offers P1 at 12.99 and P1-GIFT at 17.99: which one is meant must be said.
    let e = source.fetch(&item("page:P1")).await.unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::BadData);
    assert!(e.detail.contains("ambiguous: 2 offers"), "{e}");
    assert!(
        e.detail.contains("/shop/pages/P1"),
        "says which request: {e}"
    );
    for _ in 0..2 {
        let plain = source.fetch(&item("page:P1::sku:P1")).await.unwrap();
        let gift = source.fetch(&item("page:P1::sku:P1-GIFT")).await.unwrap();
        assert_eq!((plain.price, gift.price), (1299, 1799));
    }
    // Each offer's second ask was a 304 that reused that offer's own value.
    assert_eq!(c.not_modified(), 2);
    let e = source.fetch(&item("page:P1::size:M")).await.unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::BadData);
    assert!(e.detail.contains("sku:<sku>"), "{e}");
}
