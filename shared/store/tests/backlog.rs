//! The backlog reading behind the outbox gauges.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use tidings_domain::outbox::{Event, Status};
use tidings_domain::trigger::Trigger;
use tidings_testkit::fixtures;
use tidings_testkit::harness::TestDb;
use tidings_testkit::walk::{Step, walk};

#[tokio::test]
async fn the_backlog_counts_undecided_rows_and_the_oldest_waits() {
    let db = TestDb::new().await.unwrap();
    let empty = tidings_store::backlog::read(&db.pool).await.unwrap();
    assert_eq!((empty.pending, empty.retry, empty.sending), (0, 0, 0));
    assert_eq!(empty.oldest_due_seconds, 0.0);

    let trigger = Trigger::PriceBelow { threshold: 1200 };
    let rows = fixtures::pending_rows(&db.pool, "SKU-1", &trigger, 3)
        .await
        .unwrap();
    // One due for a minute, one retrying, one sending a minute past its lease: the states as
    // the services make them, then the clocks moved (raw SQL on purpose, times only: a test
    // cannot wait a minute).
    walk(&db.pool, rows[1].0, [Event::Dispatched, Event::Transient]).await;
    let a_minute_ago = chrono::Utc::now() - chrono::Duration::seconds(60);
    let expired = Step::from(Event::Dispatched).leased_until(a_minute_ago);
    walk(&db.pool, rows[2].0, [expired]).await;
    sqlx::query(
        "UPDATE outbox SET
           next_attempt_at = CASE dedup_day WHEN $1 THEN now() - interval '60 seconds'
                                            ELSE now() + interval '1 hour' END
         WHERE dedup_day IN ($1, $2)",
    )
    .bind(rows[0].1)
    .bind(rows[1].1)
    .execute(&db.pool)
    .await
    .unwrap();

    let b = tidings_store::backlog::read(&db.pool).await.unwrap();
    assert_eq!(
        [
            Status::Pending,
            Status::Retry,
            Status::Sending,
            Status::Sent
        ]
        .map(|s| b.rows(s)),
        [1, 1, 1, 0]
    );
    assert!((59.0..120.0).contains(&b.oldest_due_seconds), "{b:?}");
    assert!((59.0..120.0).contains(&b.lease_overdue_seconds), "{b:?}");
}
