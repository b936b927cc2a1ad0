//! The page reader's worst case, measured: each kind of hostile page at a page source's
//! `max_body`, read `ROUNDS` times; prints the slowest read and the peak bytes allocated.
//!
//!     cargo run --release -p tidings-source --example hostile_pages [ROUNDS=5]

#[path = "../tests/support/hostile.rs"]
mod hostile;

use std::time::{Duration, Instant};
use tidings_source::config::MAX_PAGE_BODY;
use tidings_source::schema_org;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    println!(
        "| page ({MAX_PAGE_BODY} bytes) | slowest of {rounds} | peak allocated | × body | answer |"
    );
    println!("|---|---|---|---|---|");
    let (mut worst_time, mut worst_ratio) = (Duration::ZERO, 0.0f64);
    for (kind, name) in hostile::KINDS.iter().enumerate() {
        let page = hostile::page(kind, MAX_PAGE_BODY, 0);
        let (mut slowest, mut peak, mut answer) = (Duration::ZERO, 0, String::new());
        for _ in 0..rounds {
            let started = Instant::now();
            let counted = allocation_counter::measure(|| {
                answer = match schema_org::read(page.as_bytes(), None) {
                    Ok(o) => format!("{} {}", o.price, o.currency),
                    Err(e) => e.to_string(),
                };
            });
            slowest = slowest.max(started.elapsed());
            peak = peak.max(counted.bytes_max);
        }
        let ratio = peak as f64 / page.len() as f64;
        worst_time = worst_time.max(slowest);
        worst_ratio = worst_ratio.max(ratio);
        answer.truncate(60);
        println!(
            "| {name} | {:.1} ms | {:.1} MB | {ratio:.1} | {answer} |",
            slowest.as_secs_f64() * 1e3,
            peak as f64 / 1e6
        );
    }
    println!(
        "worst: {:.1} ms, {worst_ratio:.1}× the body (bounds: 100 ms, 32×)",
        worst_time.as_secs_f64() * 1e3
    );
}
