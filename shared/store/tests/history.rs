//! A row's trigger and reason read back as the enums they are; a value this build does not know
//! is an error that names the column, never read as something else.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::error::Error as _;
use tidings_domain::outbox::{DropReason, Event, Reason, Status};
use tidings_domain::trigger::Trigger;
use tidings_domain::withdrawal::Announces;
use tidings_domain::{DeviceId, OutboxId};
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
