//! An operator's cancel goes through the transition path: the claim lease is cleared, the change
//! is counted, and only due rows are cancelled.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use tidings_domain::OutboxId;
use tidings_domain::outbox::Event;
use tidings_domain::trigger::Trigger;
use tidings_testkit::fixtures;
use tidings_testkit::harness::TestDb;
use tidings_testkit::walk::walk;

/// Pending rows of one watch, one per day.
async fn rows(db: &TestDb, n: u32) -> Vec<(OutboxId, chrono::NaiveDate)> {
    let trigger = Trigger::PriceBelow { threshold: 1200 };
    fixtures::pending_rows(&db.pool, "SKU-1", &trigger, n)
        .await
        .unwrap()
}

/// (status, reason, claim cleared, finished, last error) of a row.
type State = (String, Option<String>, bool, bool, Option<String>);

fn cancelled_count() -> f64 {
    let text = tidings_runtime::metrics::metrics().encode();
    text.lines()
        .find(|l| {
            l.starts_with("tidings_outbox_transitions_total")
                && l.contains("to=\"dropped\"")
                && l.contains("reason=\"cancelled\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_cancel_clears_the_claim_counts_itself_and_leaves_rows_with_a_push_out() {
    let db = TestDb::new().await.unwrap();
    let rows = rows(&db, 3).await;
    // Row 0: claimed by a dispatcher that has not moved it yet. Row 1: its push is out.
    // Row 2: plain pending.
    let claimed = tidings_store::claim::claim(&db.pool, 1, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        claimed[0].id, rows[0].0,
        "the oldest due row is claimed first"
    );
    walk(&db.pool, rows[1].0, [Event::Dispatched]).await;
    let before = cancelled_count();

    let mut tx = db.pool.begin().await.unwrap();
    let done = tidings_store::cancel::cancel(&mut tx, &rows).await.unwrap();
    tx.commit().await.unwrap();
    done.observe();

    assert_eq!(done.count(), 2);
    assert!(done.won.contains(&rows[0].0) && done.won.contains(&rows[2].0));
    assert_eq!(cancelled_count() - before, 2.0, "both cancels counted");
    let states: Vec<State> = sqlx::query_as(
        "SELECT status::text, reason::text, claimed_until IS NULL, finished_at IS NOT NULL,
                last_error
         FROM outbox WHERE id = ANY($1) ORDER BY dedup_day",
    )
    .bind(rows.iter().map(|r| r.0).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let cancelled: State = (
        "dropped".to_owned(),
        Some("cancelled".to_owned()),
        true,
        true,
        Some("cancelled by an operator".to_owned()),
    );
    assert_eq!(states[0], cancelled, "the claim lease is cleared");
    assert_eq!(states[1].0, "sending", "a row with its push out stays");
    assert_eq!(states[2], cancelled);

    // Cancelling again changes nothing: every row has left the due states.
    let mut tx = db.pool.begin().await.unwrap();
    let again = tidings_store::cancel::cancel(&mut tx, &rows).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again.count(), 0);
}
