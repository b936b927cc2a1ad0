//! Api benchmark: create-watch and list-watches requests/s under concurrent load, over HTTP,
//! against the real `tidings-api` binary (release build, started here) and real Postgres. Also
//! prints the CPU each request costs the api process and Postgres, so the figure can be read
//! apart from the load generator, which shares this 2-core machine. Each round also sends the
//! creates to a second api process started with `TIDINGS_API_CREATE_BATCH=1` (every create its own
//! statement), so the effect of sharing statements is measured in the same run.
//! Run with `deploy/local/stack bench api [REQUESTS] [CONCURRENCY] [ROUNDS]`.

use reqwest::Method;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tidings_benches::procstat::{cpu_seconds, cpu_seconds_named};
use tidings_tests::api::ApiClient;
use tidings_tests::harness::{TestDb, login_url};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Round {
    per_second: f64,
    api_us: f64,
    postgres_us: f64,
}

/// Sends `total` requests from `concurrency` tasks. Any non-2xx aborts the benchmark.
async fn drive(
    api: &ApiClient,
    pid: u32,
    tokens: &Arc<Vec<String>>,
    total: usize,
    concurrency: usize,
    create: bool,
) -> Round {
    let next = Arc::new(AtomicUsize::new(0));
    let (api_cpu, pg_cpu) = (
        cpu_seconds(pid).unwrap_or(0.0),
        cpu_seconds_named("postgres"),
    );
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
    let elapsed = started.elapsed().as_secs_f64();
    let per_request = |cpu: f64| cpu * 1e6 / total as f64;
    Round {
        per_second: total as f64 / elapsed,
        api_us: per_request(cpu_seconds(pid).unwrap_or(0.0) - api_cpu),
        postgres_us: per_request(cpu_seconds_named("postgres") - pg_cpu),
    }
}

fn start_api(database_url: &str, port: u16, create_batch: usize) -> Child {
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe.with_file_name("tidings-api");
    Command::new(&bin)
        .arg("serve")
        .env("DATABASE_URL", login_url(database_url, "api"))
        .env("TIDINGS_API_LISTEN", format!("127.0.0.1:{port}"))
        .env("TIDINGS_PUSH_ALLOWED_HOSTS", "127.0.0.1:*")
        .env("TIDINGS_PUSH_ALLOW_PRIVATE", "127.0.0.1:*")
        .env("TIDINGS_MAX_WATCHES_PER_DEVICE", "1000000")
        .env("TIDINGS_API_CREATE_BATCH", create_batch.to_string())
        // The benchmark is one client hammering on purpose, and it reads no metrics.
        .env("TIDINGS_API_REGISTER_RATE", "off")
        .env("TIDINGS_API_WATCH_RATE_PER_ADDRESS", "off")
        .env("TIDINGS_API_WATCH_RATE_PER_DEVICE", "off")
        .env("TIDINGS_OPS_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting {} (build it with cargo build --release -p tidings-api): {e}",
                bin.display()
            )
        })
}

fn report(name: &str, rounds: &[Round]) {
    let med = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    println!(
        "median {name:<13} {:>6.0} req/s   api {:>4.0} CPU µs/req   Postgres {:>4.0} CPU µs/req",
        med(|r| r.per_second),
        med(|r| r.api_us),
        med(|r| r.postgres_us)
    );
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let requests: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let concurrency: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);

    let db = TestDb::new().await.expect("database");
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port()
    };
    let (port, single_port) = (free_port(), free_port());
    let child = start_api(&db.url, port, 64);
    let single_child = start_api(&db.url, single_port, 1);
    let api = ApiClient::new(format!("http://127.0.0.1:{port}"));
    let single = ApiClient::new(format!("http://127.0.0.1:{single_port}"));
    for a in [&api, &single] {
        let ready = async {
            loop {
                if let Ok(r) = a.req(Method::GET, "/readyz", None).send().await
                    && r.status().is_success()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), ready)
            .await
            .expect("api ready within 20 s");
    }

    let devices = 1000;
    let mut tokens = Vec::with_capacity(devices);
    for _ in 0..devices / 50 {
        let regs = (0..50).map(|_| api.register());
        tokens.extend(
            futures::future::join_all(regs)
                .await
                .into_iter()
                .map(|(_, t)| t),
        );
    }
    let tokens = Arc::new(tokens);
    println!(
        "api benchmark: tidings-api (release) + Postgres + this load generator on one machine; \
         {requests} requests per round, {concurrency} concurrent clients, {devices} devices, {rounds} rounds"
    );
    let (mut creates, mut singles, mut lists) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let c = drive(&api, child.id(), &tokens, requests, concurrency, true).await;
        let one = drive(
            &single,
            single_child.id(),
            &tokens,
            requests,
            concurrency,
            true,
        )
        .await;
        let l = drive(&api, child.id(), &tokens, requests, concurrency, false).await;
        println!(
            "round {round}: create-watch {:>6.0} req/s ({:.0} + {:.0} µs)   one statement per create {:>6.0} req/s ({:.0} + {:.0} µs)   list-watches {:>6.0} req/s ({:.0} + {:.0} µs)",
            c.per_second,
            c.api_us,
            c.postgres_us,
            one.per_second,
            one.api_us,
            one.postgres_us,
            l.per_second,
            l.api_us,
            l.postgres_us
        );
        creates.push(c);
        singles.push(one);
        lists.push(l);
    }
    report("create-watch", &creates);
    report(
        "  one statement per create (TIDINGS_API_CREATE_BATCH=1)",
        &singles,
    );
    report("list-watches", &lists);
    let ratio = median(
        creates
            .iter()
            .zip(&singles)
            .map(|(c, s)| c.per_second / s.per_second)
            .collect(),
    );
    println!("median ratio of create-watch rates, shared statements / one per create: {ratio:.2}");
    for mut c in [child, single_child] {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(db);
}
