//! The backlog reading behind the outbox gauges.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use tidings_domain::holding::Held;
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

#[tokio::test]
async fn held_rows_are_counted_by_why_they_wait() {
    let db = TestDb::new().await.unwrap();
    let trigger = Trigger::PriceBelow { threshold: 1200 };
    let rows = fixtures::pending_rows(&db.pool, "SKU-1", &trigger, 5)
        .await
        .unwrap();
    // Two held for quiet hours and one for a digest, an hour ahead, as holding leaves them (raw
    // SQL on purpose: the columns only, without a reader's preferences to hold them).
    let held = [(0, "quiet_hours"), (1, "quiet_hours"), (2, "digest")];
    for (i, why) in held {
        sqlx::query(
            "UPDATE outbox SET held = $2, next_attempt_at = now() + interval '1 hour'
             WHERE dedup_day = $1",
        )
        .bind(rows[i].1)
        .bind(why)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    let b = tidings_store::backlog::read(&db.pool).await.unwrap();
    assert_eq!(b.pending, 5, "{b:?}");
    let counted = Held::ALL.map(|h| b.held.iter().find(|(w, _)| *w == h).map(|(_, n)| *n));
    let expected = Held::ALL.map(|h| match h {
        Held::QuietHours => Some(2),
        Held::Digest => Some(1),
        Held::Cap => Some(0),
    });
    assert_eq!(counted, expected);
    // Only the two rows not held are due; the oldest of them has waited since its insert.
    assert!((0.0..60.0).contains(&b.oldest_due_seconds), "{b:?}");
}
