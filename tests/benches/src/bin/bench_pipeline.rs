//! The whole pipeline under load, and the stale-alert comparison. Real release binaries (api,
//! detector, dispatcher, pusher), Postgres, NATS, a fake catalog whose prices move on a
//! timeline, and a local HTTPS push sink (201; one push in 500 fully verified and decrypted),
//! all on this machine. Run with `deploy/local/stack bench pipeline [RATE] [SECONDS] [only-load]`;
//! `… [RATE] [SECONDS] channels [ROUNDS]` runs phase 1 to Web Push, to signed webhooks (a
//! local HTTPS webhook sink) and to email (DKIM-signed, submitted to a local SMTP server,
//! aiosmtpd, that keeps nothing) in alternating rounds, side by side.
//!
//! 1. Throughput: RATE notifications/s offered (items fall below their watches' threshold on a
//!    schedule; the detector finds them) for SECONDS; notifications reaching `sent` per second in
//!    the steady window, each stage's rate, the backlog in front of each stage, CPU and peak RSS
//!    per service; Postgres's buffers, WAL (bytes, records, full-page images) and row versions
//!    (inserted, updated, HOT) per notification, and the statements it spent the most executor
//!    time on (from `pg_stat_statements`, which the local stack loads; wall time, so at
//!    saturation it also counts waiting for a core and is no CPU figure).
//! 2. Latency at half the measured maximum: detection → `sent` p50/p95/p99.
//! 3. Stale alerts: the same price series (items dip below the threshold and recover after 0.3 s
//!    to 2 min; one push in four is refused once with 503 + Retry-After: 2) through Tidings and
//!    through a naive mode (detector → a forwarder that sends on detection and retries the same
//!    message, → the same pusher). Deliveries whose condition no longer held when the push
//!    service accepted them are stale.
//!
//!    Then its digest variant: the same dips watched by readers with a digest at +60 s, whose
//!    entries are judged when the push service accepted the digest, against a digest released
//!    without a re-check (`… digests [ROUNDS]` runs it alone).
//!
//! Prints a Markdown summary and writes the figures as JSON (`target/bench-pipeline.json`, or
//! `BENCH_PIPELINE_JSON`).

use async_nats::jetstream::{self, consumer::pull};
use chrono::Utc;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidings_benches::figures::{median, round};
use tidings_benches::pgstat::{PgCounters, Statements};
use tidings_benches::procstat::{
    CpuSplit, cpu_seconds, machine_busy_seconds, peak_rss_mib, pids_named,
};
use tidings_benches::push::first_attempt;
use tidings_benches::rng::Rng;
use tidings_domain::messages::{
    Outcome, PushRequest, Subscription, decode_enqueues, decode_results, encode,
};
use tidings_domain::notification::{Notice, render};
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_domain::validity;
use tidings_domain::{Channel, ItemCode, OutboxId, WatchId};
use tidings_signatures::Secret;
use tidings_tests::fake_catalog::Item;
use tidings_tests::fake_push::{FakePushService, NAMED_HOSTS};
use tidings_tests::fake_smtp::{FakeSmtp, SmtpOptions};
use tidings_tests::fake_webhooks::FakeWebhookReceiver;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;
use tokio_util::sync::CancellationToken;

const THRESHOLD: i64 = 1000;
const HIGH: i64 = 1500;
const LOW: i64 = 900;
const PER_ITEM: usize = 50;

/// The services' log filter: `warn`, or what `TIDINGS_BENCH_LOG` names (production runs at
/// `info`, where the pusher writes a line per push).
fn service_log() -> String {
    std::env::var("TIDINGS_BENCH_LOG").unwrap_or_else(|_| "warn".into())
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Devices (one per item), subscriptions on the sink, and `per_item` price_below watches per
/// item, in three statements.
/// `per_item` watches on each of `items`, a device each, withdrawals on or off.
async fn add_watches(
    s: &Scenario,
    subs: &[Subscription],
    items: &[String],
    (per_item, withdraw): (usize, bool),
) {
    let devices: Vec<uuid::Uuid> = items.iter().map(|_| uuid::Uuid::now_v7()).collect();
    let pool = &s.db.pool;
    sqlx::query(
        "INSERT INTO devices (id, token_hash, time_zone)
         SELECT d, decode(md5(d::text) || md5(d::text || 'x'), 'hex'), 'UTC' FROM unnest($1::uuid[]) d",
    )
    .bind(&devices)
    .execute(pool)
    .await
    .expect("devices");
    let (endpoints, keys, auths): (Vec<String>, Vec<String>, Vec<String>) = devices
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let sub = &subs[i % subs.len()];
            (sub.endpoint.clone(), sub.p256dh.clone(), sub.auth.clone())
        })
        .fold(
            (vec![], vec![], vec![]),
            |(mut a, mut b, mut c), (x, y, z)| {
                a.push(x);
                b.push(y);
                c.push(z);
                (a, b, c)
            },
        );
    sqlx::query(
        "INSERT INTO push_subscriptions (id, device_id, endpoint, p256dh, auth)
         SELECT gen_random_uuid(), d, e, k, a FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS u(d, e, k, a)",
    )
    .bind(&devices)
    .bind(endpoints)
    .bind(keys)
    .bind(auths)
    .execute(pool)
    .await
    .expect("subscriptions");
    sqlx::query(
        "INSERT INTO watches (id, device_id, item_code, triggers, reference_price, withdraw)
         SELECT gen_random_uuid(), d, i, $3, $4, $6
         FROM unnest($1::uuid[], $2::text[]) AS u(d, i), generate_series(1, $5)",
    )
    .bind(&devices)
    .bind(items)
    .bind(json!([{"kind": "price_below", "threshold": THRESHOLD}]))
    .bind(HIGH)
    .bind(i32::try_from(per_item).unwrap_or(1))
    .bind(withdraw)
    .execute(pool)
    .await
    .expect("watches");
    // Statistics, as a database that has held its watches a while has them. Without them the
    // detector's first load planned each page as a join of every watch and a sort (about 200 ms
    // a page at 240,000 watches, against 5 ms), so at high rates it started detecting some
    // seconds late and caught up inside the measured window.
    sqlx::query("ANALYZE devices, push_subscriptions, watches")
        .execute(pool)
        .await
        .expect("analyze");
}

fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

async fn scrape(p: &Pipeline, name: &str) -> HashMap<String, f64> {
    match reqwest::get(format!("{}/metrics", p.ops_url(name))).await {
        Ok(r) => parse_metrics(&r.text().await.unwrap_or_default()),
        Err(_) => HashMap::new(),
    }
}

fn sum(m: &HashMap<String, f64>, prefix: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

/// Messages waiting in a work-queue stream (the push stream).
async fn stream_len(js: &jetstream::Context, s: &Scenario, kind: StreamKind) -> u64 {
    match js.get_stream(s.subjects.stream(kind)).await {
        Ok(st) => st.cached_info().state.messages,
        Err(_) => 0,
    }
}

/// A CPU reading: each service, Postgres + NATS + this process (the push sink, the fake catalog
/// and the benchmark's own queries), and the whole machine.
struct Cpu {
    services: HashMap<&'static str, f64>,
    split: CpuSplit,
    machine: f64,
}

fn cpu(p: &Pipeline, services: &[&'static str]) -> Cpu {
    Cpu {
        services: services
            .iter()
            .map(|s| (*s, p.pid(s).and_then(cpu_seconds).unwrap_or(0.0)))
            .collect(),
        split: CpuSplit::now(),
        machine: machine_busy_seconds(),
    }
}

/// Every service's `/metrics`, parsed.
async fn scrape_all(
    p: &Pipeline,
    services: &[&'static str],
) -> HashMap<&'static str, HashMap<String, f64>> {
    let mut m = HashMap::new();
    for n in services {
        m.insert(*n, scrape(p, n).await);
    }
    m
}

/// Offers `rate` notifications/s for `secs` seconds; returns the measured figures.
/// Makes every device a webhook endpoint on `url` (its watches and subscription too).
async fn to_webhooks(s: &Scenario, url: &str) {
    let (_, secret) = Secret::generate().expect("secret");
    for statement in [
        "UPDATE devices SET channel = 'webhook'",
        "UPDATE watches SET channel = 'webhook'",
        "UPDATE push_subscriptions SET channel = 'webhook', endpoint = $1, secret = $2,
                p256dh = NULL, auth = NULL",
    ] {
        sqlx::query(statement)
            .bind(url)
            .bind(&secret)
            .execute(&s.db.pool)
            .await
            .expect("webhook endpoints");
    }
}

/// Makes every device an email device at its own confirmed address (`bench-N@sink.test`), with a
/// link key (unsealed: the bench gives no sealing keys).
async fn to_email(s: &Scenario) {
    let (_, key) = tidings_email::links::LinkKey::generate().expect("link key");
    for statement in [
        "UPDATE devices SET channel = 'email'",
        "UPDATE watches SET channel = 'email'",
        "UPDATE push_subscriptions SET channel = 'email', secret = $1, p256dh = NULL, auth = NULL,
                unconfirmed = false, endpoint = 'mailto:bench-' || left(id::text, 8) || '@sink.test'",
    ] {
        sqlx::query(statement)
            .bind(&key)
            .execute(&s.db.pool)
            .await
            .expect("email devices");
    }
}

/// Phase 1 (and 2): RATE notifications/s through the pipeline to `channel`'s sink.
async fn load_phase(rate: usize, secs: u64, channel: Channel) -> Value {
    let s = Scenario::new().await;
    let push = FakePushService::start_sink().await.expect("sink");
    let hooks = FakeWebhookReceiver::start_sink()
        .await
        .expect("webhook sink");
    push.set_sample(500);
    let subs: Vec<Subscription> = (0..16).map(|_| push.named_subscription()).collect();
    let items_per_sec = rate.div_ceil(PER_ITEM).max(1);
    let n_items = items_per_sec * usize::try_from(secs).unwrap_or(60);
    let items: Vec<String> = (0..n_items).map(|i| format!("ITEM-{i:06}")).collect();
    for code in &items {
        s.catalog.set_price(code, HIGH);
    }
    add_watches(&s, &subs, &items, (PER_ITEM, true)).await;
    if channel == Channel::Webhook {
        to_webhooks(&s, &hooks.url("bench")).await;
    }
    let sink = SmtpOptions {
        sink: true,
        ..SmtpOptions::default()
    };
    let smtp = FakeSmtp::start(&sink).expect("smtp sink");
    let dkim = tidings_benches::dkim_key_file("tidings-bench-dkim");
    if channel == Channel::Email {
        to_email(&s).await;
    }
    let (smtp_port, dkim_file) = (smtp.port.to_string(), dkim.setting());
    // How often the detector scans: each scan finds what changed since the last one, page by
    // page (`BENCH_SCAN_INTERVAL`, default 1s).
    let scan_interval = std::env::var("BENCH_SCAN_INTERVAL").unwrap_or_else(|_| "1s".into());
    // The share of the interval a scan spreads its pages over (`BENCH_SCAN_SPREAD`, percent;
    // the detector's default unless set): at 0 each scan publishes what it finds in one burst,
    // which the rest of the pipeline queues behind.
    let scan_spread = std::env::var("BENCH_SCAN_SPREAD")
        .unwrap_or_else(|_| tidings_benches::detector_defaults().scan_spread.to_string());
    // The dispatcher's own default poll unless `BENCH_POLL_INTERVAL` says otherwise (the tests'
    // 20 ms would be a setting no deployment runs): new rows wake it, so the poll only times
    // idle looks and rows that come due by the clock.
    let poll_interval = std::env::var("BENCH_POLL_INTERVAL").unwrap_or_else(|_| {
        let poll = tidings_benches::dispatcher_defaults().poll_interval;
        format!("{}ms", poll.as_millis())
    });
    let expected = n_items * PER_ITEM;
    let services = ["api", "dispatcher", "pusher", "detector"];
    let p = Pipeline::start(
        &s,
        &[
            ("TIDINGS_SCAN_INTERVAL", &scan_interval),
            ("TIDINGS_SCAN_SPREAD", &scan_spread),
            ("RUST_LOG", &service_log()),
            ("TIDINGS_POLL_INTERVAL", &poll_interval),
            ("TIDINGS_PUSH_ALLOWED_HOSTS", NAMED_HOSTS),
            // The sink's endpoints name `localhost`, a private address the guard refuses
            // unless allowed by name (regression: every push of a run ended `failed`,
            // `endpoint_refused`, once the guard matched private hosts by name).
            ("TIDINGS_PUSH_ALLOW_PRIVATE", NAMED_HOSTS),
            // One receiver stands for every endpoint, as one push sink does for every push
            // service: as many in flight as the push sink gets.
            ("TIDINGS_WEBHOOK_CONCURRENCY_PER_HOST", "256"),
            // The same for email: every address is at one sink domain.
            ("TIDINGS_EMAIL_CONCURRENCY_PER_DOMAIN", "256"),
            ("TIDINGS_SMTP_HOST", "127.0.0.1"),
            ("TIDINGS_SMTP_PORT", &smtp_port),
            ("TIDINGS_SMTP_SECURITY", "plain"),
            ("TIDINGS_SMTP_IDLE_CONNECTIONS", "64"),
            (
                "TIDINGS_EMAIL_FROM",
                "Tidings bench <bench@tidings.invalid>",
            ),
            ("TIDINGS_DKIM_KEY_FILE", &dkim_file),
        ],
    )
    .await;
    let js = jetstream::new(tidings_tests::harness::nats().await.expect("nats"));

    // The schedule: items fall below the threshold evenly over the window, in an order spread
    // over the catalog (a seeded shuffle), as real price changes are: taken in item order, each
    // second's changes were neighbours, all on one of the detector's pages.
    let start = now_ms() + 3000;
    let mut order: Vec<&String> = items.iter().collect();
    let mut rng = Rng(58);
    for i in (1..order.len()).rev() {
        let j = usize::try_from(rng.between(0, i as u64 + 1)).unwrap_or(i);
        order.swap(i, j);
    }
    // The codes in the order they fall, for the change → `sent` figure below.
    let falls: Vec<String> = order.iter().map(|c| (*c).clone()).collect();
    for (k, code) in order.into_iter().enumerate() {
        let at = start + i64::try_from(k * 1000 / items_per_sec).unwrap_or(0);
        s.catalog.set(
            code,
            Item {
                timeline: vec![(at, LOW)],
                ..Item::priced(HIGH)
            },
        );
    }
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(start - now_ms()).unwrap_or(0),
    ))
    .await;
    let warmup = 5;
    tokio::time::sleep(Duration::from_secs(warmup)).await;
    // Postgres's counters are read outside the CPU window, so their queries do not count in it.
    let pg_before = PgCounters::read(&s.db.pool).await;
    let statements_before = Statements::read(&s.db.pool).await;
    let before = scrape_all(&p, &services).await;
    let cpu_before = cpu(&p, &services);
    let window = secs - warmup;
    tokio::time::sleep(Duration::from_secs(window)).await;
    let after = scrape_all(&p, &services).await;
    let cpu_after = cpu(&p, &services);
    let pg_after = PgCounters::read(&s.db.pool).await;
    let statements_after = Statements::read(&s.db.pool).await;
    let shared = CpuSplit::between(cpu_before.split, cpu_after.split);
    let due: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE status IN ('pending', 'retry') AND next_attempt_at <= now()",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap_or(0);
    let backlog = json!({
        "enqueue_stream (ingest's input)":
            s.unacked(StreamKind::Enqueue, tidings_dispatcher::ingest::CONSUMER).await,
        "outbox_due (dispatch's input)": due,
        "push_stream (pusher's input)": stream_len(&js, &s, StreamKind::Push).await,
        "result_stream (results' input)":
            s.unacked(StreamKind::Result, tidings_dispatcher::results::CONSUMER).await,
    });
    let w = window as f64;
    let delta =
        |svc: &str, prefix: &str| (sum(&after[svc], prefix) - sum(&before[svc], prefix)) / w;
    // The pusher's request time (encryption to response): with a fixed number in flight, it is
    // what bounds the push stage when that stage is not short of CPU.
    let push_requests = delta("pusher", "tidings_push_duration_seconds_count");
    let push_ms = if push_requests > 0.0 {
        1000.0 * delta("pusher", "tidings_push_duration_seconds_sum") / push_requests
    } else {
        0.0
    };
    let stages = json!({
        "detect (published)": delta("detector", "tidings_detections_total{result=\"published\""),
        "ingest": delta("dispatcher", "tidings_ingested_total{result=\"new\""),
        "dispatch": delta("dispatcher", "tidings_outbox_transitions_total{to=\"sending\""),
        "push": delta("pusher", "tidings_push_requests_total{outcome=\"delivered\""),
        "results (sent)": delta("dispatcher", "tidings_outbox_transitions_total{to=\"sent\""),
    });
    let sent_window: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE status = 'sent'
         AND finished_at >= to_timestamp($1::float8 / 1000) AND finished_at < to_timestamp($2::float8 / 1000)",
    )
    .bind((start + 1000 * i64::try_from(warmup).unwrap_or(0)) as f64)
    .bind((start + 1000 * i64::try_from(secs).unwrap_or(0)) as f64)
    .fetch_one(&s.db.pool)
    .await
    .unwrap_or(0);
    let sent_per_s = sent_window as f64 / w;
    // Each process's CPU in the window, as cores and per notification sent (what alternating
    // rounds compare), with its peak memory.
    let usage = |cpu_s: f64, rss: Option<f64>| {
        let cores = cpu_s / w;
        let mut u = json!({"cpu_cores": round(cores, 2),
                           "cpu_us_per_sent": round(cores * 1e6 / sent_per_s.max(1.0), 1)});
        if let Some(rss) = rss {
            u["peak_rss_mib"] = json!(round(rss, 1));
        }
        u
    };
    let rss_of = |name| Some(pids_named(name).into_iter().filter_map(peak_rss_mib).sum());
    let per_service: Value = services
        .iter()
        .map(|n| {
            let cpu = cpu_after.services[n] - cpu_before.services[n];
            let rss = p.pid(n).and_then(peak_rss_mib).unwrap_or(0.0);
            (n.to_string(), usage(cpu, Some(rss)))
        })
        .chain([
            (
                "postgres".into(),
                usage(shared.postgres, rss_of("postgres")),
            ),
            (
                "nats-server".into(),
                usage(shared.nats, rss_of("nats-server")),
            ),
            (
                "benchmark process (push sink, catalog)".into(),
                usage(shared.this, None),
            ),
        ])
        .collect::<serde_json::Map<_, _>>()
        .into();
    // All the CPU the pipeline used (services, Postgres, NATS, sink and catalog) per notification
    // sent in the window: 2 cores divided by it is the most this machine could send.
    let pipeline_cores = (services
        .iter()
        .map(|n| cpu_after.services[n] - cpu_before.services[n])
        .sum::<f64>()
        + shared.total())
        / w;
    let cpu_us_per_sent = pipeline_cores * 1e6 / sent_per_s.max(1.0);
    let machine_cores = (cpu_after.machine - cpu_before.machine) / w;

    // Drain, then latency over everything detected in the window.
    let drain_until = now_ms() + 90_000;
    while !drained(&p, &s.db.pool, expected).await && now_ms() <= drain_until {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (p50, p95, p99, n_lat): (Option<f64>, Option<f64>, Option<f64>, i64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.95) WITHIN GROUP (ORDER BY d),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY d), count(*)
         FROM (SELECT EXTRACT(EPOCH FROM finished_at - detected_at)::float8 AS d FROM outbox
               WHERE status = 'sent' AND detected_at >= to_timestamp($1::float8 / 1000)) t",
    )
    .bind((start + 1000 * i64::try_from(warmup).unwrap_or(0)) as f64)
    .fetch_one(&s.db.pool)
    .await
    .unwrap_or((None, None, None, 0));
    // From the price change (the k-th of `falls` at `start + k * 1000 / items_per_sec` ms) to `sent`,
    // for the items that fell in the window: unlike detection → `sent`, it counts the time a
    // change waited to be detected, which is where scans that wait behind a deep enqueue stream
    // put the surplus.
    let (c50, c95, c99, n_change): (Option<f64>, Option<f64>, Option<f64>, i64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.95) WITHIN GROUP (ORDER BY d),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY d), count(*)
         FROM (SELECT EXTRACT(EPOCH FROM o.finished_at
                      - to_timestamp(($1::float8 + (k * 1000 / $2::bigint)) / 1000))::float8 AS d
               FROM outbox o
               JOIN (SELECT w.id, f.n - 1 AS k FROM watches w
                     JOIN unnest($5::text[]) WITH ORDINALITY AS f(code, n) ON f.code = w.item_code) w
                 ON w.id = o.watch_id
               WHERE o.status = 'sent' AND k >= $3 AND k < $4) t",
    )
    .bind(start as f64)
    .bind(i64::try_from(items_per_sec).unwrap_or(1))
    .bind(i64::try_from(items_per_sec * usize::try_from(warmup).unwrap_or(0)).unwrap_or(0))
    .bind(i64::try_from(n_items).unwrap_or(0))
    .bind(&falls)
    .fetch_one(&s.db.pool)
    .await
    .unwrap_or((None, None, None, 0));
    let stages_ms = stage_shares(
        &s.db.pool,
        start + 1000 * i64::try_from(warmup).unwrap_or(0),
    )
    .await;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM outbox GROUP BY status ORDER BY status")
            .fetch_all(&s.db.pool)
            .await
            .unwrap_or_default();
    let sampled = push.received().len() + usize::try_from(hooks.sunk()).unwrap_or(0);
    let rejected = push.rejected().len();
    p.stop().await;
    s.cleanup().await;
    json!({
        "channel": channel.as_str(),
        "offered_per_s": items_per_sec * PER_ITEM,
        "seconds": secs,
        "scan_interval": scan_interval,
        "scan_spread_percent": scan_spread,
        "window_s": window,
        "sent_per_s": round(sent_per_s, 0),
        "pipeline_cpu_cores": round(pipeline_cores, 2),
        "machine_cpu_cores_busy": round(machine_cores, 2),
        "cpu_us_per_sent": round(cpu_us_per_sent, 0),
        "most_sent_per_s_on_2_cores": round(2e6 / cpu_us_per_sent.max(1.0), 0),
        "stages_per_s": stages,
        "push_request_mean_ms": round(push_ms, 1),
        "backlog_at_window_end": backlog,
        "latency_s": {"p50": p50.map(|v| round(v, 3)), "p95": p95.map(|v| round(v, 3)), "p99": p99.map(|v| round(v, 3)), "samples": n_lat},
        "change_to_sent_s": {"p50": c50.map(|v| round(v, 3)), "p95": c95.map(|v| round(v, 3)), "p99": c99.map(|v| round(v, 3)), "samples": n_change},
        "stages_ms": stages_ms,
        "final_states": states.into_iter().map(|(k, v)| (k, json!(v))).collect::<serde_json::Map<_, _>>(),
        "expected_notifications": expected,
        "decrypted_samples": sampled,
        "rejected_samples": rejected,
        "resources": per_service,
        "postgres_in_window": PgCounters::window(pg_before, pg_after, sent_window),
        "postgres_statements_in_window": Statements::window(
            statements_before.as_ref(),
            statements_after.as_ref(),
            sent_window,
            8,
        ),
    })
}

/// The push deadline the benchmark's dispatcher sets: `TIDINGS_PUSH_DEADLINE`, which the
/// dispatcher inherits, or else its default. A row's re-check is its `deadline` less this, the
/// validity being far longer.
fn push_deadline() -> Duration {
    std::env::var("TIDINGS_PUSH_DEADLINE")
        .ok()
        .and_then(|d| tidings_domain::duration::parse_duration(&d).ok())
        .unwrap_or_else(|| tidings_benches::dispatcher_defaults().push_deadline)
}

/// Each stage's share of detection → `sent` for the rows detected since `since_ms`, p50 and
/// p99 in ms, from the timestamps each row keeps: detected (the detector), inserted (ingest's
/// `created_at`), re-checked (`deadline` − the push deadline), its push started (the pusher's
/// `attempt_started_at`) and its result applied (`finished_at`); and the push's own HTTP
/// exchange (`attempt_ms`, inside "push started → result applied").
async fn stage_shares(pool: &sqlx::PgPool, since_ms: i64) -> Value {
    let stages: [(&str, &str); 5] = [
        ("detected → ingested", "created_at - detected_at"),
        ("ingested → re-checked", "recheck - created_at"),
        ("re-checked → push started", "attempt_started_at - recheck"),
        (
            "push started → result applied",
            "finished_at - attempt_started_at",
        ),
        (
            "of which the push's HTTP exchange",
            "attempt_ms * interval '1 ms'",
        ),
    ];
    // One pass over the rows for every stage: each column is a stage's p50 and p99.
    let columns: Vec<String> = (stages.iter())
        .map(|(_, span)| {
            format!(
                "percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP \
                 (ORDER BY EXTRACT(EPOCH FROM {span})::float8 * 1000)"
            )
        })
        .collect();
    let sql = format!(
        "SELECT {} FROM (SELECT *, deadline - make_interval(secs => $2) AS recheck FROM outbox
                        WHERE status = 'sent' AND detected_at >= to_timestamp($1::float8 / 1000)) o",
        columns.join(", ")
    );
    let row = sqlx::query(&sql)
        .bind(since_ms as f64)
        .bind(push_deadline().as_secs_f64())
        .fetch_one(pool)
        .await;
    let mut out = Vec::new();
    for (i, (name, _)) in stages.iter().enumerate() {
        let p: Option<Vec<f64>> = row
            .as_ref()
            .ok()
            .and_then(|r| sqlx::Row::try_get(r, i).ok());
        let at = |k: usize| p.as_ref().and_then(|p| p.get(k)).map(|v| round(*v, 0));
        out.push(json!({"stage": name, "p50": at(0), "p99": at(1)}));
    }
    Value::Array(out)
}

/// Whether all `expected` notifications have ended, by the dispatcher's terminal transitions
/// (each row makes exactly one), confirmed once by the outbox. Counting the outbox's rows every
/// half second instead scanned them (about 200 ms of Postgres a poll at 240,000 rows, the open
/// ones through their partial index no cheaper under overload), and the drain it waited for
/// paid for that.
async fn drained(p: &Pipeline, pool: &sqlx::PgPool, expected: usize) -> bool {
    let m = scrape(p, "dispatcher").await;
    let ended: f64 = ["sent", "dropped", "failed"]
        .iter()
        .map(|to| {
            sum(
                &m,
                &format!("tidings_outbox_transitions_total{{to=\"{to}\""),
            )
        })
        .sum();
    if ended < expected as f64 {
        return false;
    }
    let terminal: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE status IN ('sent', 'dropped', 'failed')",
    )
    .fetch_one(pool)
    .await
    .unwrap_or(0);
    terminal >= i64::try_from(expected).unwrap_or(i64::MAX)
}

const STALE_ITEMS: usize = 300;
const STALE_PER_ITEM: usize = 5;

/// (dip start offset ms, dip length ms) per item: dips start over 30 s and last 0.3 s – 2 min
/// (log-uniform).
fn series() -> Vec<(i64, i64)> {
    let mut rng = Rng(7);
    (0..STALE_ITEMS)
        .map(|_| {
            let start = (rng.unit() * 30_000.0) as i64;
            let len = (300f64.ln() + rng.unit() * (120_000f64.ln() - 300f64.ln())).exp() as i64;
            (start, len)
        })
        .collect()
}

/// The services' settings in the stale phases: scans every second, retries after a second, the
/// sink's named hosts allowed.
fn stale_env(log: &str) -> [(&'static str, &str); 5] {
    [
        ("TIDINGS_SCAN_INTERVAL", "1s"),
        ("RUST_LOG", log),
        ("TIDINGS_RETRY_BASE", "1s"),
        ("TIDINGS_PUSH_ALLOWED_HOSTS", NAMED_HOSTS),
        ("TIDINGS_PUSH_ALLOW_PRIVATE", NAMED_HOSTS),
    ]
}

/// A stale phase's world: a sink refusing one push in four once, four subscriptions on it, and
/// the dipping items, priced above their threshold for now.
async fn stale_world() -> (Scenario, FakePushService, Vec<Subscription>, Vec<String>) {
    let s = Scenario::new().await;
    let push = FakePushService::start_sink().await.expect("sink");
    push.set_flaky(4);
    let subs: Vec<Subscription> = (0..4).map(|_| push.named_subscription()).collect();
    let items: Vec<String> = (0..STALE_ITEMS).map(|i| format!("DIP-{i:04}")).collect();
    for code in &items {
        s.catalog.set_price(code, HIGH);
    }
    (s, push, subs, items)
}

/// Runs the series through Tidings (`naive = false`) or the naive mode; returns the counts.
async fn stale_phase(naive: bool) -> Value {
    let (s, push, subs, items) = stale_world().await;
    // Withdrawals off: this phase judges alerts by their topic, which a withdrawal shares, and
    // the naive pipeline it is compared with has none.
    add_watches(&s, &subs, &items, (STALE_PER_ITEM, false)).await;
    let services: &[&'static str] = if naive {
        &["detector", "pusher"]
    } else {
        &["api", "dispatcher", "pusher", "detector"]
    };
    let p = Pipeline::start_only(&s, services, &stale_env(&service_log())).await;
    let stop = CancellationToken::new();
    let topics: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let forwarder = if naive {
        Some(tokio::spawn(naive_forwarder(
            s.db.pool.clone(),
            s.subjects.clone(),
            topics.clone(),
            stop.clone(),
        )))
    } else {
        None
    };
    let start = now_ms() + 2000;
    let plan = series();
    let mut timeline: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for (code, (dip, len)) in items.iter().zip(&plan) {
        let steps = vec![(start + dip, LOW), (start + dip + len, HIGH)];
        timeline.insert(code.clone(), steps.clone());
        s.catalog.set(
            code,
            Item {
                timeline: steps,
                ..Item::priced(HIGH)
            },
        );
    }
    // Every dip has started by +32 s; retries settle within seconds after.
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(start + 45_000 - now_ms()).unwrap_or(0),
    ))
    .await;
    stop.cancel();
    if let Some(f) = forwarder {
        let _ = f.await;
    }
    // Which item each delivered topic was for, and (Tidings) what its last re-check saw: the
    // price the catalog answered and when the dispatcher read that answer.
    let mut rechecked: HashMap<String, (i64, i64)> = HashMap::new();
    if !naive {
        // (watch, trigger key, item, observed at, price) of each row's last re-check.
        type Rechecked = (uuid::Uuid, String, String, Option<String>, Option<i64>);
        let rows: Vec<Rechecked> = sqlx::query_as(
            "SELECT o.watch_id, o.trigger, w.item_code, o.sent_value->>'observed_at',
                    (o.sent_value->>'price')::bigint
             FROM outbox o JOIN watches w ON w.id = o.watch_id",
        )
        .fetch_all(&s.db.pool)
        .await
        .expect("reading the rows' re-checks");
        let mut t = topics.lock().unwrap_or_else(|e| e.into_inner());
        // A watch's trigger sends one row a day, so its topic names the row.
        for (watch, key, item, observed, price) in rows {
            let Some(trigger) = Trigger::from_key(&key) else {
                continue;
            };
            let topic = validity::topic(WatchId(watch), &trigger);
            let observed = observed.and_then(|o| chrono::DateTime::parse_from_rfc3339(&o).ok());
            if let (Some(at), Some(price)) = (observed, price) {
                rechecked.insert(topic.clone(), (at.timestamp_millis(), price));
            }
            t.insert(topic, item);
        }
    }
    let topics = topics.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (mut stale, mut correct, mut unknown) = (0, 0, 0);
    // Stale deliveries inside the window between re-check and the push service's 201 (see
    // `judge`), how long that window was, and by how much reading the answer trailed a recovery.
    let (mut after_recheck, mut windows_ms, mut read_after_recovery_ms) =
        (0, Vec::new(), Vec::new());
    let mut outside = Vec::new();
    for (topic, at) in push.sunk() {
        let Some(item) = topics.get(&topic) else {
            unknown += 1;
            continue;
        };
        let seen = rechecked.get(&topic).copied();
        match judge(&timeline[item], at, seen) {
            Judged::Correct => correct += 1,
            Judged::Outside => {
                stale += 1;
                // What a broken promise looked like, so a run that has one can be read (the
                // naive mode re-checks nothing: every stale delivery of it is outside).
                if !naive {
                    outside.push(json!({
                        "outbox_id": topic,
                        "item": item,
                        "accepted_at_ms": at,
                        "recheck_read_at_ms_and_price": seen,
                        "timeline_ms_and_price": timeline[item],
                    }));
                }
            }
            Judged::AfterRecheck {
                window_ms,
                read_after_recovery,
            } => {
                stale += 1;
                after_recheck += 1;
                windows_ms.push(window_ms);
                read_after_recovery_ms.extend(read_after_recovery);
            }
        }
    }
    windows_ms.sort_unstable();
    read_after_recovery_ms.sort_unstable();
    let withheld: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE status = 'dropped' AND reason = 'condition_lost'",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap_or(0);
    p.stop().await;
    s.cleanup().await;
    json!({
        "mode": if naive { "naive (send on detection)" } else { "tidings" },
        "watches": STALE_ITEMS * STALE_PER_ITEM,
        "deliveries": stale + correct,
        "stale_deliveries": stale,
        "correct_deliveries": correct,
        "withheld_condition_lost": withheld,
        "unattributed_deliveries": unknown,
        "stale_reverted_after_last_recheck": if naive { Value::Null } else { json!(after_recheck) },
        "stale_outside_recheck_window": if naive { Value::Null } else { json!(stale - after_recheck) },
        "recheck_to_delivery_ms_of_those": windows_ms,
        "of_those_read_after_the_recovery_ms": read_after_recovery_ms,
        "stale_outside_recheck_window_details": outside,
    })
}

/// Items per digest reader in the digest variant: each reader watches this many of the dipping
/// items, each once.
const DIGEST_ITEMS_PER_READER: usize = 5;
/// When the digest goes, from the timeline's start: every dip has started by +30 s.
const DIGEST_AT_MS: i64 = 60_000;

/// Readers with an hourly digest, each watching `DIGEST_ITEMS_PER_READER` of `items` once:
/// their device ids.
async fn add_digest_readers(
    s: &Scenario,
    subs: &[Subscription],
    items: &[String],
) -> Vec<uuid::Uuid> {
    let digest = json!({"digest": "hourly"});
    let mut readers = Vec::new();
    for (i, mine) in items.chunks(DIGEST_ITEMS_PER_READER).enumerate() {
        let pool = &s.db.pool;
        let sub = &subs[i % subs.len()];
        let reader = tidings_benches::seed::device(pool, "UTC", &digest, sub)
            .await
            .expect("reader");
        tidings_benches::seed::watches(pool, reader, mine, THRESHOLD, HIGH)
            .await
            .expect("watches");
        readers.push(reader);
    }
    readers
}

/// The digest variant of the stale phase: the same dips, watched by readers with a digest, which
/// goes at +60 s. Tidings re-checks each held row when the digest goes and lists what still
/// holds; a digest released without a re-check (what Knock's or Novu's batching does) lists every
/// detection of the window. Both are judged at the instant the push service accepted the
/// reader's digest: an entry is stale when its price was back above the threshold then.
async fn digest_phase() -> Value {
    let (s, push, subs, items) = stale_world().await;
    let readers = add_digest_readers(&s, &subs, &items).await;
    let p = Pipeline::start_only(
        &s,
        &["api", "dispatcher", "pusher", "detector"],
        &stale_env(&service_log()),
    )
    .await;
    let start = now_ms() + 2000;
    let mut timeline: HashMap<String, Item> = HashMap::new();
    for (code, (dip, len)) in items.iter().zip(series()) {
        let item = Item {
            timeline: vec![(start + dip, LOW), (start + dip + len, HIGH)],
            ..Item::priced(HIGH)
        };
        s.catalog.set(code, item.clone());
        timeline.insert(code.clone(), item);
    }
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(start + DIGEST_AT_MS - now_ms()).unwrap_or(0),
    ))
    .await;
    // The hour comes (the rows wait for the top of the real one).
    s.db.digest_time().await;
    let released_at = now_ms();
    let undecided = "SELECT count(*) FROM outbox WHERE status IN ('pending', 'retry', 'sending')";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while s.db.count(undecided).await > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every detection, by reader: (item, sent in the digest).
    let rows: Vec<(uuid::Uuid, String, bool)> = sqlx::query_as(
        "SELECT o.device_id, w.item_code, o.status = 'sent' AND o.digest_of IS NOT NULL
         FROM outbox o JOIN watches w ON w.id = o.watch_id",
    )
    .fetch_all(&s.db.pool)
    .await
    .expect("reading the rows");
    let accepted: HashMap<String, i64> = push.sunk().into_iter().collect();
    let (mut digests, mut listed, mut stale, mut naive_listed, mut naive_stale) = (0, 0, 0, 0, 0);
    for reader in &readers {
        let topic = tidings_domain::digest::topic(tidings_domain::DeviceId(*reader));
        let sent_at = accepted.get(&topic).copied();
        digests += usize::from(sent_at.is_some());
        // A reader Tidings sent nothing (all ended) is judged at the release for the other.
        let at = sent_at.unwrap_or(released_at);
        let stale_at = |item: &str| timeline[item].price_at(at) >= THRESHOLD;
        for (_, item, sent) in rows.iter().filter(|r| r.0 == *reader) {
            naive_listed += 1;
            naive_stale += usize::from(stale_at(item));
            if *sent {
                listed += 1;
                stale += usize::from(stale_at(item));
            }
        }
    }
    let sent_rows = rows.iter().filter(|r| r.2).count();
    p.stop().await;
    s.cleanup().await;
    json!({
        "readers": readers.len(),
        "detections": rows.len(),
        "tidings": {"digests": digests, "entries": listed, "stale_entries": stale,
                    "rows_sent_in_digests": sent_rows},
        "release_without_recheck": {"digests": readers.len(), "entries": naive_listed,
                                    "stale_entries": naive_stale},
    })
}

fn print_digests(d: &Value) {
    println!();
    println!(
        "| digest at +60 s ({} readers, {} detections) | digests | entries | stale entries |",
        d["readers"], d["detections"]
    );
    println!("|---|---|---|---|");
    for (name, r) in [
        ("Tidings (re-checked at release)", &d["tidings"]),
        ("released without re-check", &d["release_without_recheck"]),
    ] {
        println!(
            "| {name} | {} | {} | {} |",
            r["digests"], r["entries"], r["stale_entries"]
        );
    }
}

/// A delivery, judged against its item's price timeline.
#[derive(Debug, PartialEq)]
enum Judged {
    /// The price was below the threshold when the push service accepted the push.
    Correct,
    /// Stale, but the last re-check saw the price below the threshold: it recovered in the window
    /// between the catalog's answer and the push service's acceptance (`window_ms` from the
    /// dispatcher reading the answer). `read_after_recovery`: by how much that reading trailed
    /// the recovery, when it did (the answer was made before it, the reading after).
    AfterRecheck {
        window_ms: i64,
        read_after_recovery: Option<i64>,
    },
    /// Stale, and no re-check saw the condition hold: what Tidings promises never happens.
    Outside,
}

/// Judges a delivery accepted at `at` (ms) for an item whose price followed `timeline`, whose
/// last re-check (if any) read `(observed_at ms, price)`.
fn judge(timeline: &[(i64, i64)], at: i64, rechecked: Option<(i64, i64)>) -> Judged {
    let series = Item {
        timeline: timeline.to_vec(),
        ..Item::priced(HIGH)
    };
    if series.price_at(at) < THRESHOLD {
        return Judged::Correct;
    }
    match rechecked {
        Some((checked, seen)) if seen < THRESHOLD => Judged::AfterRecheck {
            window_ms: at - checked,
            // Above the threshold when read: the last step before the reading was the recovery.
            read_after_recovery: (series.price_at(checked) >= THRESHOLD).then(|| {
                let recovered = timeline.iter().map(|(t, _)| *t).filter(|t| *t <= checked);
                checked - recovered.max().unwrap_or(checked)
            }),
        },
        _ => Judged::Outside,
    }
}

/// The naive mode: every EnqueueRequest becomes a PushRequest at once (no outbox, no
/// re-check); a transient result is retried with the same message after its Retry-After.
async fn naive_forwarder(
    pool: sqlx::PgPool,
    subjects: tidings_domain::subjects::Subjects,
    topics: Arc<Mutex<HashMap<String, String>>>,
    stop: CancellationToken,
) {
    let js = jetstream::new(tidings_tests::harness::nats().await.expect("nats"));
    let consumer = |kind: StreamKind, name: &'static str| {
        let js = js.clone();
        let stream = subjects.stream(kind);
        async move {
            js.get_stream(stream)
                .await
                .expect("stream")
                .get_or_create_consumer(
                    name,
                    pull::Config {
                        durable_name: Some(name.to_owned()),
                        ..Default::default()
                    },
                )
                .await
                .expect("consumer")
        }
    };
    let enqueued = consumer(StreamKind::Enqueue, "naive").await;
    let results = consumer(StreamKind::Result, "naive-results").await;
    let push_subject = subjects.subject(StreamKind::Push, Channel::WebPush);
    let sent: Arc<Mutex<HashMap<OutboxId, PushRequest>>> = Arc::default();
    let mut subs: HashMap<uuid::Uuid, Subscription> = HashMap::new();
    while !stop.is_cancelled() {
        if let Ok(mut batch) = enqueued
            .fetch()
            .max_messages(500)
            .expires(Duration::from_millis(100))
            .messages()
            .await
        {
            while let Some(Ok(msg)) = batch.next().await {
                // The detector sends what a scan round finds in batches.
                for req in decode_enqueues(&msg.payload).unwrap_or_default() {
                    let device = req.device_id.0;
                    if let std::collections::hash_map::Entry::Vacant(slot) = subs.entry(device) {
                        let row: Option<(String, String, String)> = sqlx::query_as(
                            "SELECT endpoint, p256dh, auth FROM push_subscriptions WHERE device_id = $1 AND active",
                        )
                        .bind(device)
                        .fetch_optional(&pool)
                        .await
                        .unwrap_or(None);
                        if let Some((endpoint, p256dh, auth)) = row {
                            slot.insert(Subscription {
                                endpoint,
                                p256dh,
                                auth,
                            });
                        }
                    }
                    let item_code: Option<String> =
                        sqlx::query_scalar("SELECT item_code FROM watches WHERE id = $1")
                            .bind(req.watch_id)
                            .fetch_optional(&pool)
                            .await
                            .unwrap_or(None);
                    if let (Some(sub), Some(item)) = (subs.get(&device), item_code) {
                        let id = OutboxId::new();
                        let code = ItemCode::parse(&item).unwrap_or_else(|_| unreachable!());
                        let notice = Notice {
                            id,
                            watch: req.watch_id,
                            trigger: &req.trigger,
                            item: &code,
                            now: &req.detected,
                            baseline: &req.baseline,
                            valid_until: req.detected.observed_at + chrono::Duration::minutes(20),
                            item_url: None,
                            locale: None,
                        };
                        let deadline = Utc::now() + chrono::Duration::seconds(30);
                        let push = first_attempt(id, sub, render(&notice), deadline);
                        topics
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(push.topic.clone(), item);
                        publish(&js, &push_subject, &push).await;
                        sent.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id, push);
                    }
                }
                let _ = msg.ack().await;
            }
        }
        if let Ok(mut batch) = results
            .fetch()
            .max_messages(500)
            .expires(Duration::from_millis(10))
            .messages()
            .await
        {
            while let Some(Ok(msg)) = batch.next().await {
                let retried = decode_results(&msg.payload)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|r| matches!(r.outcome(), Outcome::Transient | Outcome::Expired));
                for r in retried {
                    let again = sent
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&r.outbox_id)
                        .cloned();
                    if let Some(mut again) = again {
                        again.attempt += 1;
                        again.deadline = Utc::now() + chrono::Duration::seconds(30);
                        let (js, subject) = (js.clone(), push_subject.clone());
                        let wait = Duration::from_secs(r.ended.retry_after().unwrap_or(2));
                        tokio::spawn(async move {
                            tokio::time::sleep(wait).await;
                            publish(&js, &subject, &again).await;
                        });
                    }
                }
                let _ = msg.ack().await;
            }
        }
    }
}

async fn publish(js: &jetstream::Context, subject: &str, push: &PushRequest) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", push.msg_id().as_str());
    if let Ok(ack) = js
        .publish_with_headers(subject.to_owned(), headers, encode(push).into())
        .await
    {
        let _ = ack.await;
    }
}

fn write_json(path: &str, value: &Value) {
    if let Some(dir) = std::path::Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(
        path,
        serde_json::to_string_pretty(value).unwrap_or_default(),
    ) {
        eprintln!("writing {path}: {e}");
    }
}

/// Phase 1 to each channel's sink, alternating rounds so both see the same minutes of this
/// machine; prints each round and the medians.
async fn channels(rate: usize, secs: u64, rounds: usize) {
    let mut figures: HashMap<&str, Vec<(f64, f64, f64)>> = HashMap::new();
    println!("| round | channel | `sent`/s | CPU µs per `sent` | pusher CPU µs per `sent` |");
    println!("|---|---|---|---|---|");
    for round in 1..=rounds {
        for channel in Channel::ALL {
            eprintln!("round {round}: {rate}/s for {secs} s to {channel} …");
            let r = load_phase(rate, secs, channel).await;
            let sent = r["sent_per_s"].as_f64().unwrap_or(0.0);
            let cpu = r["cpu_us_per_sent"].as_f64().unwrap_or(0.0);
            let pusher = r["resources"]["pusher"]["cpu_us_per_sent"]
                .as_f64()
                .unwrap_or(0.0);
            println!("| {round} | {channel} | {sent:.0} | {cpu:.0} | {pusher:.0} |");
            figures
                .entry(channel.as_str())
                .or_default()
                .push((sent, cpu, pusher));
        }
    }
    for (channel, rows) in &figures {
        let col = |f: fn(&(f64, f64, f64)) -> f64| median(rows.iter().map(f).collect());
        let (sent, cpu, pusher) = (col(|r| r.0), col(|r| r.1), col(|r| r.2));
        println!("| median | {channel} | {sent:.0} | {cpu:.0} | {pusher:.0} |");
    }
}

/// `rounds` rounds of the peer (`bench peer`), each after a round of Tidings' phase 1 to Web
/// Push when `against` (`vs-peer`): the pairs, their ratios and the medians.
async fn versus_peer(rate: usize, secs: u64, rounds: usize, against: bool) {
    let tuning = tidings_benches::peer::Tuning::from_env();
    eprintln!("peer: {}", tuning.json());
    println!(
        "| round | Tidings `sent`/s | CPU µs per `sent` | peer `sent`/s | CPU µs per `sent` | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    let mut pairs = Vec::new();
    for r in 1..=rounds {
        let tidings = if against {
            eprintln!("round {r}: Tidings, {rate}/s for {secs} s …");
            let t = load_phase(rate, secs, Channel::WebPush).await;
            eprintln!("{t:#}");
            Some(t)
        } else {
            None
        };
        eprintln!("round {r}: the peer, {rate}/s for {secs} s …");
        let peer = tidings_benches::peer::round(rate, secs, &tuning).await;
        eprintln!("{peer:#}");
        let figure = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
        let (t_sent, t_cpu) = tidings.as_ref().map_or((0.0, 0.0), |t| {
            (figure(t, "sent_per_s"), figure(t, "cpu_us_per_sent"))
        });
        let (p_sent, p_cpu) = (
            figure(&peer, "sent_per_s"),
            figure(&peer, "cpu_us_per_sent"),
        );
        let ratio = t_sent / p_sent.max(1.0);
        println!("| {r} | {t_sent:.0} | {t_cpu:.0} | {p_sent:.0} | {p_cpu:.0} | {ratio:.1} |");
        pairs.push(json!({"tidings": tidings, "peer": peer, "ratio": round(ratio, 2)}));
    }
    let col = |f: &dyn Fn(&Value) -> f64| median(pairs.iter().map(f).collect());
    let at = |v: &Value, who: &str, k: &str| v[who][k].as_f64().unwrap_or(0.0);
    println!(
        "| median | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
        col(&|v| at(v, "tidings", "sent_per_s")),
        col(&|v| at(v, "tidings", "cpu_us_per_sent")),
        col(&|v| at(v, "peer", "sent_per_s")),
        col(&|v| at(v, "peer", "cpu_us_per_sent")),
        col(&|v| v["ratio"].as_f64().unwrap_or(0.0)),
    );
    let path = std::env::var("BENCH_PEER_JSON").unwrap_or_else(|_| "target/bench-peer.json".into());
    write_json(
        &path,
        &json!({"date": Utc::now().to_rfc3339(), "pairs": pairs}),
    );
    println!("\n(JSON: {path})");
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rate: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4000);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(65);
    // `only-load`: phase 1 alone, to see whether a given rate is kept up with; `channels`:
    // phase 1 to Web Push and to webhooks in alternating rounds.
    let mode = args.next().unwrap_or_default();
    if mode == "channels" {
        let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
        return channels(rate, secs, rounds).await;
    }
    if mode == "peer" || mode == "vs-peer" {
        let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
        return versus_peer(rate, secs, rounds, mode == "vs-peer").await;
    }
    if mode == "digests" {
        let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
        for round in 1..=rounds {
            eprintln!("stale entries in digests, round {round} …");
            print_digests(&digest_phase().await);
        }
        return;
    }
    let only_load = mode == "only-load";
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!("pipeline benchmark: offering {rate}/s for {secs} s (phase 1 of 3) …");
    let max = load_phase(rate, secs, Channel::WebPush).await;
    eprintln!("{max:#}");
    let path = std::env::var("BENCH_PIPELINE_JSON")
        .unwrap_or_else(|_| "target/bench-pipeline.json".into());
    if only_load {
        write_json(
            &path,
            &json!({
                "machine": {"cores": cores, "date": Utc::now().to_rfc3339()},
                "throughput": max,
            }),
        );
        return;
    }
    let sustained = max["sent_per_s"].as_f64().unwrap_or(0.0);
    let half = ((sustained / 2.0) as usize).max(PER_ITEM);
    eprintln!("latency at half of {sustained:.0}/s: offering {half}/s (phase 2 of 3) …");
    let latency = load_phase(half, secs, Channel::WebPush).await;
    eprintln!("{latency:#}");
    eprintln!("stale alerts: Tidings, then the naive mode (phase 3 of 3) …");
    let tidings = stale_phase(false).await;
    let naive = stale_phase(true).await;
    eprintln!("stale entries in digests: Tidings' against a release without re-check …");
    let digests = digest_phase().await;
    let result = json!({
        "machine": {"cores": cores, "date": Utc::now().to_rfc3339()},
        "throughput": max,
        "latency_at_half": latency,
        "stale_alerts": [tidings, naive],
        "stale_digests": digests,
    });
    write_json(&path, &result);
    let stage = |k: &str| max["stages_per_s"][k].as_f64().unwrap_or(0.0);
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| offered load (phase 1) | {}/s for {} s |",
        max["offered_per_s"], secs
    );
    println!("| sustained end to end (`sent`/s, steady window) | {sustained:.0} |");
    for k in [
        "detect (published)",
        "ingest",
        "dispatch",
        "push",
        "results (sent)",
    ] {
        println!("| stage: {k} | {:.0}/s |", stage(k));
    }
    println!(
        "| push request, encryption to response (mean) | {} ms |",
        max["push_request_mean_ms"]
    );
    println!(
        "| backlog at window end | {} |",
        max["backlog_at_window_end"]
    );
    println!(
        "| phase 1, price change → sent: p50 / p99 | {} / {} s |",
        max["change_to_sent_s"]["p50"], max["change_to_sent_s"]["p99"]
    );
    println!(
        "| detection → sent at {}/s: p50 / p95 / p99 | {} / {} / {} s |",
        latency["offered_per_s"],
        latency["latency_s"]["p50"],
        latency["latency_s"]["p95"],
        latency["latency_s"]["p99"]
    );
    for ms in max["stages_ms"].as_array().into_iter().flatten() {
        let stage = ms["stage"].as_str().unwrap_or_default();
        println!(
            "| phase 1, {stage}: p50 / p99 | {} / {} ms |",
            ms["p50"], ms["p99"]
        );
    }
    for (name, r) in max["resources"].as_object().into_iter().flatten() {
        let (cores, per_sent) = (&r["cpu_cores"], &r["cpu_us_per_sent"]);
        match r.get("peak_rss_mib") {
            Some(rss) => println!(
                "| {name}: CPU cores (µs per `sent`) / peak RSS | {cores} ({per_sent}) / {rss} MiB |"
            ),
            None => println!("| {name}: CPU cores (µs per `sent`) | {cores} ({per_sent}) |"),
        }
    }
    println!(
        "| CPU per `sent` notification, whole pipeline (phase 1) | {} µs: 2 cores allow at most {}/s; the machine was busy {} of {} cores |",
        max["cpu_us_per_sent"],
        max["most_sent_per_s_on_2_cores"],
        max["machine_cpu_cores_busy"],
        cores
    );
    let pg = &max["postgres_in_window"];
    println!(
        "| Postgres in phase 1's window: buffers / commits / WAL bytes per `sent`; outbox autovacuums / autoanalyzes | {} / {} / {}; {} / {} |",
        pg["buffers_per_sent"],
        pg["commits_per_sent"],
        pg["wal_bytes_per_sent"],
        pg["outbox_autovacuums"],
        pg["outbox_autoanalyzes"]
    );
    println!();
    println!(
        "| stale-alert comparison | deliveries | stale at delivery | of those, recovered after the last re-check | correct | withheld (condition_lost) |"
    );
    println!("|---|---|---|---|---|---|");
    for r in [&tidings, &naive] {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r["mode"].as_str().unwrap_or("?"),
            r["deliveries"],
            r["stale_deliveries"],
            r["stale_reverted_after_last_recheck"],
            r["correct_deliveries"],
            r["withheld_condition_lost"]
        );
    }
    print_digests(&digests);
    println!("\n(JSON: {path})");
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIP: [(i64, i64); 2] = [(1_000, LOW), (2_000, HIGH)];

    #[test]
    fn a_delivery_during_the_dip_is_correct() {
        assert_eq!(judge(&DIP, 1_500, Some((1_400, LOW))), Judged::Correct);
    }

    #[test]
    fn a_stale_delivery_whose_recheck_saw_the_dip_is_inside_the_window() {
        assert_eq!(
            judge(&DIP, 2_030, Some((1_990, LOW))),
            Judged::AfterRecheck {
                window_ms: 40,
                read_after_recovery: None
            }
        );
    }

    /// Regression: the dispatcher stamps `observed_at` when it reads the catalog's answer, after
    /// the catalog made it. A re-check answered just before the recovery and read just after it
    /// was judged by that stamp alone as having seen the recovered price, so counted as stale
    /// outside the window (2 of 1,242 deliveries in one run on 2026-12-01).
    #[test]
    fn a_recheck_answered_before_the_recovery_and_read_after_it_is_inside_the_window() {
        assert_eq!(
            judge(&DIP, 2_020, Some((2_001, LOW))),
            Judged::AfterRecheck {
                window_ms: 19,
                read_after_recovery: Some(1)
            }
        );
    }

    #[test]
    fn a_stale_delivery_whose_recheck_saw_the_recovered_price_is_outside() {
        assert_eq!(judge(&DIP, 2_500, Some((2_100, HIGH))), Judged::Outside);
        assert_eq!(judge(&DIP, 2_500, None), Judged::Outside);
    }
}
