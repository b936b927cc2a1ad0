//! A row's trigger and reason read back as the enums they are; a value this build does not know
//! is an error that names the column, never read as something else. The operators' filter, built
//! at run time, binds each condition's own value.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use chrono::{TimeZone, Utc};
use std::error::Error as _;
use tidings_domain::outbox::{DropReason, Event, FailReason, Reason, Status};
use tidings_domain::trigger::Trigger;
use tidings_domain::withdrawal::Announces;
use tidings_domain::{Channel, DeviceId, OutboxId, WatchId};
use tidings_store::bulk::{self, Operation};
use tidings_store::history::{self, Filter};
use tidings_testkit::fixtures;
use tidings_testkit::harness::TestDb;
use tidings_testkit::walk::walk;

async fn device_of(db: &TestDb, id: OutboxId) -> DeviceId {
    sqlx::query_scalar("SELECT device_id FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn triggers_and_reasons_decode_as_enums_and_an_unknown_one_is_an_error() {
    let db = TestDb::new().await.unwrap();
    let trigger = Trigger::PriceDrop { percent: 10 };
    let rows = fixtures::pending_rows(&db.pool, "SKU-1", &trigger, 2)
        .await
        .unwrap();
    let (first, second) = (rows[0].0, rows[1].0);
    walk(
        &db.pool,
        first,
        [Event::Withheld(DropReason::ConditionLost)],
    )
    .await;

    let device = device_of(&db, first).await;
    let read = history::of_device(&db.pool, device, None, None, 10)
        .await
        .unwrap();
    assert_eq!(read.len(), 2);
    let dropped = read.iter().find(|n| n.id == first).unwrap();
    assert_eq!(dropped.trigger, Announces::Holds(trigger));
    assert_eq!(dropped.status, Status::Dropped);
    assert_eq!(
        dropped.reason,
        Some(Reason::Dropped(DropReason::ConditionLost))
    );

    // The filter binds the enums too.
    let filter = Filter {
        reason: Some(Reason::Dropped(DropReason::ConditionLost)),
        ..Filter::default()
    };
    let found = history::deliveries(&db.pool, &filter, None, 10)
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|d| d.notification.id).collect::<Vec<_>>(),
        [first]
    );

    // A trigger key a newer build wrote: reading it fails and says what it was. (Raw SQL on
    // purpose: no build of this code can write it. The snapshot is immutable; the guard
    // trigger is set aside for this one edit.)
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE outbox SET trigger = 'price_wobble:3' WHERE id = $1")
        .bind(second)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let err = history::of_device(&db.pool, device, None, None, 10)
        .await
        .unwrap_err();
    match &err {
        // The compile-checked statement reads columns by position: `trigger` is its fourth.
        sqlx::Error::ColumnDecode { index, source } => {
            assert_eq!(index, "3");
            assert_eq!(
                source.to_string(),
                r#"unknown trigger key "price_wobble:3""#,
                "{source}"
            );
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert!(err.source().is_some());
}

/// The operators' filter is built at run time, so no compile check pairs each condition with
/// its value. Each condition is tried with values that only it matches, and in pairs of the
/// same type (device and watch ids, from and to) whose swap would match nothing, through both
/// statements that take the filter (the list, and bulk's count below an id).
#[tokio::test]
async fn every_filter_condition_binds_its_own_value() {
    let db = TestDb::new().await.unwrap();
    let trigger = Trigger::PriceBelow { threshold: 1200 };
    // Two devices, each with a watch and a row on 2026-11-20 and on 2026-11-21.
    let a = fixtures::pending_rows(&db.pool, "SKU-A", &trigger, 2)
        .await
        .unwrap();
    let b = fixtures::pending_rows(&db.pool, "SKU-B", &trigger, 2)
        .await
        .unwrap();
    let lost = Event::Withheld(DropReason::ConditionLost);
    walk(&db.pool, a[0].0, [lost]).await;
    tidings_testkit::walk::exhaust(&db.pool, b[0].0, 503).await;
    let (device_a, watch_a) = owner_of(&db, a[0].0).await;
    let (_, watch_b) = owner_of(&db, b[0].0).await;
    let day = |d: u32| Utc.with_ymd_and_hms(2026, 11, d, 0, 0, 0).unwrap();

    let cases = [
        (
            Filter {
                status: Some(Status::Dropped),
                ..Filter::default()
            },
            vec![a[0].0],
        ),
        (
            Filter {
                reason: Some(Reason::Failed(FailReason::RetriesExhausted)),
                ..Filter::default()
            },
            vec![b[0].0],
        ),
        (
            Filter {
                device_id: Some(device_a),
                watch_id: Some(watch_a),
                ..Filter::default()
            },
            vec![a[0].0, a[1].0],
        ),
        (
            Filter {
                device_id: Some(device_a),
                watch_id: Some(watch_b),
                ..Filter::default()
            },
            vec![],
        ),
        (
            Filter {
                item: Some("SKU-B".into()),
                ..Filter::default()
            },
            vec![b[0].0, b[1].0],
        ),
        (
            Filter {
                http_status: Some(503),
                ..Filter::default()
            },
            vec![b[0].0],
        ),
        (
            Filter {
                from: Some(day(21)),
                to: Some(day(22)),
                ..Filter::default()
            },
            vec![a[1].0, b[1].0],
        ),
        (
            Filter {
                status: Some(Status::Pending),
                channel: Some(Channel::WebPush),
                device_id: Some(device_a),
                watch_id: Some(watch_a),
                item: Some("SKU-A".into()),
                from: Some(day(20)),
                to: Some(day(22)),
                ..Filter::default()
            },
            vec![a[1].0],
        ),
    ];
    let above_all = OutboxId::new();
    for (filter, expected) in cases {
        let found = history::deliveries(&db.pool, &filter, None, 10)
            .await
            .unwrap();
        let mut found: Vec<OutboxId> = found.iter().map(|d| d.notification.id).collect();
        found.sort();
        let mut expected = expected;
        expected.sort();
        assert_eq!(found, expected, "{filter:?}");
        let (matched, _) = bulk::count(&db.pool, Operation::Replay, &filter, above_all)
            .await
            .unwrap();
        assert_eq!(
            matched,
            i64::try_from(expected.len()).unwrap(),
            "{filter:?}"
        );
    }
    // And the bound binds its own value: nothing lies below the oldest row.
    let oldest = [a[0].0, a[1].0, b[0].0, b[1].0].into_iter().min().unwrap();
    let all = Filter::default();
    let (below, _) = bulk::count(&db.pool, Operation::Replay, &all, oldest)
        .await
        .unwrap();
    assert_eq!(below, 0);
}

async fn owner_of(db: &TestDb, id: OutboxId) -> (DeviceId, WatchId) {
    sqlx::query_as("SELECT device_id, watch_id FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}
