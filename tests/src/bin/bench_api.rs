//! Api benchmark: create-watch and list-watches requests/s under concurrent load, over HTTP
//! against real Postgres. The api runs in this process on its own runtime (2 worker threads);
//! the client (reqwest, keep-alive) shares the machine, so the figures include its cost.
//! Run with `deploy/local/stack bench api [REQUESTS] [CONCURRENCY] [ROUNDS]`.

use reqwest::Method;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tidings_api::Settings;
use tidings_tests::api::{ApiServer, test_settings};
use tidings_tests::harness::TestDb;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Sends `total` requests from `concurrency` tasks; returns requests/s. Any non-2xx aborts.
async fn drive(
    api: &Arc<ApiServer>,
    tokens: &Arc<Vec<String>>,
    total: usize,
    concurrency: usize,
    create: bool,
) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (api, tokens, next) = (api.clone(), tokens.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let token = &tokens[i % tokens.len()];
                    let r = if create {
                        api.req(Method::POST, "/v1/watches", Some(token))
                            .json(&json!({
                                "item_code": format!("SKU-{}", i % 5000),
                                "triggers": [{"kind": "price_below", "threshold": 1000 + (i % 100) as i64}],
                            }))
                            .send()
                            .await
                    } else {
                        api.req(Method::GET, "/v1/watches?limit=20", Some(token))
                            .send()
                            .await
                    };
                    let r = r.expect("request");
                    assert!(r.status().is_success(), "{}", r.status());
                    r.bytes().await.expect("body");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let requests: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let concurrency: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);

    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let db = client_rt.block_on(TestDb::new()).expect("database");
    let settings = Settings {
        max_watches_per_device: 1_000_000,
        ..test_settings()
    };
    let pool = db.pool.clone();
    let api = server_rt.block_on(async move {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(
                std::env::var("BENCH_API_POOL")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(16),
            )
            .connect_with(pool.connect_options().as_ref().clone())
            .await
            .expect("api pool");
        ApiServer::start(pool, settings).await
    });
    let api = Arc::new(api);

    client_rt.block_on(async {
        let devices = 1000;
        let mut tokens = Vec::with_capacity(devices);
        for chunk in (0..devices).collect::<Vec<_>>().chunks(50) {
            let regs = chunk.iter().map(|_| api.register());
            for (_, t) in futures::future::join_all(regs).await {
                tokens.push(t);
            }
        }
        let tokens = Arc::new(tokens);
        println!(
            "api benchmark: {requests} requests per round, {concurrency} concurrent clients, {devices} devices, {rounds} rounds"
        );
        let (mut creates, mut lists) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let c = drive(&api, &tokens, requests, concurrency, true).await;
            let l = drive(&api, &tokens, requests, concurrency, false).await;
            println!("round {round}: create-watch {c:>8.0} req/s   list-watches {l:>8.0} req/s");
            creates.push(c);
            lists.push(l);
        }
        println!(
            "median: create-watch {:.0} req/s, list-watches {:.0} req/s",
            median(creates),
            median(lists)
        );
    });
    drop(db);
}
