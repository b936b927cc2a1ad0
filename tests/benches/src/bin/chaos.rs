//! The chaos run: the real service binaries under load while their processes, the broker and the
//! database are killed, then an audit of what reached the push service against what the outbox
//! says. Run with `deploy/local/stack chaos [SECONDS] [WATCHES]` (default 120 s, 1,000 watches;
//! CI runs the default, a long run by hand e.g. `chaos 900 5000`).
//!
//! - Load: WATCHES price_below watches over 200 devices (four time zones), 5 per device, each on
//!   its own item. One device in five is an email device: its mail goes through the real
//!   services to a local SMTP server (aiosmtpd), which defers the first mail to a third of them
//!   (451) and answers the first to another third 3 s late, past the pusher's timeout (kept:
//!   the pusher cannot know it arrived, so its row must be marked maybe delivered). Each item's price dips below the threshold once, at a random moment of the
//!   window, for 0.3 s to 60 s (log-uniform): short dips are what the re-check must withhold.
//! - Faults, all at once: the catalog fails 3 % of requests (503, 429, or slower than the source
//!   timeout); the push service answers 5 % 500, 1 % 429, and 1 % 201 after the pusher's HTTP
//!   timeout, and 410 for one device in twenty; every 10–20 s a service (dispatcher, pusher or
//!   detector) is killed with SIGKILL and restarted a second later; nats-server is killed with
//!   SIGKILL twice and Postgres stopped as in a power cut twice. A service that exits by itself
//!   is restarted, as Kubernetes would, and counted.
//! - One device in ten has a cap (two per 30 s), another quiet hours from 20 s to 50 s into the
//!   run on its own clock, another a daily digest a minute or two into the run (its items' dips
//!   outlast it): their rows wait in the outbox, held, through the faults. When the faults stop,
//!   the digest rows detected after that digest (tomorrow's) are made due, as the clock reaching
//!   it does.
//! - Then the faults stop and the run waits until every row is terminal (or gives up).
//! - The audit prints each figure and exits 1 if one that must be zero is not: dedup keys with
//!   more than one row, rows not terminal, held rows past their release, watches whose long dip left no row (lost), rows marked
//!   `sent` the push service never accepted, deliveries whose row says "not delivered" without
//!   the maybe-delivered mark, deliveries of no row, stale deliveries outside the freshness bound,
//!   wrong baselines, dead-lettered messages, panics. Deliveries per row (duplicates are allowed:
//!   delivery is at least once) and stale deliveries inside the bound are reported. A withdrawal
//!   (the dip ended while its alert was current) is a row of its own, fresh after the dip.

use chrono::Utc;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tidings_benches::rng::Rng;
use tidings_domain::messages::Subscription;
use tidings_domain::subjects::StreamKind;
use tidings_tests::brokers::PrivateNats;
use tidings_tests::fake_catalog::Item;
use tidings_tests::fake_push::{Answer, FakePushService, Faults};
use tidings_tests::fake_smtp::{FakeSmtp, SmtpOptions, received_at, received_in};
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

const THRESHOLD: i64 = 1000;
const HIGH: i64 = 1500;
const LOW: i64 = 900;
const DEVICES: usize = 200;
const ZONES: [&str; 4] = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"];
/// The freshness bound the run configures (TIDINGS_PUSH_DEADLINE).
const BOUND_MS: i64 = 2_000;
/// A dip at least this long cannot fall entirely into an outage: it must leave a row.
const MUST_DETECT_MS: i64 = 20_000;
const WORKERS: [&str; 3] = ["dispatcher", "pusher", "detector"];
/// Devices `d` with `d % 10` this have a daily digest.
const DIGEST_DEVICE: usize = 6;

/// An outbox row as the audit reads it.
#[derive(sqlx::FromRow)]
struct Row {
    id: uuid::Uuid,
    watch_id: uuid::Uuid,
    item_code: String,
    status: String,
    maybe_delivered: bool,
    sent_price: Option<i64>,
    /// A withdrawal: the sent row it replaced once the price was back up.
    withdraws: Option<uuid::Uuid>,
    /// A digest's row: the row its message was for (whose id the payload or Message-ID names).
    digest_of: Option<uuid::Uuid>,
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// The address of device `d` if it is an email device (one in five): plain, deferred once
/// (`defer-once-`) or answered late once (`slow-`), a third each.
fn address(d: usize) -> Option<String> {
    let prefix = match (d % 5 == 2).then_some((d / 5) % 3)? {
        0 => "slow-",
        1 => "defer-once-",
        _ => "",
    };
    Some(format!("{prefix}chaos-{d}@mail.test"))
}

/// The preferences of device `d`, if it has any (one in ten each, none an email device): a cap
/// of two per 30 s, quiet hours from 20 s to 50 s into the run on the device's own clock, or a
/// daily digest at the first minute past 60 s into it.
fn preferences(d: usize) -> Option<serde_json::Value> {
    let zone: chrono_tz::Tz = ZONES[d % ZONES.len()].parse().expect("a zone");
    let at = |secs| (Utc::now() + chrono::Duration::seconds(secs)).with_timezone(&zone);
    match d % 10 {
        4 => Some(serde_json::json!({"cap": {"max": 2, "window_seconds": 30}})),
        DIGEST_DEVICE => {
            let digest = at(120).format("daily at %H:%M").to_string();
            Some(serde_json::json!({ "digest": digest }))
        }
        8 => {
            let clock = |secs| at(secs).format("%H:%M:%S").to_string();
            Some(serde_json::json!({"quiet_hours": {"start": clock(20), "end": clock(50)}}))
        }
        _ => None,
    }
}

/// Devices with their subscriptions, and `per_device` watches each on an item of its own.
async fn seed(s: &Scenario, subs: &[Subscription], per_device: usize) -> Vec<String> {
    let pool = &s.db.pool;
    let mut items = Vec::new();
    let (_, link_key) = tidings_email::links::LinkKey::generate().expect("link key");
    for (d, sub) in subs.iter().enumerate() {
        let preferences = preferences(d).unwrap_or_else(|| serde_json::json!({}));
        let device = tidings_benches::seed::device(pool, ZONES[d % ZONES.len()], &preferences, sub)
            .await
            .expect("device");
        let mine: Vec<String> = (0..per_device)
            .map(|i| format!("ITEM-{:05}", d * per_device + i))
            .collect();
        tidings_benches::seed::watches(pool, device, &mine, THRESHOLD, HIGH)
            .await
            .expect("watches");
        if let Some(to) = address(d) {
            for statement in [
                "UPDATE devices SET channel = 'email' WHERE id = $1",
                "UPDATE watches SET channel = 'email' WHERE device_id = $1",
                "UPDATE push_subscriptions SET channel = 'email', endpoint = 'mailto:' || $2,
                        secret = $3, p256dh = NULL, auth = NULL WHERE device_id = $1",
            ] {
                sqlx::query(statement)
                    .bind(device)
                    .bind(&to)
                    .bind(&link_key)
                    .execute(pool)
                    .await
                    .expect("an email device");
            }
        }
        items.extend(mine);
    }
    items
}

/// The outbox row a mail is for: its `Message-ID`'s local part.
fn message_row(message: &[u8]) -> String {
    let text = String::from_utf8_lossy(message);
    (text.lines())
        .find_map(|l| l.strip_prefix("Message-ID: <"))
        .and_then(|id| id.split('@').next())
        .unwrap_or_default()
        .to_owned()
}

async fn count(s: &Scenario, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&s.db.pool)
        .await
        .unwrap_or(-1)
}

/// The local stack's script, which the chaos run calls to crash Postgres.
const STACK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/local/stack");

/// Runs a stack command; a disruption that did not happen fails the run, so a report never
/// claims one it did not make.
fn stack(args: &[&str]) {
    tidings_tests::harness::succeeds(
        std::process::Command::new("bash").arg(STACK).args(args),
        &format!("chaos: stack {args:?}"),
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(120);
    let watches: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let per_device = watches.div_ceil(DEVICES).max(1);
    let window_ms = i64::try_from(secs * 1000).unwrap_or(i64::MAX);

    let s = Scenario::new().await;
    let mut nats = PrivateNats::started().await.expect("private nats-server");
    let push = FakePushService::start().await.expect("push service");
    let subs: Vec<Subscription> = (0..DEVICES).map(|_| push.subscription()).collect();
    for sub in subs.iter().step_by(20) {
        push.answer_always(sub, Answer::Gone);
    }
    let items = seed(&s, &subs, per_device).await;
    let smtp = FakeSmtp::start(&SmtpOptions::default()).expect("smtp server");
    let dkim = tidings_benches::dkim_key_file("tidings-chaos-dkim");
    let (smtp_port, dkim_file) = (smtp.port.to_string(), dkim.setting());
    let mut rng = Rng(16);
    let start = now_ms() + 5_000;
    let mut dips: HashMap<String, (i64, i64)> = HashMap::new();
    for (i, code) in items.iter().enumerate() {
        let mut at = start + (rng.unit() * 0.85 * window_ms as f64) as i64;
        let mut len = (300f64.ln() + rng.unit() * (60_000f64.ln() - 300f64.ln())).exp() as i64;
        if i / per_device % 10 == DIGEST_DEVICE {
            // A digest reader's dips start in the first 40 % and outlast its digest (at most
            // 125 s in), so its digests carry several rows through the faults.
            (at, len) = (start + (at - start) * 40 / 85, 125_000);
        }
        dips.insert(code.clone(), (at, at + len));
        s.catalog.set(
            code,
            Item {
                timeline: vec![(at, LOW), (at + len, HIGH)],
                ..Item::priced(HIGH)
            },
        );
    }
    let env = [
        ("NATS_URL", nats.url.as_str()),
        ("RUST_LOG", "warn"),
        ("TIDINGS_SCAN_INTERVAL", "500ms"),
        ("TIDINGS_RETRY_BASE", "1s"),
        ("TIDINGS_MAX_RETRIES", "5"),
        ("TIDINGS_PUSH_DEADLINE", "2s"),
        ("TIDINGS_PUSH_HTTP_TIMEOUT", "2s"),
        ("TIDINGS_RESULT_ACK_WAIT", "3s"),
        ("TIDINGS_SENDING_LEASE", "13s"),
        ("TIDINGS_SOURCE_TIMEOUT", "2s"),
        ("TIDINGS_SMTP_HOST", "127.0.0.1"),
        ("TIDINGS_SMTP_PORT", smtp_port.as_str()),
        ("TIDINGS_SMTP_SECURITY", "plain"),
        (
            "TIDINGS_EMAIL_FROM",
            "Tidings chaos <chaos@tidings.invalid>",
        ),
        ("TIDINGS_DKIM_KEY_FILE", dkim_file.as_str()),
    ];
    let mut p = Pipeline::start_only(&s, &WORKERS, &env).await;
    eprintln!(
        "chaos: {} watches on {} items, {secs} s of faults",
        items.len(),
        items.len()
    );
    s.catalog.set_faults(10);
    push.set_faults(Some(Faults {
        server_error: 50,
        too_many_requests: 10,
        slow_created: 10,
        slow_delay: Duration::from_secs(3),
    }));

    // The fault schedule: a worker every 10–20 s; the broker at 30 % and 70 % of the window,
    // Postgres at 45 % and 85 %.
    let mut events: Vec<(i64, &str)> = vec![
        (start + window_ms * 30 / 100, "nats"),
        (start + window_ms * 70 / 100, "nats"),
        (start + window_ms * 45 / 100, "postgres"),
        (start + window_ms * 85 / 100, "postgres"),
    ];
    let mut t = start;
    loop {
        t += i64::try_from(rng.between(10_000, 20_000)).unwrap_or(15_000);
        if t >= start + window_ms {
            break;
        }
        events.push((t, WORKERS[(rng.unit() * 3.0) as usize % 3]));
    }
    events.sort();
    let mut kills: HashMap<&str, usize> = HashMap::new();
    let mut unexpected_exits = Vec::new();
    let supervise = |p: &mut Pipeline, unexpected: &mut Vec<String>| {
        for (name, status) in p.exited() {
            unexpected.push(format!("{name}: {status}"));
            p.spawn(name);
        }
    };
    for (at, what) in events {
        while now_ms() < at {
            supervise(&mut p, &mut unexpected_exits);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        *kills.entry(what).or_default() += 1;
        eprintln!("chaos: +{:>4} s kill -9 {what}", (now_ms() - start) / 1000);
        match what {
            "nats" => {
                nats.kill();
                tokio::time::sleep(Duration::from_secs(2)).await;
                nats.start().await.expect("nats-server restarts");
            }
            "postgres" => stack(&["pg-crash", "2"]),
            worker => {
                let name = WORKERS
                    .into_iter()
                    .find(|w| *w == worker)
                    .unwrap_or("pusher");
                p.kill(name);
                tokio::time::sleep(Duration::from_secs(1)).await;
                p.spawn(name);
            }
        }
    }
    while now_ms() < start + window_ms {
        supervise(&mut p, &mut unexpected_exits);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Faults off; wait for every row to end (and for every dip to be over).
    s.catalog.set_faults(0);
    push.set_faults(None);
    let last_dip_end = dips.values().map(|(_, end)| *end).max().unwrap_or(start);
    // Tomorrow's digest, for what was detected after today's, comes now.
    let next_digest = "UPDATE outbox SET next_attempt_at = now()
                       WHERE held = 'digest' AND status IN ('pending', 'retry')";
    let drain = Instant::now();
    let mut open = -1;
    while drain.elapsed() < Duration::from_secs(240) {
        supervise(&mut p, &mut unexpected_exits);
        open = count(
            &s,
            "SELECT count(*) FROM outbox WHERE status NOT IN ('sent', 'dropped', 'failed')",
        )
        .await;
        if open == 0 && now_ms() > last_dip_end + 5_000 {
            break;
        }
        if now_ms() > last_dip_end {
            let _ = sqlx::query(next_digest).execute(&s.db.pool).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_after = count(
        &s,
        "SELECT count(*) FROM outbox WHERE status NOT IN ('sent', 'dropped', 'failed')",
    )
    .await;
    eprintln!(
        "chaos: drained in {:.0} s ({open} open when it stopped waiting)",
        drain.elapsed().as_secs_f64()
    );

    // The audit.
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT o.id, o.watch_id, w.item_code, o.status, o.maybe_delivered,
                (o.sent_value->>'price')::bigint AS sent_price, o.withdraws, o.digest_of
         FROM outbox o JOIN watches w ON w.id = o.watch_id",
    )
    .fetch_all(&s.db.pool)
    .await
    .expect("outbox");
    let dup_keys = count(
        &s,
        "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE replay_of IS NULL
         GROUP BY watch_id, trigger, dedup_day, channel HAVING count(*) > 1) d",
    )
    .await;
    // Deliveries by the row they were for (the payload's id).
    let mut delivered: HashMap<String, Vec<i64>> = HashMap::new();
    for r in push.received() {
        delivered
            .entry(r.notification_id().unwrap_or_default())
            .or_default()
            .push(r.at_ms);
    }
    // Mails by the row their Message-ID names (`<row id@domain>`).
    let mails = received_in(smtp.folder());
    for ((_, message), at) in mails.iter().zip(received_at(smtp.folder())) {
        delivered.entry(message_row(message)).or_default().push(at);
    }
    // A digest's message names its leader; it was each member's delivery too.
    for r in &rows {
        if let Some(leader) = r.digest_of.filter(|l| *l != r.id)
            && let Some(times) = delivered.get(&leader.to_string()).cloned()
        {
            delivered.entry(r.id.to_string()).or_default().extend(times);
        }
    }
    let by_id: HashMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.to_string(), i))
        .collect();
    let unattributed = delivered.keys().filter(|t| !by_id.contains_key(*t)).count();
    let (mut sent_not_delivered, mut delivered_unflagged, mut delivered_flagged) = (0, 0, 0);
    let mut flagged_not_delivered = 0;
    // Delivered more than once without the maybe-delivered mark: a second push the delivery log
    // should have stopped (reported; at least once allows it).
    let mut repeated_unmarked = 0;
    // Rows behind a failing must-be-zero figure, described when the audit fails.
    let mut suspects: Vec<(String, Vec<i64>)> = Vec::new();
    let mut per_row: HashMap<usize, usize> = HashMap::new();
    let (mut stale_inside, mut stale_outside, mut fresh) = (0, 0, 0);
    // How long after the price went back up the latest stale delivery came (ms).
    let mut worst_lag = 0;
    for (id, &i) in &by_id {
        let row = &rows[i];
        let times = delivered.get(id).cloned().unwrap_or_default();
        *per_row.entry(times.len()).or_default() += 1;
        if times.len() > 1 && !row.maybe_delivered {
            repeated_unmarked += 1;
        }
        match (row.status.as_str(), times.is_empty(), row.maybe_delivered) {
            ("sent", true, _) => {
                sent_not_delivered += 1;
                suspects.push((id.clone(), times.clone()));
            }
            ("sent", false, _) => {}
            (_, false, false) => {
                delivered_unflagged += 1;
                suspects.push((id.clone(), times.clone()));
            }
            (_, false, true) => delivered_flagged += 1,
            (_, true, true) => flagged_not_delivered += 1,
            (_, true, false) => {}
        }
        let (down, up) = dips[&row.item_code];
        for at in times {
            // A withdrawal says the dip is over: it is fresh once the price is back up, and
            // stale (outside any bound) before.
            if row.withdraws.is_some() {
                if at >= up {
                    fresh += 1;
                } else {
                    stale_outside += 1;
                }
            } else if (down..up).contains(&at) {
                fresh += 1;
            } else if at >= up && at - up <= BOUND_MS {
                stale_inside += 1;
                worst_lag = worst_lag.max(at - up);
            } else {
                stale_outside += 1;
            }
        }
    }
    let watched: Vec<(uuid::Uuid, String)> = sqlx::query_as("SELECT id, item_code FROM watches")
        .fetch_all(&s.db.pool)
        .await
        .expect("watches");
    let with_row: HashSet<uuid::Uuid> = rows.iter().map(|r| r.watch_id).collect();
    let lost = watched
        .iter()
        .filter(|(w, item)| {
            let (down, up) = dips[item];
            up - down >= MUST_DETECT_MS && !with_row.contains(w)
        })
        .count();
    let baselines: HashMap<uuid::Uuid, i64> =
        sqlx::query_as::<_, (uuid::Uuid, i64)>("SELECT watch_id, price FROM baselines")
            .fetch_all(&s.db.pool)
            .await
            .expect("baselines")
            .into_iter()
            .collect();
    let sent_watches: HashSet<uuid::Uuid> = rows
        .iter()
        .filter(|r| r.status == "sent")
        .map(|r| r.watch_id)
        .collect();
    // Each watch has one alert here (one dip, one day) and perhaps its withdrawal: its baseline
    // is the value the last of them that was sent reported.
    let mut expected: HashMap<uuid::Uuid, Option<i64>> = HashMap::new();
    for r in rows.iter().filter(|r| r.status == "sent") {
        if r.withdraws.is_some() || !expected.contains_key(&r.watch_id) {
            expected.insert(r.watch_id, r.sent_price);
        }
    }
    let wrong_baselines = expected
        .iter()
        .filter(|(w, price)| baselines.get(*w) != price.as_ref())
        .count()
        + baselines
            .keys()
            .filter(|w| !sent_watches.contains(w))
            .count();
    let js = async_nats::jetstream::new(nats.client().await.expect("nats"));
    let dlq = match js.get_stream(s.subjects.stream(StreamKind::Dlq)).await {
        Ok(st) => st.cached_info().state.messages,
        Err(_) => 0,
    };
    let panics: usize = WORKERS
        .iter()
        .map(|n| p.log(n).matches("panicked").count())
        .sum();
    // A held row is due at its release; past it by a claim's lease and a sweep, it is stuck.
    let held_stuck = count(
        &s,
        "SELECT count(*) FROM outbox WHERE held IS NOT NULL AND status IN ('pending', 'retry')
           AND next_attempt_at < now() - interval '35 seconds'",
    )
    .await;
    let held: Vec<(String, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT held, status, reason, count(*) FROM outbox WHERE held IS NOT NULL
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap_or_default();
    let states: Vec<(String, Option<String>, bool, i64)> = sqlx::query_as(
        "SELECT status, reason, maybe_delivered, count(*) FROM outbox GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap_or_default();

    println!(
        "\n## Chaos run: {secs} s of faults, {} watches\n",
        items.len()
    );
    let email_rows: Vec<(String, bool, i64)> = sqlx::query_as(
        "SELECT status, maybe_delivered, count(*) FROM outbox WHERE channel = 'email'
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap_or_default();
    println!(
        "email: {} mails received by the SMTP server; rows (status, maybe delivered, count): {email_rows:?}",
        mails.len()
    );
    println!(
        "kill -9: {:?}; services that exited by themselves and were restarted: {}",
        kills,
        unexpected_exits.len()
    );
    for e in &unexpected_exits {
        println!("  exited: {e}");
    }
    println!("held for their readers (why, status, reason, rows): {held:?}");
    let digests: (i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT digest_of), count(*) FROM outbox
         WHERE digest_of IS NOT NULL AND status = 'sent'",
    )
    .fetch_one(&s.db.pool)
    .await
    .unwrap_or_default();
    // A reader has today's digest and tomorrow's; more says a digest went out in pieces.
    let per_reader: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT n, count(*) FROM (
             SELECT device_id, count(DISTINCT digest_of) AS n FROM outbox
             WHERE digest_of IS NOT NULL AND status = 'sent' GROUP BY device_id) AS r
         GROUP BY n ORDER BY n",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap_or_default();
    println!(
        "digests sent: {} messages carrying {} rows; messages per reader (messages, readers): \
         {per_reader:?}",
        digests.0, digests.1
    );
    println!("\n| outcome | count |\n|---|---|");
    for (status, reason, maybe, n) in &states {
        let mark = if *maybe { " (maybe delivered)" } else { "" };
        println!(
            "| {status} {}{mark} | {n} |",
            reason.as_deref().unwrap_or("")
        );
    }
    let mut per_row: Vec<_> = per_row.into_iter().collect();
    per_row.sort();
    println!("\ndeliveries per row (deliveries: rows): {per_row:?}");
    println!(
        "deliveries: {fresh} in the dip, {stale_inside} stale inside the {BOUND_MS} ms freshness bound \
         (the latest {worst_lag} ms after the price went back up)"
    );
    println!(
        "rows marked maybe delivered and not sent: {delivered_flagged} were delivered, \
         {flagged_not_delivered} were not; rows delivered more than once without the mark: \
         {repeated_unmarked}"
    );
    let must_be_zero = [
        ("dedup keys with more than one row", dup_keys),
        ("rows not terminal", open_after),
        ("held rows past their release", held_stuck),
        ("watches whose long dip left no row (lost)", lost as i64),
        (
            "rows `sent` the push service never accepted",
            sent_not_delivered,
        ),
        (
            "deliveries of rows recorded as not delivered, unmarked",
            delivered_unflagged,
        ),
        ("deliveries of no row", unattributed as i64),
        (
            "stale deliveries outside the freshness bound",
            stale_outside,
        ),
        ("wrong baselines", wrong_baselines as i64),
        ("dead-lettered messages", i64::try_from(dlq).unwrap_or(-1)),
        ("panics", panics as i64),
    ];
    println!("\n| must be zero | count |\n|---|---|");
    let mut failed = false;
    for (what, n) in must_be_zero {
        println!("| {what} | {n} |");
        failed |= n != 0;
    }
    if failed {
        describe(&s, &p, &suspects).await;
        for n in WORKERS {
            let log = p.log(n);
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            eprintln!(
                "--- {n} (last lines)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    p.stop().await;
    s.cleanup().await;
    if failed {
        println!("\nchaos: the audit FAILED");
        std::process::exit(1);
    }
    println!("\nchaos: the audit passed");
}

/// Prints what is known of each suspect row: the row, its attempts, when the push service or the
/// mail server took it, and every service log line that names it.
async fn describe(s: &Scenario, p: &Pipeline, suspects: &[(String, Vec<i64>)]) {
    for (id, times) in suspects {
        let Ok(uuid) = uuid::Uuid::parse_str(id) else {
            continue;
        };
        let row: Option<serde_json::Value> = sqlx::query_scalar(
            "SELECT to_jsonb(o) - 'payload' - 'checked' FROM outbox o WHERE id = $1",
        )
        .bind(uuid)
        .fetch_optional(&s.db.pool)
        .await
        .unwrap_or(None);
        let attempts: Vec<serde_json::Value> =
            sqlx::query_scalar("SELECT to_jsonb(a) FROM attempts a WHERE outbox_id = $1")
                .bind(uuid)
                .fetch_all(&s.db.pool)
                .await
                .unwrap_or_default();
        eprintln!(
            "--- suspect row {id}, delivered at {times:?}
row: {row:?}
attempts: {attempts:?}"
        );
        for n in WORKERS {
            for line in p.log(n).lines().filter(|l| l.contains(id.as_str())) {
                eprintln!("{n}: {line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Regression: when the benchmarks moved to tests/benches this path still climbed one level,
    /// every `pg-crash` failed with "No such file or directory", and the run went on without it.
    #[test]
    fn the_stack_script_is_where_the_chaos_run_calls_it() {
        assert!(
            std::path::Path::new(super::STACK).is_file(),
            "{}",
            super::STACK
        );
    }
}
