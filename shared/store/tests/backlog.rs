//! The backlog reading behind the outbox gauges.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use tidings_domain::outbox::Status;
use tidings_domain::trigger::Trigger;
use tidings_testkit::fixtures;
use tidings_testkit::harness::TestDb;

#[tokio::test]
async fn the_backlog_counts_undecided_rows_and_the_oldest_waits() {
    let db = TestDb::new().await.unwrap();
    let empty = tidings_store::backlog::read(&db.pool).await.unwrap();
    assert_eq!((empty.pending, empty.retry, empty.sending), (0, 0, 0));
    assert_eq!(empty.oldest_due_seconds, 0.0);

    let trigger = Trigger::PriceBelow { threshold: 1200 };
    fixtures::pending_rows(&db.pool, "SKU-1", &trigger, 3)
        .await
        .unwrap();
    // One due for a minute, one retrying, one sending a minute past its lease.
    sqlx::query(
        "UPDATE outbox SET next_attempt_at = now() - interval '60 seconds'
         WHERE dedup_day = '2026-11-20'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox SET status = 'retry', retry_count = 1,
                next_attempt_at = now() + interval '1 hour'
         WHERE dedup_day = '2026-11-21'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE outbox SET status = 'sending', attempt = 1, deadline = now(),
                lease_until = now() - interval '60 seconds'
         WHERE dedup_day = '2026-11-22'",
    )
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
