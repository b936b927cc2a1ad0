//! How the api binary serves: public routes and operator routes on separate ports, and a drain
//! after SIGTERM during which it still answers but says it is not ready.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/openapi.rs"]
mod openapi;
#[path = "support/server.rs"]
mod server;

use openapi::Document;
use server::{ADMIN_TOKEN, ApiClient, test_settings};
use std::time::{Duration, Instant};
use tidings_api::Listeners;
use tidings_api_types::problem::Problem;
use tidings_testkit::harness::TestDb;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

async fn status(client: &ApiClient, path: &str, token: Option<&str>) -> u16 {
    client.get(path, token).await.status().as_u16()
}

#[tokio::test]
async fn operator_routes_and_metrics_answer_on_the_ops_port_only_and_the_api_drains_before_closing()
{
    let db = TestDb::new().await.unwrap();
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ops = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (public_addr, ops_addr) = (public.local_addr().unwrap(), ops.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    const DRAIN: Duration = Duration::from_millis(1500);
    let task = tokio::spawn(tidings_api::serve(
        Listeners {
            public,
            ops: Some(ops),
        },
        db.pool.clone(),
        test_settings(),
        DRAIN,
        shutdown.clone(),
    ));
    let public = ApiClient::new(format!("http://{public_addr}"));
    let ops = ApiClient::new(format!("http://{ops_addr}"));

    let admin = Some(ADMIN_TOKEN);
    assert_eq!(status(&public, "/v1/admin/outbox/stats", admin).await, 404);
    assert_eq!(status(&public, "/metrics", None).await, 404);
    assert_eq!(status(&public, "/v1/vapid-public-key", None).await, 200);
    // The public /readyz answers from the last check, which runs at start and every 2 s.
    let started = Instant::now();
    while status(&public, "/readyz", None).await != 200 {
        assert!(started.elapsed() < Duration::from_secs(5), "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let doc: Document = public
        .get("/openapi.json", None)
        .await
        .json()
        .await
        .unwrap();
    // Each port documents what it serves: a client generated from the public document calls
    // no route that answers 404 there.
    let paths = |doc: &Document| -> Vec<String> { doc.paths.keys().cloned().collect() };
    assert!(paths(&doc).contains(&"/v1/vapid-public-key".to_owned()));
    assert!(
        !paths(&doc)
            .iter()
            .any(|p| p.starts_with("/v1/admin") || p == "/metrics"),
        "{:?}",
        paths(&doc)
    );
    let schemes = |doc: &Document| -> Vec<String> {
        doc.components.security_schemes.keys().cloned().collect()
    };
    assert!(!schemes(&doc).contains(&"admin_token".to_owned()));
    let ops_doc: Document = ops.get("/openapi.json", None).await.json().await.unwrap();
    let ops_paths = paths(&ops_doc);
    for (path, served) in [
        ("/v1/admin/outbox/stats", true),
        ("/metrics", true),
        ("/v1/devices", false),
    ] {
        assert_eq!(ops_paths.contains(&path.to_owned()), served, "{path}");
    }
    assert!(schemes(&ops_doc).contains(&"admin_token".to_owned()));
    for (port, d) in [("public", &doc), ("ops", &ops_doc)] {
        for (path, item) in &d.paths {
            if path.contains('{') || !item.contains_key("get") {
                continue;
            }
            let served = path.clone();
            let on = if port == "public" { &public } else { &ops };
            let answer = on
                .get(&served, if port == "ops" { admin } else { None })
                .await;
            assert_ne!(
                answer.status(),
                404,
                "{port} documents {path}, which it does not serve"
            );
        }
    }

    assert_eq!(status(&ops, "/v1/admin/outbox/stats", admin).await, 200);
    assert_eq!(status(&ops, "/v1/admin/outbox/stats", None).await, 401);
    assert_eq!(status(&ops, "/metrics", None).await, 200);
    assert_eq!(status(&ops, "/readyz", None).await, 200);
    assert_eq!(status(&ops, "/v1/vapid-public-key", None).await, 404);

    // SIGTERM: unready at once, still serving for the drain, then closed.
    let stopped = Instant::now();
    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(status(&public, "/readyz", None).await, 503);
    assert_eq!(status(&ops, "/readyz", None).await, 503);
    assert_eq!(status(&public, "/v1/vapid-public-key", None).await, 200);
    task.await.unwrap().unwrap();
    let took = stopped.elapsed();
    assert!(took >= DRAIN, "closed after {took:?}, before the drain");
    assert!(
        took < DRAIN + Duration::from_secs(2),
        "closed only after {took:?}"
    );
    let fresh = reqwest::Client::new();
    assert!(
        fresh
            .get(format!("http://{public_addr}/livez"))
            .send()
            .await
            .is_err(),
        "the listener is closed"
    );
}

async fn serving(pool: sqlx::PgPool) -> (ApiClient, ApiClient, CancellationToken) {
    let public = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ops = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (public_addr, ops_addr) = (public.local_addr().unwrap(), ops.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_api::serve(
        Listeners {
            public,
            ops: Some(ops),
        },
        pool,
        test_settings(),
        Duration::ZERO,
        shutdown.clone(),
    ));
    (
        ApiClient::new(format!("http://{public_addr}")),
        ApiClient::new(format!("http://{ops_addr}")),
        shutdown,
    )
}

/// Anyone may call the public `/readyz`: it answers from the last check (refreshed every 2 s), so
/// a flood of anonymous probes costs the database nothing, and it never says why it is not
/// ready; the operator port's `/readyz`, where the kubelet probes, checks now and says why.
#[tokio::test]
async fn the_public_readyz_answers_without_a_query_and_without_a_reason() {
    let db = TestDb::new().await.unwrap();
    // One connection, which the test then holds: a probe that needed the database would wait.
    let pool = tidings_store::postgres(&db.url, 1).unwrap();
    let (public, _ops, shutdown) = serving(pool.clone()).await;
    let started = Instant::now();
    while status(&public, "/readyz", None).await != 200 {
        assert!(started.elapsed() < Duration::from_secs(15), "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = pool.acquire().await.unwrap();
    let probing = Instant::now();
    for _ in 0..50 {
        assert_eq!(status(&public, "/readyz", None).await, 200);
    }
    assert!(
        probing.elapsed() < Duration::from_secs(2),
        "50 public probes took {:?} with the pool's only connection held",
        probing.elapsed()
    );
    drop(held);
    shutdown.cancel();

    // A database that is not there.
    let port = tidings_testkit::brokers::free_port().unwrap();
    let gone =
        tidings_store::postgres(&format!("postgres://tidings@127.0.0.1:{port}/gone"), 1).unwrap();
    let (public, ops_gone, shutdown) = serving(gone).await;
    tokio::time::sleep(tidings_api::health::REFRESH + Duration::from_millis(500)).await;
    let answer = public.get("/readyz", None).await;
    assert_eq!(answer.status(), 503);
    let text = answer.text().await.unwrap();
    let body: Problem = serde_json::from_str(&text).unwrap();
    assert_eq!(body.detail, "not ready", "{body:?}");
    assert!(!text.contains(&port.to_string()), "{text}");
    let answer = ops_gone.get("/readyz", None).await;
    assert_eq!(answer.status(), 503);
    let body: Problem = answer.json().await.unwrap();
    assert!(
        body.detail.contains("Postgres"),
        "the ops port says why: {body:?}"
    );
    shutdown.cancel();
}
