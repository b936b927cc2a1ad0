//! What the enqueue stream's duplicate window costs nats-server: publishes N EnqueueRequest-sized
//! messages with real-shaped dedup keys as `Nats-Msg-Id` into a private server's enqueue stream,
//! purges them as ingest does, and reads the server's resident memory; the same without ids is
//! the baseline. Prints bytes held per key and what a window holds at a sustained detection rate.
//! Run with `deploy/local/stack bench dedup [KEYS=1000000] [RATE=3000]`.

use std::time::Duration;
use tidings_bus::publish::{Outgoing, publish_all};
use tidings_bus::streams::{StreamSettings, ensure_streams};
use tidings_domain::Channel;
use tidings_domain::subjects::{StreamKind, Subjects};
use tidings_tests::brokers::PrivateNats;

/// Resident memory of `pid` now (VmRSS), bytes.
fn rss(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb * 1024.0)
}

/// RSS growth of a fresh server after `keys` messages were stored and purged, with or without
/// a message id each.
async fn grown(keys: usize, with_ids: bool) -> f64 {
    let nats = PrivateNats::started().await.expect("nats-server");
    let pid = nats.pid().expect("pid");
    let js = async_nats::jetstream::new(nats.client().await.expect("client"));
    let subjects = Subjects::new("bench").expect("prefix");
    let settings = StreamSettings {
        duplicate_window: Duration::from_secs(2 * 60 * 60),
        ..StreamSettings::default()
    };
    ensure_streams(&js, &subjects, &settings)
        .await
        .expect("streams");
    let subject = subjects.subject(StreamKind::Enqueue, Channel::WebPush);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss(pid);
    let payload = vec![b'x'; 700];
    for start in (0..keys).step_by(10_000) {
        let outgoing = (start..(start + 10_000).min(keys))
            .map(|i| {
                let mut headers = async_nats::HeaderMap::new();
                if with_ids {
                    // <watch_id>:<trigger>:<dedup_day>:<channel>, as the detector sends it.
                    let key = format!(
                        "0193a1f2-7c4e-7b1a-9d3e-{i:012x}:price_below:120000:2026-12-01:web_push"
                    );
                    headers.insert("Nats-Msg-Id", key.as_str());
                }
                Outgoing {
                    subject: subject.clone(),
                    headers,
                    payload: payload.clone(),
                }
            })
            .collect();
        for ack in publish_all(&js, outgoing, 1024).await {
            ack.expect("stored");
        }
    }
    let mut stream = js
        .get_stream(subjects.stream(StreamKind::Enqueue))
        .await
        .expect("stream");
    stream.purge().await.expect("purge");
    assert_eq!(stream.info().await.expect("info").state.messages, 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss(pid) - before
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let keys: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rate: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3000.0);
    let without = grown(keys, false).await;
    let with = grown(keys, true).await;
    let per_key = (with - without) / keys as f64;
    let mib = |b: f64| b / (1024.0 * 1024.0);
    println!(
        "{keys} messages stored and purged: nats-server RSS +{:.1} MiB without ids, +{:.1} MiB with ids",
        mib(without),
        mib(with)
    );
    println!("held by the duplicate window: {per_key:.0} bytes per dedup key");
    for (name, window) in [("2 h (before)", 7200.0), ("15 min (now)", 900.0)] {
        println!(
            "  window {name}: {:.0} keys at {rate} new detections/s = {:.0} MiB",
            rate * window,
            mib(rate * window * per_key)
        );
    }
}
