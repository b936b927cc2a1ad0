//! Retention against real Postgres: forty days of notifications leave only the retention window
//! (rows inside it untouched, the dedup key still refusing a duplicate); an expired week that
//! still holds a row to decide is kept until it is decided; the database itself refuses a drop
//! the plan should never ask for.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/scenario.rs"]
mod scenario;

use chrono::{Duration, NaiveDate, TimeZone, Utc};
use serde_json::Value;
use tidings_bus::consume::Handler as _;
use tidings_dispatcher::retention;
use tidings_domain::WatchId;
use tidings_domain::outbox::{DropReason, Event, Status};
use tidings_domain::retention::{Retention, week_of};
use tidings_domain::trigger::Trigger;
use tidings_store::partitions::Partitions;
use tidings_testkit::fixtures::{self, Device, Inserted};
use tidings_testkit::harness::TestDb;
use tidings_testkit::walk::walk;

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };

async fn watched(db: &TestDb) -> (Device, WatchId) {
    let device = fixtures::device(&db.pool, "UTC").await.unwrap();
    let watch = fixtures::watch(&db.pool, device.id, "SKU-1", &[BELOW_1200], Some(1500))
        .await
        .unwrap();
    (device, watch)
}

/// A notification detected at noon UTC on `day`.
async fn notify(db: &TestDb, device: &Device, watch: WatchId, day: NaiveDate) -> Inserted {
    let at = Utc.from_utc_datetime(&day.and_hms_opt(12, 0, 0).unwrap());
    let req = fixtures::enqueue_request(device, watch, BELOW_1200, 1100, at);
    fixtures::insert_outbox(&db.pool, &req).await.unwrap()
}

/// Every pending row decided: withheld, as the re-check would.
async fn decide_all(db: &TestDb) {
    let pending = tidings_store::history::Filter {
        status: Some(tidings_domain::outbox::Status::Pending),
        ..Default::default()
    };
    let rows = tidings_store::history::deliveries(&db.pool, &pending, None, 100_000)
        .await
        .unwrap();
    for row in rows {
        let lost = Event::Withheld(DropReason::ConditionLost);
        walk(&db.pool, row.notification.id, [lost]).await;
    }
}

/// The rows from `from` on, whole, in id order.
async fn rows_from(db: &TestDb, from: NaiveDate) -> Vec<Value> {
    sqlx::query_scalar("SELECT to_jsonb(o) FROM outbox o WHERE dedup_day >= $1 ORDER BY id")
        .bind(from)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn forty_days_of_notifications_leave_only_the_retention_window() {
    let db = TestDb::new().await.unwrap();
    let (device, watch) = watched(&db).await;
    let today = Utc::now().date_naive();
    for back in 0..=40 {
        let inserted = notify(&db, &device, watch, today - Duration::days(back)).await;
        assert!(matches!(inserted, Inserted::New(_)));
    }
    decide_all(&db).await;
    // Each row's attempt, which must leave with its week.
    sqlx::query(
        "INSERT INTO outbox_attempts (outbox_id, dedup_day, attempt, outcome)
         SELECT id, dedup_day, 1, 'transient' FROM outbox",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // And what its device showed, which must leave with it too.
    sqlx::query(
        "INSERT INTO notifications_shown (outbox_id, dedup_day, device_id, shown)
         SELECT id, dedup_day, device_id, 'as_sent' FROM outbox",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let retention = Retention::days(30).unwrap();
    let first_kept_week = week_of(retention.kept_from(today));
    let inside = rows_from(&db, first_kept_week).await;

    let round = retention::run_once(&db.pool, retention, today)
        .await
        .unwrap();
    assert!(round.ran);
    assert!(round.kept.is_empty(), "{round:?}");
    // Every week that ended before the window began, and only those.
    let oldest = week_of(today - Duration::days(40));
    let expected: Vec<NaiveDate> = (0..)
        .map(|i| oldest + Duration::weeks(i))
        .take_while(|w| *w < first_kept_week)
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(round.dropped, expected);

    let days: Vec<NaiveDate> =
        sqlx::query_scalar("SELECT dedup_day FROM outbox ORDER BY dedup_day")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(days.first(), Some(&first_kept_week));
    // The whole window is there: every day from the first kept one to today, once.
    let window: Vec<NaiveDate> = (0..)
        .map(|i| first_kept_week + Duration::days(i))
        .take_while(|d| *d <= today)
        .collect();
    assert_eq!(days, window);
    let attempt_days: Vec<NaiveDate> =
        sqlx::query_scalar("SELECT dedup_day FROM outbox_attempts ORDER BY dedup_day")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempt_days, window, "the attempts left with their weeks");
    let shown_days: Vec<NaiveDate> =
        sqlx::query_scalar("SELECT dedup_day FROM notifications_shown ORDER BY dedup_day")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        shown_days, window,
        "what was shown left with its notification"
    );
    assert_eq!(round.shown_purged, 41 - window.len() as u64);
    let attempt_weeks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_attempts'::regclass",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let outbox_weeks: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        attempt_weeks, outbox_weeks,
        "one attempts partition per week"
    );
    assert!(retention.kept_from(today) >= first_kept_week);
    // Untouched, column for column.
    assert_eq!(rows_from(&db, first_kept_week).await, inside);
    // The dedup key still refuses a duplicate of a retained day.
    assert!(matches!(
        notify(&db, &device, watch, today - Duration::days(10)).await,
        Inserted::Duplicate
    ));
    // Rows still cannot be deleted one by one.
    assert!(
        sqlx::query("DELETE FROM outbox")
            .execute(&db.pool)
            .await
            .is_err()
    );
    // A second round finds nothing to do.
    let again = retention::run_once(&db.pool, retention, today)
        .await
        .unwrap();
    assert!(
        again.dropped.is_empty() && again.created.is_empty(),
        "{again:?}"
    );
}

#[tokio::test]
async fn an_expired_week_with_a_row_to_decide_is_kept_until_it_is_decided() {
    let db = TestDb::new().await.unwrap();
    let (device, watch) = watched(&db).await;
    let today = Utc::now().date_naive();
    let old = today - Duration::days(60);
    notify(&db, &device, watch, old).await;
    let retention = Retention::days(30).unwrap();

    let round = retention::run_once(&db.pool, retention, today)
        .await
        .unwrap();
    assert_eq!(round.kept, vec![week_of(old)]);
    assert!(round.dropped.is_empty());
    assert_eq!(db.rows_in(&[Status::Pending]).await, 1);
    decide_all(&db).await;
    let round = retention::run_once(&db.pool, retention, today)
        .await
        .unwrap();
    assert_eq!(round.dropped, vec![week_of(old)]);
    assert!(round.kept.is_empty());
    assert_eq!(db.count("SELECT count(*) FROM outbox").await, 0);
}

#[tokio::test]
async fn the_next_weeks_are_made_ahead_and_ingest_makes_a_missing_one() {
    let db = TestDb::new().await.unwrap();
    let today = Utc::now().date_naive();
    let round = retention::run_once(&db.pool, Retention::days(30).unwrap(), today)
        .await
        .unwrap();
    assert!(round.ran);
    for w in 0..=tidings_domain::retention::WEEKS_AHEAD {
        let week = week_of(today) + Duration::weeks(w);
        let name = format!("outbox_{}", week.format("%Y%m%d"));
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&name)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(exists, "{name}");
    }
    // A day far outside what exists: ingest's ensure makes its week, once.
    let far = today + Duration::days(400);
    let partitions = Partitions::default();
    partitions.ensure(&db.pool, [far, far]).await.unwrap();
    let name = format!("outbox_{}", week_of(far).format("%Y%m%d"));
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&name)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(exists);
}

/// Runs `sql` as `role` (the services' group roles), returning the error text if refused.
async fn as_role(db: &TestDb, role: &str, sql: &str) -> Result<Value, String> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SET LOCAL ROLE {role}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let result = sqlx::query_scalar::<_, Value>(&format!("SELECT to_jsonb(({sql}))"))
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string());
    let _ = tx.rollback().await;
    result
}

#[tokio::test]
async fn the_database_refuses_a_drop_inside_the_window_or_under_the_minimum() {
    let db = TestDb::new().await.unwrap();
    let today = Utc::now().date_naive();
    let this_week = week_of(today);
    let old = week_of(today - Duration::days(90));
    let call =
        |week: NaiveDate, days: i32| format!("SELECT outbox_drop_partition('{week}', {days})");
    let inside = as_role(&db, "tidings_dispatcher", &call(this_week, 30)).await;
    assert!(
        inside
            .unwrap_err()
            .contains("inside the 30 day retention window")
    );
    let short = as_role(&db, "tidings_dispatcher", &call(old, 7)).await;
    assert!(short.unwrap_err().contains("below the minimum of 8"));
    let not_monday = as_role(
        &db,
        "tidings_dispatcher",
        &call(old + Duration::days(1), 30),
    )
    .await;
    assert!(not_monday.unwrap_err().contains("is not the Monday"));
    assert_eq!(
        as_role(&db, "tidings_dispatcher", &call(old, 30)).await,
        Ok(Value::String("absent".into()))
    );
    // Only the dispatcher may make or drop partitions.
    for role in ["tidings_api", "tidings_detector"] {
        let refused = as_role(&db, role, &call(old, 30)).await.unwrap_err();
        assert!(refused.contains("permission denied"), "{role}: {refused}");
        let refused = as_role(
            &db,
            role,
            &format!("SELECT outbox_ensure_partition('{old}')"),
        )
        .await
        .unwrap_err();
        assert!(refused.contains("permission denied"), "{role}: {refused}");
    }
    assert_eq!(
        as_role(
            &db,
            "tidings_dispatcher",
            &format!("SELECT outbox_ensure_partition('{old}')")
        )
        .await,
        Ok(Value::Bool(true))
    );
}

/// What was removed before the oldest retained week is deleted for good; what a retained row
/// may refer to stays, and the device's history (as the api reads it) still names every watch.
#[tokio::test]
async fn what_was_removed_before_the_oldest_week_is_purged_and_the_rest_stays() {
    let db = TestDb::new().await.unwrap();
    // A device as the api registers one: with its subscription.
    let device = fixtures::device(&db.pool, "UTC").await.unwrap();
    let kept = tidings_domain::messages::Subscription {
        endpoint: "https://push.example/kept".into(),
        p256dh: "k".into(),
        auth: "a".into(),
    };
    fixtures::subscription(&db.pool, device.id, &kept)
        .await
        .unwrap();
    let today = Utc::now().date_naive();
    let long_ago = today - Duration::days(60);
    let recently = today - Duration::days(5);
    let watch_on = |item: &'static str| {
        let pool = db.pool.clone();
        async move {
            fixtures::watch(&pool, device.id, item, &[BELOW_1200], Some(1500))
                .await
                .unwrap()
        }
    };
    let (old_watch, recent_watch, kept_watch) = (
        watch_on("SKU-OLD").await,
        watch_on("SKU-RECENT").await,
        watch_on("SKU-KEPT").await,
    );
    notify(&db, &device, old_watch, long_ago).await;
    notify(&db, &device, recent_watch, recently).await;
    notify(&db, &device, kept_watch, today).await;
    // A device that left long ago, with its watch and subscription.
    let gone = fixtures::device(&db.pool, "UTC").await.unwrap();
    let gone_watch = fixtures::watch(&db.pool, gone.id, "SKU-GONE", &[BELOW_1200], None)
        .await
        .unwrap();
    let sub = tidings_domain::messages::Subscription {
        endpoint: "https://push.example/gone".into(),
        p256dh: "k".into(),
        auth: "a".into(),
    };
    fixtures::subscription(&db.pool, gone.id, &sub)
        .await
        .unwrap();
    notify(&db, &gone, gone_watch, long_ago).await;
    decide_all(&db).await;
    let at = |day: NaiveDate| Utc.from_utc_datetime(&day.and_hms_opt(18, 0, 0).unwrap());
    for (watch, day) in [
        (old_watch, long_ago),
        (recent_watch, recently),
        (gone_watch, long_ago),
    ] {
        sqlx::query("UPDATE watches SET removed_at = $2 WHERE id = $1")
            .bind(watch)
            .bind(at(day))
            .execute(&db.pool)
            .await
            .unwrap();
    }
    sqlx::query("UPDATE devices SET removed_at = $2 WHERE id = $1")
        .bind(gone.id)
        .bind(at(long_ago))
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE push_subscriptions SET active = false, deactivated_at = $2,
                deactivation_reason = 'device_removed' WHERE device_id = $1",
    )
    .bind(gone.id)
    .bind(at(long_ago))
    .execute(&db.pool)
    .await
    .unwrap();

    let round = retention::run_once(&db.pool, Retention::days(30).unwrap(), today)
        .await
        .unwrap();
    assert!(round.dropped.contains(&week_of(long_ago)), "{round:?}");
    assert_eq!(
        (
            round.purged.watches,
            round.purged.subscriptions,
            round.purged.devices
        ),
        (2, 1, 1),
        "{round:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM devices").await, 1);
    assert_eq!(db.count("SELECT count(*) FROM push_subscriptions").await, 1);
    let watches: Vec<String> = sqlx::query_scalar("SELECT item_code FROM watches ORDER BY 1")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(watches, ["SKU-KEPT", "SKU-RECENT"]);
    // The history still explains every retained notification, removed watch included.
    let history = tidings_store::history::of_device(&db.pool, device.id, None, None, 10)
        .await
        .unwrap();
    let items: Vec<Option<&str>> = history.iter().map(|n| n.item_code.as_deref()).collect();
    assert_eq!(items, [Some("SKU-KEPT"), Some("SKU-RECENT")], "{history:?}");
    let kept_from = tidings_store::partitions::kept_from(&db.pool)
        .await
        .unwrap()
        .unwrap();
    assert!(long_ago < kept_from && kept_from <= recently, "{kept_from}");
    // Nothing more to purge.
    let again = retention::purge_removed(&db.pool).await.unwrap();
    assert_eq!(again, retention::Purged::default());
}

/// Ingest makes the week a detection falls in when no partition holds it (a detection dated
/// far from today), and a week dropped under a running ingest is made again.
#[tokio::test]
async fn ingest_inserts_a_detection_whose_week_has_no_partition_yet() {
    use scenario::Scenario;
    let s = Scenario::new().await;
    let w = s.watcher("SKU-1", BELOW_1200, 1100).await;
    let ingest = s.ingest().await;
    let far = Utc::now() + Duration::days(300);
    for (i, threshold) in [1200, 1300].into_iter().enumerate() {
        // The same day, another dedup key: the second lands in the first one's week.
        let mut req = s.detection(&w, 1100, far);
        req.trigger = Trigger::PriceBelow { threshold };
        let week = format!("outbox_{}", week_of(req.dedup_day).format("%Y%m%d"));
        if i == 1 {
            // Dropped under the running ingest, which still thinks it is there.
            sqlx::query(&format!("DROP TABLE {week}"))
                .execute(&s.db.pool)
                .await
                .unwrap();
        }
        assert!(!s.publish_enqueue(&req, &req.dedup_key().to_string()).await);
        let started = std::time::Instant::now();
        loop {
            let got = ingest.run_once(std::time::Duration::from_millis(300)).await;
            if matches!(got, Ok(stats) if stats.inserted == 1) {
                break;
            }
            assert!(started.elapsed().as_secs() < 20, "not inserted: {got:?}");
        }
        let days: Vec<NaiveDate> =
            sqlx::query_scalar("SELECT dedup_day FROM outbox WHERE watch_id = $1 ORDER BY 1")
                .bind(w.watch)
                .fetch_all(&s.db.pool)
                .await
                .unwrap();
        // The first row left with its dropped week; the second made the week again.
        assert_eq!(days, vec![req.dedup_day], "{week}");
    }
    s.cleanup().await;
}

/// Ingest tells "no partition for this day" from other refusals by the error's code: it then
/// forgets the weeks it knew and asks for them again.
#[tokio::test]
async fn a_row_for_a_week_without_a_partition_is_told_apart_by_its_code() {
    let db = TestDb::new().await.unwrap();
    let (device, watch) = watched(&db).await;
    let at = Utc.with_ymd_and_hms(2001, 6, 1, 12, 0, 0).unwrap();
    let req = fixtures::enqueue_request(&device, watch, BELOW_1200, 1100, at);
    let e = tidings_store::enqueue::insert(&db.pool, &[(&req, None)])
        .await
        .unwrap_err();
    assert!(tidings_store::partitions::is_missing(&e), "{e}");
    // A CHECK constraint's refusal (same SQLSTATE) is another matter: a 1-byte token hash.
    let other = sqlx::query("INSERT INTO devices (id, token_hash) VALUES ($1, '\\x00')")
        .bind(uuid::Uuid::now_v7())
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(!tidings_store::partitions::is_missing(&other), "{other}");
}

/// The operators' audit trail keeps TIDINGS_AUDIT_RETENTION days, counted from the day the
/// round runs.
#[tokio::test]
async fn the_audit_trail_keeps_its_retention_and_no_more() {
    let db = TestDb::new().await.unwrap();
    let today = NaiveDate::from_ymd_opt(2026, 12, 5).unwrap();
    for (operator, at) in [
        (
            "old",
            Utc.with_ymd_and_hms(2026, 11, 20, 23, 59, 59).unwrap(),
        ),
        ("kept", Utc.with_ymd_and_hms(2026, 11, 21, 0, 0, 0).unwrap()),
    ] {
        sqlx::query(
            "INSERT INTO operator_actions (at, operator, action, target) VALUES ($1, $2, 'POST /v1/admin/x', '{}')",
        )
        .bind(at)
        .bind(operator)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let purged = retention::purge_audit(&db.pool, Retention::days(14).unwrap(), today).await;
    assert_eq!(purged, Some(1));
    let left: Vec<String> = sqlx::query_scalar("SELECT operator FROM operator_actions")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, ["kept"]);
}
