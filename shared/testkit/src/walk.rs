//! Outbox rows moved in tests as the services move them: each step is an [`Event`] the domain's
//! state machine plans from the row as stored (an illegal step fails the test), written by the
//! store's own compare-and-set. A test that walks a row cannot leave it in a state the services
//! could not, and a renamed reason or a new column changes nothing here.

use chrono::Utc;
use sqlx::PgPool;
use tidings_domain::OutboxId;
use tidings_domain::outbox::{self, Event, Row, Transition};
use tidings_store::transition::{self, Change};

/// Retries the walked rows may make before a transient failure is final (the dispatcher's
/// default).
pub const MAX_RETRIES: u32 = 5;

/// Walks row `id` through `events` in turn; the last transition.
///
/// # Panics
/// When an event is not allowed in the row's state, or the row is not there.
pub async fn walk(pool: &PgPool, id: OutboxId, events: &[Event]) -> Transition {
    let mut last = None;
    for event in events {
        let mut tx = pool.begin().await.expect("a transaction");
        let rows = tidings_store::rows::lock(&mut tx, &[id], None)
            .await
            .expect("reading the row");
        let stored = rows.first().unwrap_or_else(|| panic!("no outbox row {id}"));
        let row = Row {
            status: stored.status,
            retry_count: stored.retry_count,
            attempt: stored.attempt,
        };
        let t = outbox::apply(row, *event, MAX_RETRIES).unwrap_or_else(|e| panic!("row {id}: {e}"));
        let mut change = Change::new(id, stored.dedup_day, row, t);
        if *event == Event::Dispatched {
            // What the dispatcher sets when a push goes out: its lease and deadline.
            change.lease_until = Some(Utc::now() + chrono::Duration::minutes(1));
            change.deadline = Some(Utc::now());
        }
        let won = transition::apply(&mut tx, &[change])
            .await
            .unwrap_or_else(|e| panic!("row {id}, {event:?}: {e}"));
        assert!(
            won.contains(&id),
            "row {id}: {event:?} lost its compare-and-set"
        );
        tx.commit().await.expect("committing a step");
        last = Some(t);
    }
    last.expect("at least one step")
}
