//! Quiet hours, caps and digests through the real services: a notification that falls in its
//! reader's quiet hours, over their cap, or into their digest waits in the outbox (pending,
//! `held`, due at its release) and is re-checked at the release like any send: sent (a digest's
//! together, as one message) if still true, dropped if not. Windows of seconds, on the reader's
//! own clock (a device in Asia/Tokyo against services on UTC); a digest's hours away, so its
//! tests bring the digest time forward by making its rows due, as the clock reaching it does.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::time::Duration;
use tidings_domain::subjects::StreamKind;
use tidings_tests::binaries::cli;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::harness::poll_wait;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{ADMIN_TOKEN, Pipeline, call, watch_below};

/// A Web Push device on `push` in `time_zone` with `preferences`, registered through the api:
/// its token.
async fn device(
    p: &Pipeline,
    push: &FakePushService,
    time_zone: &str,
    preferences: Value,
) -> String {
    let sub = push.subscription();
    let body = json!({
        "subscription": {"endpoint": sub.endpoint, "keys": {"p256dh": sub.p256dh, "auth": sub.auth}},
        "time_zone": time_zone,
        "preferences": preferences,
    });
    let url = format!("{}/v1/devices", p.url("api"));
    let (status, created) = call(reqwest::Method::POST, url, None, Some(body)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["preferences"], preferences);
    created["token"].as_str().unwrap().to_owned()
}

/// One outbox row as these tests read it.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Row {
    id: uuid::Uuid,
    item_code: String,
    status: String,
    reason: Option<String>,
    held: Option<String>,
    next_attempt_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    digest_of: Option<uuid::Uuid>,
}

async fn rows(s: &Scenario) -> Vec<Row> {
    sqlx::query_as(
        "SELECT o.id, w.item_code, o.status, o.reason, o.held, o.next_attempt_at, o.finished_at,
                o.digest_of
         FROM outbox o JOIN watches w ON w.id = o.watch_id ORDER BY w.item_code, o.created_at",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap()
}

/// The rows once `done` says so, within `secs`.
async fn rows_when(s: &Scenario, secs: u64, what: &str, done: impl Fn(&[Row]) -> bool) -> Vec<Row> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let r = rows(s).await;
        if done(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not within {secs} s: {r:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The dispatcher's counter `name` with `labels` (as written in the exposition), or 0.
async fn counter(p: &Pipeline, name: &str, labels: &str) -> f64 {
    let text = p.metrics("dispatcher").await;
    let series = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn a_drop_in_quiet_hours_goes_at_their_end_if_still_true_and_is_dropped_if_not() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let p = Pipeline::start(&s, &[]).await;
    // Quiet from a minute ago until 15 s from now on a Tokyo clock, nine hours ahead of the
    // services' UTC: read in UTC, the same hours would be far from now.
    let tokyo: chrono_tz::Tz = "Asia/Tokyo".parse().unwrap();
    let now = Utc::now();
    let end = now + chrono::Duration::seconds(15);
    let clock = |t: DateTime<Utc>| t.with_timezone(&tokyo).format("%H:%M:%S").to_string();
    let quiet = json!({"quiet_hours": {"start": clock(now - chrono::Duration::minutes(1)), "end": clock(end)}});
    let token = device(&p, &push, "Asia/Tokyo", quiet).await;
    for item in ["SKU-Q1", "SKU-Q2"] {
        s.catalog.set_price(item, 1500);
        watch_below(&p, &token, item, 1200).await;
    }
    // An urgent watch's row goes at once, and so does one of a watch whose own preferences
    // (none) replace its device's.
    for (item, own) in [
        ("SKU-Q3", json!({"urgent": true})),
        ("SKU-Q4", json!({"preferences": {}})),
    ] {
        s.catalog.set_price(item, 1500);
        let mut body = json!({"item_code": item,
                              "triggers": [{"kind": "price_below", "threshold": 1200}]});
        body.as_object_mut()
            .unwrap()
            .extend(own.as_object().unwrap().clone());
        let url = format!("{}/v1/watches", p.url("api"));
        let (status, watch) = call(reqwest::Method::POST, url, Some(&token), Some(body)).await;
        assert_eq!(status, 201, "{watch}");
    }
    for item in ["SKU-Q1", "SKU-Q2", "SKU-Q3", "SKU-Q4"] {
        s.catalog.set_price(item, 1000);
    }

    let held = rows_when(&s, 12, "both rows held", |r| {
        r.iter()
            .filter(|r| r.held.as_deref() == Some("quiet_hours"))
            .count()
            == 2
    })
    .await;
    // The device's history and the operator's CLI show them held, with their release.
    let url = format!("{}/v1/notifications", p.url("api"));
    let (status, history) = call(reqwest::Method::GET, url, Some(&token), None).await;
    assert_eq!(status, 200, "{history}");
    let q1 = (history["items"].as_array().unwrap().iter())
        .find(|n| n["item_code"] == "SKU-Q1")
        .unwrap();
    assert_eq!(q1["held"], "quiet_hours", "{q1}");
    let release: DateTime<Utc> = serde_json::from_value(q1["release_at"].clone()).unwrap();
    assert_eq!(release.timestamp(), end.timestamp());
    let shown = cli(
        &p.ops_url("api"),
        ADMIN_TOKEN,
        &["outbox", "show", q1["id"].as_str().unwrap()],
    );
    assert!(
        shown
            .stdout
            .lines()
            .any(|l| l.starts_with("held:") && l.ends_with("quiet_hours")),
        "{shown:?}"
    );
    let at_once = ["SKU-Q3", "SKU-Q4"];
    for r in held
        .iter()
        .filter(|r| !at_once.contains(&r.item_code.as_str()))
    {
        assert_eq!(r.status, "pending", "{r:?}");
        assert_eq!(
            r.next_attempt_at.timestamp(),
            end.timestamp(),
            "due at their end: {r:?}"
        );
    }
    let sent = rows_when(&s, 10, "the urgent and the unheld rows sent", |r| {
        let sent = |item: &str| r.iter().any(|r| r.item_code == item && r.status == "sent");
        at_once.iter().all(|item| sent(item))
    })
    .await;
    assert!(
        (sent.iter())
            .filter(|r| at_once.contains(&r.item_code.as_str()))
            .all(|r| r.held.is_none()),
        "{sent:#?}"
    );
    assert_eq!(push.received().len(), 2, "only those before the end");

    // Q2's price recovers while it waits.
    s.catalog.set_price("SKU-Q2", 1500);
    let ended = rows_when(&s, 30, "both held rows ended", |r| {
        r.iter()
            .all(|r| ["sent", "dropped"].contains(&r.status.as_str()))
    })
    .await;
    let q1 = ended.iter().find(|r| r.item_code == "SKU-Q1").unwrap();
    let q2 = ended.iter().find(|r| r.item_code == "SKU-Q2").unwrap();
    assert_eq!(
        (q1.status.as_str(), q1.held.as_deref()),
        ("sent", Some("quiet_hours"))
    );
    // The end is written to the second.
    let end_second = end.timestamp();
    assert!(
        q1.finished_at.unwrap().timestamp() >= end_second,
        "not before their end: {q1:?}"
    );
    assert_eq!(
        (q2.status.as_str(), q2.reason.as_deref(), q2.held.as_deref()),
        ("dropped", Some("condition_lost"), Some("quiet_hours")),
        "re-checked at the release"
    );
    let ids: Vec<String> = push
        .received()
        .iter()
        .filter_map(|r| r.notification_id())
        .collect();
    assert_eq!(ids.len(), 3, "Q3, Q4 and Q1, once each: {ids:?}");
    assert!(ids.contains(&q1.id.to_string()));

    let quiet = "held=\"quiet_hours\"";
    assert_eq!(
        counter(&p, "tidings_notifications_held_total", quiet).await,
        2.0
    );
    for (outcome, n) in [("sent", 1.0), ("dropped", 1.0)] {
        let labels = format!("{quiet},outcome=\"{outcome}\"");
        assert_eq!(
            counter(&p, "tidings_notifications_released_total", &labels).await,
            n,
            "{outcome}"
        );
    }
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_cap_holds_the_sixth_and_releases_it_into_the_next_window_while_it_holds() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let p = Pipeline::start(&s, &[]).await;
    let window = 8;
    let cap = json!({"cap": {"max": 5, "window_seconds": window}});
    let token = device(&p, &push, "UTC", cap).await;
    let items: Vec<String> = (1..=7).map(|i| format!("SKU-C{i}")).collect();
    for item in &items {
        s.catalog.set_price(item, 1500);
        watch_below(&p, &token, item, 1200).await;
    }
    for item in &items {
        s.catalog.set_price(item, 1000);
    }
    let first = rows_when(&s, 15, "five sent and two held", |r| {
        r.len() == 7
            && r.iter().filter(|r| r.status == "sent").count() == 5
            && r.iter()
                .filter(|r| r.held.as_deref() == Some("cap") && r.status == "pending")
                .count()
                == 2
    })
    .await;
    // One of the two held recovers before its release.
    let recovered = first
        .iter()
        .find(|r| r.status == "pending")
        .unwrap()
        .item_code
        .clone();
    s.catalog.set_price(&recovered, 1500);

    let ended = rows_when(&s, 30, "every row ended", |r| {
        r.iter()
            .all(|r| ["sent", "dropped"].contains(&r.status.as_str()))
    })
    .await;
    let sent: Vec<&Row> = ended.iter().filter(|r| r.status == "sent").collect();
    assert_eq!(sent.len(), 6, "{ended:#?}");
    let dropped: Vec<&Row> = ended.iter().filter(|r| r.status == "dropped").collect();
    assert_eq!(dropped.len(), 1);
    assert_eq!(
        (
            dropped[0].item_code.as_str(),
            dropped[0].reason.as_deref(),
            dropped[0].held.as_deref()
        ),
        (recovered.as_str(), Some("condition_lost"), Some("cap"))
    );
    // Never more than five in any window.
    let mut times: Vec<DateTime<Utc>> = sent.iter().map(|r| r.finished_at.unwrap()).collect();
    times.sort();
    for pair in times.windows(6) {
        assert!(
            pair[5] - pair[0] >= chrono::Duration::seconds(window),
            "{times:?}"
        );
    }
    assert_eq!(push.received().len(), 6);
    p.stop().await;
    s.cleanup().await;
}

/// A device with a daily digest at 08:00 Berlin time watching `items`, each dropping below its
/// threshold; returns once every row waits for the digest, due at the next 08:00.
async fn digest_reader(s: &Scenario, p: &Pipeline, push: &FakePushService, items: &[String]) {
    let token = device(
        p,
        push,
        "Europe/Berlin",
        json!({"digest": "daily at 08:00"}),
    )
    .await;
    for item in items {
        s.catalog.set_price(item, 1500);
        watch_below(p, &token, item, 1200).await;
    }
    for item in items {
        s.catalog.set_price(item, 1000);
    }
    let held = rows_when(s, 15, "every row held for the digest", |r| {
        r.len() == items.len()
            && r.iter()
                .all(|r| r.held.as_deref() == Some("digest") && r.status == "pending")
    })
    .await;
    let berlin: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
    for r in &held {
        let local = r.next_attempt_at.with_timezone(&berlin);
        assert_eq!(local.format("%H:%M:%S").to_string(), "08:00:00", "{r:?}");
        assert!(
            r.next_attempt_at - Utc::now() <= chrono::Duration::hours(25),
            "{r:?}"
        );
    }
    assert!(push.received().is_empty(), "nothing before the digest");
}

#[tokio::test]
async fn a_daily_digest_of_five_sends_one_notification_listing_the_three_still_true() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let p = Pipeline::start(&s, &[]).await;
    let items: Vec<String> = (1..=5).map(|i| format!("SKU-D{i}")).collect();
    digest_reader(&s, &p, &push, &items).await;
    // Two recover while they wait.
    for item in ["SKU-D2", "SKU-D4"] {
        s.catalog.set_price(item, 1500);
    }
    s.db.digest_time().await;

    let ended = rows_when(&s, 20, "every row ended", |r| {
        r.iter()
            .all(|r| ["sent", "dropped"].contains(&r.status.as_str()))
    })
    .await;
    let sent: Vec<&Row> = ended.iter().filter(|r| r.status == "sent").collect();
    let sent_items: Vec<&str> = sent.iter().map(|r| r.item_code.as_str()).collect();
    assert_eq!(sent_items, ["SKU-D1", "SKU-D3", "SKU-D5"], "{ended:#?}");
    let leader = sent.iter().map(|r| r.id).min().unwrap();
    assert!(
        sent.iter().all(|r| r.digest_of == Some(leader)),
        "{sent:#?}"
    );
    for r in ended.iter().filter(|r| r.status == "dropped") {
        assert_eq!(
            (r.reason.as_deref(), r.held.as_deref(), r.digest_of),
            (Some("condition_lost"), Some("digest"), None),
            "re-checked at the digest time: {r:?}"
        );
    }
    // One message, for the leader, listing the three at their re-checked value.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = push.received();
    assert_eq!(received.len(), 1, "{received:#?}");
    let digest = received[0].json();
    assert_eq!(digest["title"], "3 of your watches", "{digest}");
    assert_eq!(digest["id"], leader.to_string());
    assert_eq!(digest["data"]["digest"], 3);
    let body = digest["body"].as_str().unwrap();
    for item in ["SKU-D1", "SKU-D3", "SKU-D5"] {
        assert!(body.contains(&format!("{item} now 10")), "{body}");
    }
    assert!(
        !body.contains("SKU-D2") && !body.contains("SKU-D4"),
        "{body}"
    );
    assert_eq!(received[0].urgency.as_deref(), Some("low"));
    let ttl: u32 = received[0].ttl.as_deref().unwrap().parse().unwrap();
    assert!(ttl > 0, "kept for an offline device");

    let digest_labels = "held=\"digest\"";
    for (outcome, n) in [("sent", 3.0), ("dropped", 2.0)] {
        let labels = format!("{digest_labels},outcome=\"{outcome}\"");
        assert_eq!(
            counter(&p, "tidings_notifications_released_total", &labels).await,
            n,
            "{outcome}"
        );
    }
    let metrics = p.metrics("dispatcher").await;
    let sum = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tidings_digest_members_sum "))
        .map(|v| v.trim().parse::<f64>().unwrap());
    assert_eq!(sum, Some(3.0), "one digest of three");
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_digest_survives_its_dispatcher_killed_mid_release_without_a_second_message() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    // No pusher yet: the digest is marked sending and published, and goes no further.
    let mut p = Pipeline::start_only(&s, &["api", "detector", "dispatcher"], &[]).await;
    let items: Vec<String> = (1..=3).map(|i| format!("SKU-K{i}")).collect();
    digest_reader(&s, &p, &push, &items).await;
    s.db.digest_time().await;
    let sending = rows_when(&s, 15, "the digest marked sending", |r| {
        r.iter()
            .all(|r| r.status == "sending" && r.digest_of.is_some())
    })
    .await;
    // Killed once the request is stored, not between the rows' commit and the publish: under
    // load that window is long enough to hit, and a row killed in it waits for the lease
    // sweeper (the dispatcher's `a_dispatcher_killed_mid_batch_loses_nothing`), not a pusher.
    let started = std::time::Instant::now();
    while s.stream_len(StreamKind::Push).await == 0 {
        poll_wait(started, 15, || {
            "the digest's request never published".into()
        })
        .await;
    }
    p.kill("dispatcher");
    let leader = sending.iter().map(|r| r.id).min().unwrap();
    assert!(sending.iter().all(|r| r.digest_of == Some(leader)));

    p.spawn("pusher");
    p.wait_ready("pusher").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while push.received().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the digest not pushed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The dispatcher comes back: the result (which waited in its stream) ends every member.
    p.spawn("dispatcher");
    p.wait_ready("dispatcher").await;
    let ended = rows_when(&s, 20, "every member sent", |r| {
        r.iter().all(|r| r.status == "sent")
    })
    .await;
    assert!(ended.iter().all(|r| r.digest_of == Some(leader)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let received = push.received();
    assert_eq!(received.len(), 1, "one message: {received:#?}");
    assert_eq!(received[0].json()["data"]["digest"], 3);
    p.stop().await;
    s.cleanup().await;
}
