//! The HTTP source client against the fake catalog: classification, batching, timeouts.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};
use tidings_domain::ItemCode;
use tidings_domain::trigger::SourceErrorKind;
use tidings_source::HttpSource;
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
        let source = HttpSource::new(c.source_config(batch)).unwrap();
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
    config.batch_size = 100;
    let source = HttpSource::new(config).unwrap();
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
    config.timeout = Duration::from_millis(300);
    let source = HttpSource::new(config).unwrap();
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
    config.timeout = Duration::from_millis(300);
    config.max_concurrency_per_host = 2;
    let source = HttpSource::new(config).unwrap();
    let started = Instant::now();
    source.fetch_many(&codes(&["H0", "H1", "H2", "H3"])).await;
    // Four hanging requests, two at a time: two rounds of the timeout.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
}
