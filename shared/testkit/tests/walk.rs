//! The test walker moves rows only along the state machine's edges, through the store.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use chrono::{TimeZone, Utc};
use tidings_domain::OutboxId;
use tidings_domain::outbox::{DropReason, Event, Status};
use tidings_domain::trigger::Trigger;
use tidings_testkit::fixtures::{self, Inserted};
use tidings_testkit::harness::TestDb;
use tidings_testkit::walk::walk;

async fn pending_row(db: &TestDb) -> OutboxId {
    let device = fixtures::device(&db.pool, "UTC").await.unwrap();
    let below = Trigger::PriceBelow { threshold: 1200 };
    let watch = fixtures::watch(
        &db.pool,
        device.id,
        "SKU-1",
        std::slice::from_ref(&below),
        Some(1500),
    )
    .await
    .unwrap();
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    let req = fixtures::enqueue_request(&device, watch, below, 1100, at);
    let Inserted::New(id) = fixtures::insert_outbox(&db.pool, &req).await.unwrap() else {
        panic!("expected a new row");
    };
    id
}

#[tokio::test]
async fn a_walk_takes_a_row_where_the_services_would() {
    let db = TestDb::new().await.unwrap();
    let id = pending_row(&db).await;
    let t = walk(
        &db.pool,
        id,
        &[Event::Dispatched, Event::Transient, Event::Dispatched],
    )
    .await;
    assert_eq!((t.to, t.attempt, t.retry_count), (Status::Sending, 2, 1));
    let t = walk(&db.pool, id, &[Event::Delivered]).await;
    assert_eq!(t.to, Status::Sent);
    let stored: (Status, Option<chrono::DateTime<Utc>>) =
        sqlx::query_as("SELECT status, finished_at FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(stored.0, Status::Sent);
    assert!(stored.1.is_some(), "a terminal row says when it ended");
}

#[tokio::test]
#[should_panic(expected = "is not allowed in state pending")]
async fn a_step_the_state_machine_refuses_fails_the_test() {
    let db = TestDb::new().await.unwrap();
    let id = pending_row(&db).await;
    // A pending row was never pushed: it cannot be delivered.
    walk(&db.pool, id, &[Event::Delivered]).await;
}

#[tokio::test]
#[should_panic(expected = "is not allowed in state dropped")]
async fn a_terminal_row_stays_as_it_ended() {
    let db = TestDb::new().await.unwrap();
    let id = pending_row(&db).await;
    walk(
        &db.pool,
        id,
        &[
            Event::Withheld(DropReason::ConditionLost),
            Event::Dispatched,
        ],
    )
    .await;
}
