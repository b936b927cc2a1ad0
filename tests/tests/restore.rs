//! Postgres restored to an earlier point under running services, by the procedure in
//! docs/operations.md ("Backup and restore"): a dump taken mid-burst, the burst finished, the
//! work stopped, the dump restored, the push stream purged, the work started again. Nothing is
//! stranded, and no notification reaches the push service twice unless its row says it may have.
//!
//! `TIDINGS_RESTORE_WATCHES` sets the burst (300 by default, as CI runs it; by hand 3000).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tidings_domain::outbox::Status;
use tidings_domain::subjects::StreamKind;
use tidings_tests::fake_push::{Answer, FakePushService};
use tidings_tests::fixtures;
use tidings_tests::harness::{poll_wait, rows_in};
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

/// A Postgres client program (`pg_dump`, `pg_restore`) of the server's major version.
fn pg_program(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.into_iter()
        .rev()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// `url` as libpq reads it: without sqlx's own query parameters.
fn libpq(url: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| p.starts_with("sslmode="))
        .collect();
    if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

fn run(program: &str, args: &[&str]) {
    tidings_tests::harness::succeeds(
        std::process::Command::new(pg_program(program)).args(args),
        &format!("{program} {args:?}"),
    );
}

#[tokio::test]
async fn postgres_restored_to_a_dump_taken_mid_burst_strands_nothing_and_repeats_nothing_unmarked()
{
    let n: i64 = std::env::var("TIDINGS_RESTORE_WATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let mut p = Pipeline::start(&s, &[("TIDINGS_SCAN_INTERVAL", "1s")]).await;
    fixtures::crowd(&s.db.pool, "SKU-1", &sub, n as usize)
        .await
        .unwrap();
    // Mid-burst, held there: the first tenth of the pushes is answered at once, the rest only
    // after 5 s (accepted on arrival, well inside the pusher's 10 s timeout), so the dump below
    // meets rows sent, rows in flight that the push service already has, and rows not yet
    // claimed, however fast the machine is.
    push.answer_always(&sub, Answer::CreatedAfter(Duration::from_secs(5)));
    push.answer_next(&sub, &vec![Answer::Created; (n / 10) as usize]);
    s.catalog.set_price("SKU-1", 1000);

    p.wait_for_rows(&s, &[Status::Sent], n / 10, 60).await;
    let dump = std::env::temp_dir().join(format!("tidings-restore-{}.dump", s.db.name));
    let url = libpq(&s.db.url);
    run("pg_dump", &["-Fc", "-f", dump.to_str().unwrap(), &url]);
    push.answer_always(&sub, Answer::Created);
    // What the dump holds, read from it once restored; meanwhile the burst finishes.
    let started = Instant::now();
    while s
        .db
        .rows_in(&[Status::Sent, Status::Dropped, Status::Failed])
        .await
        < n
    {
        poll_wait(started, 120, || {
            format!("burst unfinished:\n{}", p.log("dispatcher"))
        })
        .await;
    }
    let before_restore = push.received().len();

    // The procedure: stop the work, restore, purge the push stream, start the work.
    for name in ["detector", "dispatcher", "pusher", "api"] {
        let status = p.terminate(name, Duration::from_secs(20)).await;
        assert!(status.success(), "{name}: {status}");
    }
    // As a restore does: into an empty database of the same name.
    s.db.pool.close().await;
    let admin = sqlx::PgPool::connect(&tidings_tests::harness::stack().unwrap().admin_database_url)
        .await
        .unwrap();
    for sql in [
        format!("DROP DATABASE \"{}\" WITH (FORCE)", s.db.name),
        format!("CREATE DATABASE \"{}\"", s.db.name),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    admin.close().await;
    run("pg_restore", &["-d", &url, dump.to_str().unwrap()]);
    let _ = std::fs::remove_file(&dump);
    let pool = sqlx::PgPool::connect(&s.db.url).await.unwrap();
    let restored: Vec<(String, i64)> =
        sqlx::query_as("SELECT status::text, count(*) FROM outbox GROUP BY 1 ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    let undecided: i64 = restored
        .iter()
        .filter(|(st, _)| !matches!(st.as_str(), "sent" | "dropped" | "failed"))
        .map(|(_, c)| c)
        .sum();
    let stored: i64 = restored.iter().map(|(_, c)| c).sum();
    eprintln!("restored outbox: {restored:?}; {before_restore} pushes received before the restore");
    assert!(
        undecided + (n - stored) > 0,
        "the dump held every row decided: it proves nothing"
    );
    let js = async_nats::jetstream::new(tidings_tests::harness::nats().await.unwrap());
    js.get_stream(s.subjects.stream(StreamKind::Push))
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();
    // Restored rows repeat attempt numbers that were delivered: the pushers ask the delivery
    // log before every push while the restored rows drain.
    p.set_env("TIDINGS_PUSH_CHECK_EVERY_ATTEMPT", "true");
    for name in ["api", "dispatcher", "pusher", "detector"] {
        p.spawn(name);
    }
    for name in ["api", "dispatcher", "pusher", "detector"] {
        p.wait_ready(name).await;
    }

    // Nothing stranded: every watch ends with one row, decided.
    let started = Instant::now();
    loop {
        let rows = rows_in(&pool, &Status::ALL).await;
        let decided = rows_in(&pool, &[Status::Sent, Status::Dropped, Status::Failed]).await;
        if rows == n && decided == n {
            break;
        }
        poll_wait(started, 180, || {
            format!(
                "{decided} of {rows} rows decided, {n} watches:\n{}",
                p.log("dispatcher")
            )
        })
        .await;
    }
    let sent = rows_in(&pool, &[Status::Sent]).await;
    assert_eq!(sent, n, "every watch's notification ends sent");

    // Nothing repeated unmarked: a row the push service got twice says it may have been.
    let marked: Vec<(uuid::Uuid, bool)> = sqlx::query_as("SELECT id, maybe_delivered FROM outbox")
        .fetch_all(&pool)
        .await
        .unwrap();
    let marked: HashMap<String, (uuid::Uuid, bool)> = marked
        .into_iter()
        .map(|(id, m)| (id.to_string(), (id, m)))
        .collect();
    let mut by_row: HashMap<String, usize> = HashMap::new();
    for r in push.received() {
        *by_row
            .entry(r.notification_id().unwrap_or_default())
            .or_default() += 1;
    }
    let mut repeated = 0;
    for (row, times) in &by_row {
        if *times > 1 {
            repeated += 1;
            let (id, maybe) = marked.get(row).copied().unwrap_or_default();
            assert!(
                maybe,
                "row {id} reached the push service {times} times, unmarked"
            );
        }
    }
    let once = by_row.values().filter(|t| **t == 1).count();
    eprintln!(
        "{n} watches: {undecided} rows undecided and {} missing in the dump; after the restore \
         {} pushes in all, {once} rows pushed once, {repeated} more than once (each marked)",
        n - stored,
        push.received().len()
    );
    pool.close().await;
    p.stop().await;
    s.cleanup().await;
}
