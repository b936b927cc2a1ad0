//! Change-hint benchmark, with the real api and detector binaries over the fake catalog's JSON
//! API (the `shop` source, conditional requests on):
//!
//! 1. **Latency**: RATE signed hints a second for SECONDS, each naming one item whose price just
//!    fell below its watch's threshold, through `POST /v1/items/changed`; the time from a hint's
//!    POST to its EnqueueRequest on the enqueue subject, p50 / p99, with the scan interval at 1 h.
//! 2. **Detector CPU, hints vs polling**: WATCHES watches, 1 % of their items changing every 10 s
//!    for 60 s; the detector polls every 10 s, or scans hourly and is hinted each change (over
//!    NATS). Alternating rounds; CPU per 1,000 watches per minute, after the first scan.
//!
//! Run with `deploy/local/stack bench hints [RATE=1000] [SECONDS=20] [WATCHES=10000]`.

use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidings_benches::procstat::cpu_seconds;
use tidings_domain::WatchId;
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_signatures::Secret;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{HINT_SECRETS, Pipeline};

const HIGH: i64 = 1300;
const LOW: i64 = 1100;

fn code(i: usize) -> String {
    format!("H-{i:06}")
}

/// `n` watches, one per item `shop:H-…`, all at `HIGH` in the catalog; watch id → index.
async fn watches(s: &Scenario, n: usize) -> HashMap<WatchId, usize> {
    let first = s
        .watcher(
            "shop:H-000000",
            Trigger::PriceBelow { threshold: 1200 },
            HIGH,
        )
        .await;
    let codes: Vec<String> = (1..n).map(|i| format!("shop:{}", code(i))).collect();
    tidings_benches::seed::watches(&s.db.pool, first.device.id.0, &codes, 1200, HIGH)
        .await
        .expect("insert watches");
    for i in 0..n {
        s.catalog.set_price(&code(i), HIGH);
    }
    let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as("SELECT id, item_code FROM watches")
        .fetch_all(&s.db.pool)
        .await
        .expect("read watches");
    rows.into_iter()
        .filter_map(|(id, item)| {
            let i = item.strip_prefix("shop:H-")?.parse().ok()?;
            Some((WatchId(id), i))
        })
        .collect()
}

/// The pipeline's sources file with the shop's hints allowed `rate` items a second.
fn sources_file(s: &Scenario, rate: usize) -> String {
    let dir = std::env::temp_dir().join(format!("tidings-bench-hints-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let secrets = dir.join("secrets");
    std::fs::write(&secrets, HINT_SECRETS[0]).expect("secrets");
    let mut file = s.catalog.sources_file();
    for source in file["sources"].as_array_mut().into_iter().flatten() {
        source["hint_secrets_file"] = secrets.display().to_string().into();
        source["hint_rate"] = rate.into();
    }
    let path = dir.join("sources.json");
    std::fs::write(&path, file.to_string()).expect("sources");
    path.display().to_string()
}

async fn metric(p: &Pipeline, service: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", p.ops_url(service)))
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn first_scan(p: &Pipeline) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(p, "detector", "tidings_detector_scans_total").await < 1.0 {
        assert!(Instant::now() < deadline, "no first scan in 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Standard Webhooks headers for `body`.
fn sign(secret: &Secret, id: &str, body: &str) -> [(&'static str, String); 3] {
    let at = chrono::Utc::now().timestamp();
    [
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", at.to_string()),
        ("webhook-signature", secret.sign(id, at, body.as_bytes())),
    ]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Arrival time of each watch's first EnqueueRequest on the enqueue subject.
fn enqueued_at(
    nats: async_nats::Client,
    subject: String,
) -> (
    Arc<Mutex<HashMap<WatchId, Instant>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen: Arc<Mutex<HashMap<WatchId, Instant>>> = Arc::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut sub = nats.subscribe(subject).await.expect("subscribe");
        while let Some(m) = sub.next().await {
            let now = Instant::now();
            let Ok(requests) = tidings_domain::messages::decode_enqueues(&m.payload) else {
                continue;
            };
            let mut seen = out.lock().unwrap_or_else(|e| e.into_inner());
            for r in requests {
                seen.entry(r.watch_id).or_insert(now);
            }
        }
    });
    (seen, task)
}

async fn latency(rate: usize, secs: usize) {
    let s = Scenario::new().await;
    let n = rate * secs;
    let index = watches(&s, n).await;
    let file = sources_file(&s, rate * 10);
    let p = Pipeline::start_only(
        &s,
        &["api", "detector"],
        &[
            ("TIDINGS_SCAN_INTERVAL", "1h"),
            ("TIDINGS_SOURCES_FILE", &file),
            ("TIDINGS_DETECTOR_HOLD_BACKLOG", "0"),
            ("RUST_LOG", "warn"),
        ],
    )
    .await;
    first_scan(&p).await;
    let nats = tidings_tests::harness::nats().await.expect("nats");
    let (seen, listener) = enqueued_at(nats, s.subjects.all(StreamKind::Enqueue));
    let key = Secret::parse(HINT_SECRETS[0]).expect("secret");
    let client = reqwest::Client::new();
    let url = format!("{}/v1/items/changed", p.url("api"));
    let cpu_before: Vec<f64> = ["api", "detector"]
        .iter()
        .map(|s| p.pid(s).and_then(cpu_seconds).unwrap_or(0.0))
        .collect();
    let started = Instant::now();
    let mut sent = Vec::with_capacity(n);
    let mut posts = Vec::with_capacity(n);
    for i in 0..n {
        let at = started + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(at.into()).await;
        s.catalog.set_price(&code(i), LOW);
        let body = format!(r#"{{"items": ["{}"]}}"#, code(i));
        let mut request = client.post(&url).header("content-type", "application/json");
        for (k, v) in sign(&key, &format!("bench-{i}"), &body) {
            request = request.header(k, v);
        }
        sent.push(Instant::now());
        posts.push(tokio::spawn(request.body(body).send()));
    }
    let offered = started.elapsed().as_secs_f64();
    let mut refused = 0;
    for post in posts {
        let ok = matches!(post.await, Ok(Ok(r)) if r.status() == 202);
        refused += usize::from(!ok);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().map(|m| m.len()).unwrap_or(0) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu: Vec<f64> = ["api", "detector"]
        .iter()
        .zip(&cpu_before)
        .map(|(s, before)| p.pid(s).and_then(cpu_seconds).unwrap_or(0.0) - before)
        .collect();
    listener.abort();
    let seen = seen.lock().map(|m| m.clone()).unwrap_or_default();
    let mut lat: Vec<f64> = seen
        .iter()
        .filter_map(|(w, at)| Some(at.duration_since(sent[*index.get(w)?]).as_secs_f64() * 1000.0))
        .collect();
    lat.sort_by(f64::total_cmp);
    println!(
        "  latency: {n} hints offered at {:.0}/s ({refused} not answered 202); {} enqueued; hint POST → EnqueueRequest p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        n as f64 / offered,
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
    );
    println!(
        "  CPU per hint: api {:.0} µs, detector {:.0} µs",
        cpu[0] / n as f64 * 1e6,
        cpu[1] / n as f64 * 1e6
    );
    p.stop().await;
    s.cleanup().await;
}

/// One 60 s round: detector CPU seconds and catalog requests, polling or hinted.
async fn round(n: usize, hinted: bool) -> (f64, u64) {
    let s = Scenario::new().await;
    watches(&s, n).await;
    let file = sources_file(&s, n);
    let interval = if hinted { "1h" } else { "10s" };
    let p = Pipeline::start_only(
        &s,
        &["detector"],
        &[
            ("TIDINGS_SCAN_INTERVAL", interval),
            ("TIDINGS_SOURCES_FILE", &file),
            ("RUST_LOG", "warn"),
        ],
    )
    .await;
    first_scan(&p).await;
    let nats = tidings_tests::harness::nats().await.expect("nats");
    let before = p.pid("detector").and_then(cpu_seconds).unwrap_or(0.0);
    let (asked_before, _) = s.catalog.requests();
    let started = Instant::now();
    for step in 0..6 {
        tokio::time::sleep_until((started + Duration::from_secs(10 * step)).into()).await;
        // 1 % of the items move, staying above the threshold.
        let moved: Vec<String> = (0..n)
            .filter(|i| i % 100 == usize::try_from(step).unwrap_or(0))
            .map(code)
            .collect();
        for c in &moved {
            s.catalog
                .set_price(c, HIGH + 1 + i64::try_from(step).unwrap_or(0));
        }
        if hinted {
            for chunk in moved.chunks(tidings_domain::hints::MAX_ITEMS) {
                let body = serde_json::json!({"items": chunk}).to_string();
                nats.publish(s.subjects.hints("shop"), body.into())
                    .await
                    .expect("hint");
            }
            nats.flush().await.expect("flush");
        }
    }
    tokio::time::sleep_until((started + Duration::from_secs(60)).into()).await;
    let cpu = p.pid("detector").and_then(cpu_seconds).unwrap_or(0.0) - before;
    let (asked, _) = s.catalog.requests();
    p.stop().await;
    s.cleanup().await;
    (cpu, asked - asked_before)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: usize| args.next().and_then(|a| a.parse().ok()).unwrap_or(default);
    let (rate, secs, n) = (arg(1000), arg(20), arg(10_000));
    println!(
        "hints benchmark: {rate} hints/s for {secs} s; {n} watches for the CPU rounds; release build"
    );
    latency(rate, secs).await;
    let per = |cpu: f64| cpu * 1000.0 / (n as f64 / 1000.0);
    for r in 1..=2 {
        for hinted in [false, true] {
            let (cpu, asked) = round(n, hinted).await;
            println!(
                "  round {r}, {}: detector {:.1} ms CPU per 1,000 watches per minute; {asked} catalog requests",
                if hinted {
                    "hinted, scan every 1 h"
                } else {
                    "polling every 10 s"
                },
                per(cpu)
            );
        }
    }
}
