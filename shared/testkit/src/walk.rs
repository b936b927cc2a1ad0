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

/// One step of a walk: an event, and what the service that makes it records beside it.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub event: Event,
    /// The push service's (or receiver's) HTTP status, as the results loop records it.
    pub http_status: Option<u16>,
    pub last_error: Option<String>,
    /// The value the re-check read, as dispatch records it on a withheld row.
    pub checked: Option<tidings_domain::trigger::Observation>,
    /// A `Dispatched` step's lease (a minute from now unless given).
    pub lease_until: Option<chrono::DateTime<Utc>>,
}

impl From<Event> for Step {
    fn from(event: Event) -> Self {
        Step {
            event,
            http_status: None,
            last_error: None,
            checked: None,
            lease_until: None,
        }
    }
}

impl From<&Event> for Step {
    fn from(event: &Event) -> Self {
        Step::from(*event)
    }
}

impl Step {
    /// The step with the HTTP status its answer had.
    pub fn answered(mut self, status: u16) -> Self {
        self.http_status = Some(status);
        self
    }

    /// The step with the value the re-check read.
    pub fn checked(mut self, value: tidings_domain::trigger::Observation) -> Self {
        self.checked = Some(value);
        self
    }

    /// A `Dispatched` step whose lease runs out at `at` (in the past: a lease the sweeper is
    /// due to take back).
    pub fn leased_until(mut self, at: chrono::DateTime<Utc>) -> Self {
        self.lease_until = Some(at);
        self
    }

    /// The step with the error it records.
    pub fn error(mut self, error: &str) -> Self {
        self.last_error = Some(error.to_owned());
        self
    }
}

/// Walks row `id` through `steps` (events, or [`Step`]s) in turn; the last transition.
///
/// # Panics
/// When an event is not allowed in the row's state, or the row is not there.
pub async fn walk<S: Into<Step>>(
    pool: &PgPool,
    id: OutboxId,
    steps: impl IntoIterator<Item = S>,
) -> Transition {
    let mut last = None;
    for step in steps {
        last = Some(take(pool, id, step.into()).await);
    }
    last.expect("at least one step")
}

/// Walks row `id` from `pending` through push attempts that each fail with `http_status` (a
/// transient answer, e.g. 503) until its retries run out: it ends `failed`/`retries_exhausted`
/// as the results loop would leave it.
pub async fn exhaust(pool: &PgPool, id: OutboxId, http_status: u16) -> Transition {
    loop {
        take(pool, id, Event::Dispatched.into()).await;
        let failed = Step::from(Event::Transient)
            .answered(http_status)
            .error(&format!("push service answered {http_status}"));
        let t = take(pool, id, failed).await;
        if t.to.is_terminal() {
            return t;
        }
    }
}

/// One step, planned by the state machine from the row as stored and written by the store.
async fn take(pool: &PgPool, id: OutboxId, step: Step) -> Transition {
    let event = step.event;
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
    let t = outbox::apply(row, event, MAX_RETRIES).unwrap_or_else(|e| panic!("row {id}: {e}"));
    let mut change = Change::new(id, stored.dedup_day, row, t);
    if event == Event::Dispatched {
        // What the dispatcher sets when a push goes out: its lease and deadline.
        let lease = step.lease_until;
        change.lease_until =
            Some(lease.unwrap_or_else(|| Utc::now() + chrono::Duration::minutes(1)));
        change.deadline = Some(Utc::now());
    }
    change.http_status = step.http_status;
    change.last_error = step.last_error;
    change.checked = step.checked;
    let won = transition::apply(&mut tx, &[change])
        .await
        .unwrap_or_else(|e| panic!("row {id}, {event:?}: {e}"));
    assert!(
        won.contains(&id),
        "row {id}: {event:?} lost its compare-and-set"
    );
    tx.commit().await.expect("committing a step");
    t
}
