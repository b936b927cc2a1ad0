//! The browser half of Tidings in headless Chromium (tests/browser/run.js, driven by Playwright):
//! the demo page and service worker served by the real api, notifications detected, re-checked
//! and pushed by the real detector, dispatcher and pusher. Only the push service is stood in
//! for, by an HTTPS relay the pusher really POSTs to; the page decrypts the message with
//! WebCrypto and the test hands the plaintext to the service worker over the DevTools protocol.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tidings_tests::brokers::free_port;
use tidings_tests::harness::tool;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

#[tokio::test]
async fn a_browser_registers_watches_and_shows_only_what_is_still_true() {
    let s = Scenario::new().await;
    // The origin whose pages may call the api (TIDINGS_API_CORS_ORIGINS); run.js serves a page
    // there, and one on another port, which is not listed.
    let shop = format!("http://127.0.0.1:{}", free_port().expect("a free port"));
    let p = Pipeline::start(
        &s,
        &[
            ("TIDINGS_API_WEB", "true"),
            ("TIDINGS_API_CORS_ORIGINS", &shop),
            ("TIDINGS_ITEM_PAGE_URL", "https://shop.test/items/{item}"),
            // Each show-time check reads the catalog as the test just set it.
            ("TIDINGS_API_CHECK_CACHE", "0s"),
        ],
    )
    .await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fixtures = repo.join("tests/fixtures/tls");
    let chromium = tool("chromium").expect("the stack's tools (chromium)");
    let playwright = tool("../node/node_modules/playwright-core").expect("playwright-core");
    let run = tokio::process::Command::new("node")
        .arg(repo.join("tests/browser/run.js"))
        .env("TIDINGS_API", p.url("api"))
        .env("TIDINGS_CATALOG_ADMIN", s.catalog.admin_url())
        .env("TIDINGS_CHROMIUM", &chromium)
        .env("TIDINGS_PLAYWRIGHT", &playwright)
        .env("TIDINGS_TLS_CERT", fixtures.join("cert.pem"))
        .env("TIDINGS_TLS_KEY", fixtures.join("key.pem"))
        .env("TIDINGS_CORS_ALLOWED", &shop)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the browser test finished within 4 minutes")
        .expect("node runs (deploy/local/stack tools installs what it needs)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tests/browser/run.js failed:\n{stderr}\napi log:\n{}\npusher log:\n{}",
        p.log("api"),
        p.log("pusher")
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no report ({e}):\n{stdout}\n{stderr}"));
    eprintln!("what the browser saw: {report:#}");

    // What the browser saw is what the database holds.
    let device = report["device_id"].as_str().expect("device id").to_owned();
    let subscriptions: Vec<(String, bool, Option<String>)> = sqlx::query_as(
        "SELECT endpoint, active, deactivation_reason FROM push_subscriptions
         WHERE device_id = $1::uuid ORDER BY created_at",
    )
    .bind(&device)
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        subscriptions,
        vec![
            (
                report["first_endpoint"].as_str().unwrap().to_owned(),
                false,
                Some("replaced".to_owned())
            ),
            (
                report["new_endpoint"].as_str().unwrap().to_owned(),
                true,
                None
            ),
        ],
        "pushsubscriptionchange replaced the subscription at the api"
    );
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT w.item_code, o.status, o.reason FROM outbox o JOIN watches w ON w.id = o.watch_id
         WHERE o.device_id = $1::uuid ORDER BY o.id",
    )
    .bind(&device)
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    let row = |item: &str, status: &str, reason: Option<&str>| {
        (
            item.to_owned(),
            status.to_owned(),
            reason.map(str::to_owned),
        )
    };
    assert_eq!(
        rows,
        vec![
            row("SKU-BROWSER", "sent", None),
            // Its withdrawal, when the price went back up to 15.00.
            row("SKU-BROWSER", "sent", None),
            row("SKU-FLICKER", "dropped", Some("condition_lost")),
            row("SKU-AFTER", "sent", None),
        ]
    );
    let sent: String = sqlx::query_scalar(
        "SELECT id::text FROM outbox WHERE device_id = $1::uuid ORDER BY id LIMIT 1",
    )
    .bind(&device)
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    assert_eq!(
        report["sent_id"],
        sent.as_str(),
        "the notification's tag is its row"
    );
    assert_eq!(
        report["notifications"][0]["url"], "https://shop.test/items/SKU-BROWSER",
        "a click opens the item"
    );
    p.stop().await;
    s.cleanup().await;
}
