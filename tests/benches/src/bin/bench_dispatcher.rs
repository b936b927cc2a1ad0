//! Dispatcher benchmark: prints ingest rows/s, dispatch rows/s, results rows/s and the pick-up
//! latency of a new row by an idle dispatcher (a detection, which wakes it, and a row written by
//! SQL, which waits for its poll), measured against the local stack (real Postgres and NATS,
//! the fake catalog's batch endpoint). Each round uses a fresh database and prefix; the summary
//! line gives the median of the rounds. Run with
//! `deploy/local/stack bench dispatcher [ROWS] [ROUNDS]`; `TIDINGS_BENCH_EXTRA_PARTITIONS=N`
//! adds N empty weekly outbox partitions first;
//! `TIDINGS_BENCH_RESULTS_PER_MESSAGE=N` sends the results N to a message (default: the pusher's
//! batch, 100).

use chrono::Utc;
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidings_benches::procstat::CpuSplit;
use tidings_bus::consume::Handler;
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_dispatcher::dispatch::Dispatcher;
use tidings_dispatcher::ingest::Ingest;
use tidings_dispatcher::results::Results;
use tidings_domain::Channel;
use tidings_domain::messages::{
    Ended, EnqueueRequests, PushResult, PushResults, decode_requests, encode,
};
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_source::Sources;
use tidings_tests::fixtures;
use tidings_tests::harness::TestDb;
use tidings_tests::scenario::Scenario;
use tokio_util::sync::CancellationToken;

const ITEMS: usize = 200;

struct Round {
    ingest: f64,
    dispatch: f64,
    results: f64,
    /// Median ms from a new row to its PushRequest: published as a detection (waking the
    /// dispatcher), and inserted by SQL (waiting for its poll).
    pickup_detection_ms: f64,
    pickup_sql_ms: f64,
    /// CPU per row of each phase: this process (the dispatcher's loops; in dispatch also the
    /// fake catalog), Postgres, nats-server.
    ingest_cpu: CpuSplit,
    dispatch_cpu: CpuSplit,
    results_cpu: CpuSplit,
    /// Cores busy on average during each phase (this process + Postgres + nats-server).
    ingest_cores: f64,
    dispatch_cores: f64,
    results_cores: f64,
    /// WAL bytes Postgres wrote per row in each phase: what the rows' writes cost in the log
    /// (and so in replication and backups), whoever's CPU pays for it.
    wal: [f64; 3],
}

/// Bytes Postgres has written to its WAL so far, as the figures divide them.
async fn wal_bytes(pool: &sqlx::PgPool) -> f64 {
    tidings_benches::pgstat::wal_position(pool)
        .await
        .expect("WAL position") as f64
}

/// `detections` in one EnqueueRequests message, deduplicated by its id, as the detector
/// publishes a batch.
fn detections_message(
    subject: &str,
    detections: Vec<tidings_domain::messages::EnqueueRequest>,
) -> Outgoing {
    let batch = EnqueueRequests::new(detections);
    Outgoing::deduplicated(subject, &batch.msg_id(), encode(&batch))
}

/// Publishes every message, pipelined; panics unless JetStream stores each.
async fn publish_every(js: &async_nats::jetstream::Context, outgoing: Vec<Outgoing>, what: &str) {
    for ack in publish_all(js, outgoing, 1024).await {
        ack.unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// Runs `handler`'s consume loop until its consumer has nothing left unacknowledged, then checks
/// that `count_sql` finds `rows`; returns how long the draining took and the CPU it cost.
///
/// Ingest and results ack only after committing, so nothing unacked means everything is in
/// Postgres. Asking NATS costs Postgres nothing, unlike polling a count, which on this 2-core
/// machine would slow the very thing being measured.
async fn run_until_drained<H: Handler>(
    handler: H,
    db: &TestDb,
    count_sql: &str,
    rows: usize,
) -> (Duration, CpuSplit) {
    let mut pull = handler.consumer().pull().clone();
    let stop = CancellationToken::new();
    let cpu = CpuSplit::now();
    let started = Instant::now();
    let task = tokio::spawn(handler.run(stop.clone()));
    loop {
        let info = pull.info().await.expect("consumer info");
        if info.num_pending + info.num_ack_pending as u64 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    let cpu = CpuSplit::since(cpu);
    stop.cancel();
    let _ = task.await;
    assert_eq!(db.count(count_sql).await, rows as i64, "{count_sql}");
    (took, cpu)
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn round(rows: usize) -> Round {
    let mut s = Scenario::new().await;
    // Production defaults for everything that affects throughput.
    let defaults = tidings_dispatcher::Settings::new(s.subjects.clone(), s.settings.source.clone());
    s.settings = tidings_dispatcher::Settings {
        source: s.catalog.source_config(true),
        ..defaults
    };
    let settings = s.settings();
    // More (empty) weekly partitions than the test database's: what daily partitions, or a longer
    // retention, would cost the hot path. TIDINGS_BENCH_EXTRA_PARTITIONS=31 gives ~38.
    let extra: i64 = std::env::var("TIDINGS_BENCH_EXTRA_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if extra > 0 {
        sqlx::query(
            "SELECT outbox_ensure_partition(current_date + 42 + 7 * g) FROM generate_series(0, $1::int - 1) g",
        )
        .bind(extra)
        .execute(&s.db.pool)
        .await
        .expect("extra partitions");
    }

    // 200 items, one watch each, and `rows` detections with distinct trigger keys.
    let mut watchers = Vec::with_capacity(ITEMS);
    for i in 0..ITEMS {
        watchers.push(
            s.watcher(
                &format!("ITEM-{i}"),
                Trigger::PriceBelow { threshold: 1200 },
                1100,
            )
            .await,
        );
    }
    let now = Utc::now();
    let enqueue = s.subjects.subject(StreamKind::Enqueue, Channel::WebPush);
    // In batches of 50, as the detector publishes what a scan round finds.
    let detections: Vec<_> = (0..rows)
        .map(|i| watchers[i % ITEMS].numbered_detection(i, now))
        .collect();
    let outgoing: Vec<Outgoing> = detections
        .chunks(50)
        .map(|chunk| detections_message(&enqueue, chunk.to_vec()))
        .collect();
    publish_every(&s.js, outgoing, "publish").await;

    // Ingest: the real consume loop, until every row is in the outbox.
    let ingest = Ingest::new(s.db.pool.clone(), s.js.clone(), settings.clone())
        .await
        .expect("ingest");
    let wal_start = wal_bytes(&s.db.pool).await;
    let (ingest_took, ingest_cpu) =
        run_until_drained(ingest, &s.db, "SELECT count(*) FROM outbox", rows).await;
    let wal_ingested = wal_bytes(&s.db.pool).await;

    // Dispatch: claim → re-fetch (batch endpoint) → re-check → sending → publish.
    let source = Arc::new(Sources::new(s.settings.source.clone()).expect("source"));
    let started = Instant::now();
    let cpu = CpuSplit::now();
    let workers: Vec<_> = (0..s.settings.dispatch_workers)
        .map(|_| {
            let d = Dispatcher::new(
                s.db.pool.clone(),
                s.js.clone(),
                source.clone(),
                settings.clone(),
            );
            tokio::spawn(async move {
                let mut published = 0;
                loop {
                    match d.dispatch_once().await {
                        Ok(st) if st.claimed == 0 => return published,
                        Ok(st) => published += st.published,
                        Err(e) => panic!("dispatch failed: {e}"),
                    }
                }
            })
        })
        .collect();
    let mut published = 0;
    for w in workers {
        published += w.await.expect("worker");
    }
    let dispatch_took = started.elapsed();
    let dispatch_cpu = CpuSplit::since(cpu);
    let wal_dispatched = wal_bytes(&s.db.pool).await;
    assert_eq!(published, rows, "every row dispatched");

    // Results: every push answered `delivered`.
    let pusher = s.push_consumer().await;
    let mut results = Vec::with_capacity(rows);
    while results.len() < published {
        let mut msgs = pusher
            .fetch()
            .max_messages(5000)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .expect("fetch");
        while let Some(Ok(m)) = msgs.next().await {
            // As the pusher reports a delivery, for each request the message carries.
            for p in decode_requests(&m.payload).expect("push requests") {
                let delivered = Ended::Delivered {
                    message_id: Some(format!("https://push.example/m/{}", p.outbox_id)),
                };
                results.push(PushResult {
                    http_status: Some(201),
                    latency_ms: 1,
                    dedup_day: p.dedup_day,
                    started_at: Some(Utc::now()),
                    push_host: Some("push.example".into()),
                    ..PushResult::new(p.outbox_id, p.attempt, delivered)
                });
            }
            let _ = m.ack().await;
        }
    }
    let subject = s.subjects.subject(StreamKind::Result, Channel::WebPush);
    // In batches, as the pusher reports them; TIDINGS_BENCH_RESULTS_PER_MESSAGE=1 sends each
    // alone, as pushers before batching did.
    let per_message: usize = std::env::var("TIDINGS_BENCH_RESULTS_PER_MESSAGE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(tidings_pusher::report::BATCH)
        .max(1);
    let outgoing = results
        .chunks(per_message)
        .map(|batch| Outgoing {
            subject: subject.clone(),
            headers: async_nats::HeaderMap::new(),
            payload: match batch {
                [one] => encode(one),
                _ => encode(&PushResults::new(batch.to_vec())),
            },
        })
        .collect();
    publish_every(&s.js, outgoing, "publish result").await;
    let res = Results::new(s.db.pool.clone(), s.js.clone(), settings.clone())
        .await
        .expect("results");
    let sent = "SELECT count(*) FROM outbox WHERE status = 'sent'";
    let wal_published = wal_bytes(&s.db.pool).await;
    let (results_took, results_cpu) = run_until_drained(res, &s.db, sent, rows).await;
    let wal_applied = wal_bytes(&s.db.pool).await;

    // Pick-up latency: a full idle dispatcher, one new row at a time.
    let stop = CancellationToken::new();
    let running = tokio::spawn(tidings_dispatcher::run_with(
        s.db.pool.clone(),
        s.js.clone(),
        s.settings.clone(),
        stop.clone(),
    ));
    let nats = tidings_tests::harness::nats().await.expect("nats");
    let mut seen = nats
        .subscribe(s.subjects.subject(StreamKind::Push, Channel::WebPush))
        .await
        .expect("subscribe");
    nats.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Two ways a row reaches an idle dispatcher, alternating: a detection published to
    // JetStream, which its ingest commits and rings the dispatch loops for; and a row written
    // straight to the outbox (by another replica's ingest, or due again by the clock), which
    // waits for the poll.
    let (mut woken, mut polled) = (Vec::new(), Vec::new());
    let w = &watchers[0];
    for i in 0..50 {
        let mut r =
            fixtures::enqueue_request(&w.device, w.watch, w.trigger.clone(), 1100, Utc::now());
        r.trigger = Trigger::PriceBelow {
            threshold: 10_000_000 + i,
        };
        let detected = i % 2 == 0;
        let started = Instant::now();
        if detected {
            let one = detections_message(&enqueue, vec![r]);
            publish_every(&s.js, vec![one], "publish a detection").await;
        } else {
            tidings_store::enqueue::insert(&s.db.pool, &[(&r, None)])
                .await
                .expect("insert");
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), seen.next()).await;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        if detected {
            woken.push(took)
        } else {
            polled.push(took)
        }
        // A round restarts the loop's poll, so the next arrival comes after a gap spread over
        // the poll interval: a row that waits for the poll lands all over its cycle.
        let spread = ((i * 7) % 25) as f64 / 25.0;
        tokio::time::sleep(s.settings.poll_interval.mul_f64(spread)).await;
    }
    stop.cancel();
    let _ = running.await;
    s.cleanup().await;

    Round {
        ingest: rate(rows, ingest_took),
        dispatch: rate(rows, dispatch_took),
        results: rate(rows, results_took),
        pickup_detection_ms: median(woken),
        pickup_sql_ms: median(polled),
        ingest_cpu: ingest_cpu.per_unit_us(rows),
        dispatch_cpu: dispatch_cpu.per_unit_us(rows),
        results_cpu: results_cpu.per_unit_us(rows),
        ingest_cores: ingest_cpu.total() / ingest_took.as_secs_f64(),
        dispatch_cores: dispatch_cpu.total() / dispatch_took.as_secs_f64(),
        results_cores: results_cpu.total() / results_took.as_secs_f64(),
        wal: [
            wal_ingested - wal_start,
            wal_dispatched - wal_ingested,
            wal_applied - wal_published,
        ]
        .map(|b| b / rows as f64),
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rows: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let defaults = tidings_benches::dispatcher_defaults();
    println!(
        "dispatcher benchmark: {rows} rows over {ITEMS} items, {rounds} rounds; defaults: ingest batch {}, {} batches in flight, \
         claim batch {}, {} dispatch workers, poll {} ms",
        defaults.ingest_batch,
        defaults.consumer_concurrency,
        defaults.claim_batch,
        defaults.dispatch_workers,
        defaults.poll_interval.as_millis()
    );
    let mut all = Vec::new();
    for i in 1..=rounds {
        let r = round(rows).await;
        println!(
            "  round {i}: ingest {:>7.0} rows/s | dispatch {:>7.0} rows/s | results {:>7.0} rows/s | pick-up median {:>5.1} ms (detection), {:>5.1} ms (row by SQL)",
            r.ingest, r.dispatch, r.results, r.pickup_detection_ms, r.pickup_sql_ms
        );
        all.push(r);
    }
    println!(
        "  median:  ingest {:>7.0} rows/s | dispatch {:>7.0} rows/s | results {:>7.0} rows/s | pick-up median {:>5.1} ms (detection), {:>5.1} ms (row by SQL)",
        median(all.iter().map(|r| r.ingest).collect()),
        median(all.iter().map(|r| r.dispatch).collect()),
        median(all.iter().map(|r| r.results).collect()),
        median(all.iter().map(|r| r.pickup_detection_ms).collect()),
        median(all.iter().map(|r| r.pickup_sql_ms).collect()),
    );
    // Where each stage's work went. A stage whose cores-busy is near 2 is CPU-bound on this
    // machine, and 2 cores divided by its CPU per row is the most it could do here.
    println!(
        "  CPU µs per row, medians (this process = the dispatcher's loops; in dispatch also the fake catalog):"
    );
    println!(
        "    stage    | this process | postgres | nats-server | total | cores busy | 2 cores / total | WAL bytes per row"
    );
    type Pick = fn(&Round) -> (CpuSplit, f64);
    let stages: [(&str, Pick); 3] = [
        ("ingest", |r| (r.ingest_cpu, r.ingest_cores)),
        ("dispatch", |r| (r.dispatch_cpu, r.dispatch_cores)),
        ("results", |r| (r.results_cpu, r.results_cores)),
    ];
    for (i, (name, pick)) in stages.into_iter().enumerate() {
        let m = |f: fn(&CpuSplit) -> f64| median(all.iter().map(|r| f(&pick(r).0)).collect());
        let total = m(CpuSplit::total);
        println!(
            "    {name:<8} | {:>12.1} | {:>8.1} | {:>11.1} | {total:>5.1} | {:>10.2} | {:>9.0} rows/s | {:>6.0}",
            m(|c| c.this),
            m(|c| c.postgres),
            m(|c| c.nats),
            median(all.iter().map(|r| pick(r).1).collect()),
            2e6 / total,
            median(all.iter().map(|r| r.wal[i]).collect()),
        );
    }
}
