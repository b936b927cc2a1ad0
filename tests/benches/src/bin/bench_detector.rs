//! Detector benchmark: one full scan of 1,000,000 watches over 10,000 items (fake catalog, batch
//! endpoint), excluding nothing: paging, fetching, evaluating every trigger, publishing what holds
//! (1 % of items are below the threshold), recording stock states. Prints watches/s per round,
//! the median, and the process's peak RSS (detector and fake catalog share the process). Then the
//! last round's detector scans on, as a running detector does: once with nothing changed and
//! once after 1 % of the items and 1 % of the watches changed, per round.
//! Run with `deploy/local/stack bench detector [WATCHES] [ITEMS] [ROUNDS]`.

use chrono::Utc;
use std::time::Instant;
use tidings_detector::Settings;
use tidings_detector::scan::{Detector, ScanStats};
use tidings_domain::trigger::Trigger;
use tidings_source::Sources;
use tidings_tests::scenario::Scenario;

/// One scan; its wall-clock seconds and what it did.
async fn timed_scan(d: &Detector) -> (f64, ScanStats) {
    let started = Instant::now();
    let stats = d.scan_once(Utc::now()).await.expect("scan");
    (started.elapsed().as_secs_f64(), stats)
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let watches: i64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let items: i64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);

    let s = Scenario::new().await;
    let first = s
        .watcher("ITEM-0", Trigger::PriceBelow { threshold: 1200 }, 1300)
        .await;
    let started = Instant::now();
    let codes: Vec<String> = (1..watches)
        .map(|g| format!("ITEM-{}", g % items))
        .collect();
    tidings_benches::seed::watches(&s.db.pool, first.device.id.0, &codes, 1200, 1300)
        .await
        .expect("insert watches");
    for i in 0..items {
        // Every 100th item is below the threshold: 1 % of watches hold.
        s.catalog
            .set_price(&format!("ITEM-{i}"), if i % 100 == 0 { 1100 } else { 1300 });
    }
    println!(
        "detector benchmark: {watches} watches over {items} items (set up in {:.1} s), batch endpoint, page 5000, release build",
        started.elapsed().as_secs_f64()
    );

    let mut rates = Vec::new();
    let mut last = None;
    for round in 1..=rounds {
        // One watchlist in memory at a time, so the peak RSS is one detector's.
        drop(last.take());
        let settings = Settings::new(s.subjects.clone(), s.catalog.source_config(true));
        let source = Sources::new(settings.source.clone()).expect("source");
        // A fresh detector each round: no memory, so holding triggers are published every round
        // (JetStream's duplicate window answers the repeats).
        let d = Detector::new(s.db.pool.clone(), s.js.clone(), source, settings);
        let (took, stats) = timed_scan(&d).await;
        let (_, batches) = s.catalog.requests();
        println!(
            "  round {round}: {:.2} s, {:>7.0} watches/s; {} items fetched, {} holding, {} published, {} duplicates; {} batch requests so far",
            took,
            stats.watches as f64 / took,
            stats.items,
            stats.holding,
            stats.published,
            stats.duplicates,
            batches
        );
        rates.push((took, stats.watches as f64 / took));
        last = Some(d);
    }
    rates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (took, rate) = rates[rates.len() / 2];
    println!(
        "  median: full scan {took:.2} s, {rate:.0} watches/s; peak RSS {:.0} MiB",
        peak_rss_mib()
    );

    // The last round's detector scans on: its watchlist is loaded, so a scan reads only the rows
    // written since the previous one and evaluates only items whose value or watches changed
    // (and the 1 % that hold, every scan).
    let d = last.expect("at least one round");
    let (mut idle, mut changed) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (took, stats) = timed_scan(&d).await;
        println!(
            "  steady round {round}, nothing changed: {took:.2} s; {} rows read, {} items fetched, {} watches evaluated",
            stats.rows_read, stats.items, stats.evaluated
        );
        idle.push(took);
        // 1 % of the items move (staying above every threshold) and 1 % of the watches are
        // written (as a pause or resume through the api would).
        let step = round % 99 + 1;
        for i in (step..usize::try_from(items).unwrap_or(0)).step_by(100) {
            s.catalog.set_price(
                &format!("ITEM-{i}"),
                1300 + i64::try_from(round).unwrap_or(0),
            );
        }
        sqlx::query(
            "UPDATE watches SET updated_at = now()
             WHERE id IN (SELECT id FROM watches ORDER BY id LIMIT $1 OFFSET $2)",
        )
        .bind(watches / 100)
        .bind(watches / 100 * i64::try_from(round).unwrap_or(0))
        .execute(&s.db.pool)
        .await
        .expect("touch watches");
        let (took, stats) = timed_scan(&d).await;
        println!(
            "  steady round {round}, 1 % of items and watches changed: {took:.2} s; {} rows read, {} watches evaluated, {} published",
            stats.rows_read, stats.evaluated, stats.published
        );
        changed.push(took);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "  median steady scan: {:.2} s with nothing changed, {:.2} s with 1 % changed (full scan {took:.2} s); peak RSS {:.0} MiB",
        median(&mut idle),
        median(&mut changed),
        peak_rss_mib()
    );
    s.cleanup().await;
}
