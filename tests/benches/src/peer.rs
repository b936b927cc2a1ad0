//! The peer: what a team would run instead of Tidings, measured on the same machine, Postgres and
//! push sink. A Postgres job queue (graphile-worker) with one node worker process per core,
//! each sending its jobs as Web Push with `web-push` (`tests/benches/peer/worker.mjs`). This
//! process enqueues one job per notification, `job_key` as the dedup, at the offered rate, as
//! a detector would; the sink counts what it accepts and decrypts one push in 500, so the
//! peer's load is real Web Push too.
//!
//! The enqueuer keeps at most `backlog` jobs outstanding, so the queue is measured at its
//! saturated rate without a backlog that grows through the round (Tidings' surplus waits
//! before detection in the same way).

use crate::figures;
use crate::procstat::{CpuSplit, cpu_seconds, machine_busy_seconds, peak_rss_mib};
use chrono::{TimeDelta, Utc};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tidings_domain::messages::{Payload, Subscription};
use tidings_domain::notification::{Notice, render};
use tidings_domain::trigger::{Baseline, Observation, Trigger};
use tidings_domain::{ItemCode, OutboxId, WatchId};
use tidings_tests::fake_push::FakePushService;
use tidings_tests::harness::TestDb;

/// The peer's configuration: what `benchmarks.md` reports and the environment can change.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Worker processes (one per core).
    pub workers: usize,
    /// Jobs in flight per process.
    pub concurrency: usize,
    pub poll_ms: u64,
    /// Jobs fetched (and locked) by one query; -1: one at a time.
    pub local_queue: i64,
    /// Completions gathered this long into one statement; -1: each on its own.
    pub complete_batch_ms: i64,
    /// Jobs enqueued and not yet accepted by the sink, at most.
    pub backlog: u64,
}

impl Tuning {
    /// The tuned values (see benchmarks.md), each overridable: `PEER_WORKERS`,
    /// `PEER_CONCURRENCY`, `PEER_POLL_MS`, `PEER_LOCAL_QUEUE`, `PEER_COMPLETE_BATCH_MS`,
    /// `PEER_BACKLOG`.
    pub fn from_env() -> Self {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Tuning {
            workers: var("PEER_WORKERS", cores),
            concurrency: var("PEER_CONCURRENCY", 64),
            poll_ms: var("PEER_POLL_MS", 2000),
            local_queue: var("PEER_LOCAL_QUEUE", 128),
            complete_batch_ms: var("PEER_COMPLETE_BATCH_MS", 10),
            backlog: var("PEER_BACKLOG", 5000),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "workers": self.workers,
            "concurrency": self.concurrency,
            "poll_ms": self.poll_ms,
            "local_queue": self.local_queue,
            "complete_batch_ms": self.complete_batch_ms,
            "backlog": self.backlog,
        })
    }
}

/// The installed worker script (`deploy/local/stack` puts it beside its node modules).
fn script() -> String {
    std::env::var("TIDINGS_PEER_SCRIPT")
        .expect("TIDINGS_PEER_SCRIPT is unset: run through `deploy/local/stack bench peer`")
}

fn node(db: &TestDb, t: &Tuning) -> Command {
    let mut c = Command::new("node");
    c.arg(script())
        .env("DATABASE_URL", &db.url)
        .env("NO_LOG_SUCCESS", "1")
        .env("PEER_CONCURRENCY", t.concurrency.to_string())
        .env("PEER_POLL_MS", t.poll_ms.to_string())
        .env("PEER_LOCAL_QUEUE", t.local_queue.to_string())
        .env("PEER_COMPLETE_BATCH_MS", t.complete_batch_ms.to_string())
        .env(
            "NODE_EXTRA_CA_CERTS",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/tls/cert.pem"),
        );
    c
}

/// Starts a worker process and waits for its "ready".
fn start_worker(db: &TestDb, t: &Tuning) -> Child {
    let mut child = node(db, t)
        .stdout(Stdio::piped())
        .spawn()
        .expect("node: install it, or run through deploy/local/stack");
    let out = child.stdout.take().expect("stdout");
    let mut out = BufReader::new(out);
    loop {
        let mut line = String::new();
        let read = out.read_line(&mut line).expect("worker");
        assert!(read > 0, "the peer's worker ended before it was ready");
        if line.trim() == "ready" {
            break;
        }
        eprint!("peer: {line}");
    }
    // Whatever it prints later goes on to stderr (a closed pipe would end it).
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            eprintln!("peer: {line}");
        }
    });
    child
}

/// The worker processes, killed when dropped (also when a round panics).
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// A notification for item `k` as Tidings would render it, so both send payloads of one size.
fn payload(k: usize) -> Payload {
    let item = ItemCode::parse(&format!("ITEM-{k:06}")).expect("item code");
    let now = Utc::now();
    render(&Notice {
        id: OutboxId::new(),
        watch: WatchId::new(),
        trigger: &Trigger::PriceBelow { threshold: 1000 },
        item: &item,
        now: &Observation {
            price: 900,
            currency: "EUR".into(),
            in_stock: true,
            paused: false,
            observed_at: now,
            stock_stated: true,
        },
        baseline: &Baseline {
            price: Some(1500),
            reference: Some(1500),
            in_stock: Some(true),
        },
        valid_until: now + TimeDelta::minutes(20),
        item_url: None,
        locale: None,
    })
}

/// Enqueues jobs `from..to`, each a push to one of `subs` with its own `job_key`.
async fn enqueue(db: &TestDb, subs: &[Subscription], from: usize, to: usize) {
    let day = Utc::now().date_naive();
    let specs: Vec<Value> = (from..to)
        .map(|k| {
            let sub = &subs[k % subs.len()];
            let body = serde_json::to_string(&payload(k)).expect("payload");
            json!({
                "identifier": "push",
                "job_key": format!("w{k}:price_below:{day}"),
                "payload": {
                    "s": {"endpoint": sub.endpoint, "keys": {"p256dh": sub.p256dh, "auth": sub.auth}},
                    "b": body,
                    "t": format!("{k:x}"),
                },
            })
        })
        .collect();
    sqlx::query(
        "SELECT count(*) FROM graphile_worker.add_jobs(
             array(SELECT json_populate_recordset(null::graphile_worker.job_spec, $1::json)))",
    )
    .bind(Value::Array(specs))
    .execute(&db.pool)
    .await
    .expect("add_jobs");
}

/// CPU seconds so far of the worker processes, of Postgres, NATS and this process (sink and
/// enqueuer), and of the machine.
fn cpu(workers: &[Child]) -> (f64, CpuSplit, f64) {
    let peer = workers.iter().filter_map(|c| cpu_seconds(c.id())).sum();
    (peer, CpuSplit::now(), machine_busy_seconds())
}

/// One round: `rate` jobs/s offered for `secs` seconds (the first 5 warm up); returns the
/// figures.
pub async fn round(rate: usize, secs: u64, t: &Tuning) -> Value {
    let db = TestDb::empty().await.expect("database");
    let push = FakePushService::start_sink().await.expect("sink");
    push.set_sample(500);
    let subs: Vec<Subscription> = (0..16).map(|_| push.named_subscription()).collect();
    let migrated = node(&db, t).arg("migrate").status().expect("node");
    assert!(migrated.success(), "the peer's schema did not install");
    let mut workers = Workers(Vec::new());
    for _ in 0..t.workers {
        let w = start_worker(&db, t);
        workers.0.push(w);
    }

    let warmup = Duration::from_secs(5);
    let tick = Duration::from_millis(50);
    let started = Instant::now();
    let (mut enqueued, mut owed) = (0usize, 0.0f64);
    let mut before = None;
    while started.elapsed() < Duration::from_secs(secs) {
        if before.is_none() && started.elapsed() >= warmup {
            before = Some((cpu(&workers.0), push.hits()));
        }
        owed += rate as f64 * tick.as_secs_f64();
        let outstanding = enqueued.saturating_sub(push.hits()) as u64;
        let n = owed as usize;
        if n > 0 && outstanding < t.backlog {
            enqueue(&db, &subs, enqueued, enqueued + n).await;
            enqueued += n;
        }
        owed -= n as f64;
        tokio::time::sleep(tick).await;
    }
    let after = (cpu(&workers.0), push.hits());
    let ((peer0, split0, machine0), hits0) = before.expect("a round longer than its warm-up");
    let ((peer1, split1, machine1), hits1) = after;
    let window = (Duration::from_secs(secs) - warmup).as_secs_f64();
    let sent = (hits1 - hits0) as f64 / window;
    let shared = CpuSplit::between(split0, split1);
    let per_sent = |cpu_s: f64| figures::round(cpu_s / window * 1e6 / sent.max(1.0), 1);
    let rss: f64 = workers.0.iter().filter_map(|c| peak_rss_mib(c.id())).sum();
    drop(workers);
    let peer_cpu = peer1 - peer0;
    json!({
        "system": "graphile-worker + web-push",
        "offered_per_s": rate,
        "seconds": secs,
        "sent_per_s": figures::round(sent, 0),
        "cpu_us_per_sent": per_sent(peer_cpu + shared.postgres + shared.this),
        "machine_cpu_cores_busy": figures::round((machine1 - machine0) / window, 2),
        "outstanding_at_end": enqueued.saturating_sub(hits1),
        "decrypted_samples": push.received().len(),
        "rejected_samples": push.rejected().len(),
        "tuning": t.json(),
        "resources": {
            "peer workers (node)": {"cpu_us_per_sent": per_sent(peer_cpu), "peak_rss_mib": figures::round(rss, 1)},
            "postgres": {"cpu_us_per_sent": per_sent(shared.postgres)},
            "benchmark process (push sink, enqueuer)": {"cpu_us_per_sent": per_sent(shared.this)},
        },
    })
}
