//! The outbox state machine (docs/design.md).
//!
//! ```text
//!                 ┌──────── dispatched ────────┐
//!                 │                            ▼
//!   pending ──► retry ◄── transient ──────  sending ── delivered ──► sent
//!      │          │  ▲                         │
//!      │          └──┘ transient               ├── gone ──────────► dropped (subscription_gone)
//!      ├── dispatched ───────────────────────► │
//!      │                                       └── rejected ──────► failed (reason)
//!      ├── withheld (guard, re-check) ──► dropped (reason)   [also from retry]
//!      └── transient at the retry cap ──► failed (retries_exhausted)  [from retry, sending too]
//! ```
//!
//! | from            | event                         | to                          |
//! |-----------------|-------------------------------|-----------------------------|
//! | pending / retry | `Withheld(reason)`            | dropped                     |
//! | pending / retry | `Cancelled` (an operator)     | dropped (cancelled)         |
//! | pending / retry | `Transient` (source)          | retry, or failed at the cap |
//! | pending / retry | `Dispatched` (re-check holds) | sending (attempt + 1)       |
//! | sending         | `Delivered`                   | sent (baseline advances)    |
//! | sending         | `Transient` (push, lease)     | retry, or failed at the cap |
//! | sending         | `Gone`                        | dropped (subscription_gone) |
//! | sending         | `Rejected(reason)`            | failed                      |
//! | sending         | `Outlived` (validity ran out before the push went out) | dropped (validity_expired) |
//! | sending / retry | `Recalled` (a withdrawal's original deleted undelivered) | dropped (recalled) |
//! | sending         | `Unknown` (timeout after the request went out, lease expired with no record) | retry, or failed at the cap; the row is marked *maybe delivered* |
//! | retry           | `Delivered` / `Gone` / `Rejected` (a late result of the row's last attempt) | sent / dropped / failed |
//!
//! **Late results.** A push result belongs to one attempt. It is honoured whenever it arrives as
//! long as the row has not started a newer attempt: from `sending` as usual, and from `retry`
//! when the sweeper (or a transient result) moved the row back before this result was applied.
//! A late `delivered` therefore ends the row `sent` with its baseline, and the row is never
//! pushed again; a late `transient` changes nothing (the row is already retrying). Callers check
//! the attempt; this module decides what each event does.
//!
//! **Maybe delivered.** An attempt whose outcome is unknown (the HTTP request timed out after it
//! was sent, or the lease ran out with no result and no delivery on record) may have reached the
//! user. [`Event::Unknown`] retries it like a transient failure and marks the row, so that if it
//! later ends `dropped` or `failed` its history says "may have been delivered", not "withheld".
//!
//! Terminal states (`sent`, `dropped`, `failed`) accept no event; nothing returns to `pending`.
//! The database enforces the same (from, to) pairs with a trigger (see `migrations/`), and a test
//! checks that the two lists agree.

use crate::names::names;

names! {
    /// Where an outbox row is in its life.
    pub enum Status("outbox status") {
        Pending = "pending",
        Retry = "retry",
        Sending = "sending",
        Sent = "sent",
        Dropped = "dropped",
        Failed = "failed",
    }
}

impl Status {
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Sent | Status::Dropped | Status::Failed)
    }

    /// Rows in these states are waiting for the dispatcher (once `next_attempt_at` has come).
    pub fn is_due_state(self) -> bool {
        matches!(self, Status::Pending | Status::Retry)
    }

    /// Every state a transition from `self` may lead to. The database guard lists the same pairs.
    pub fn legal_targets(self) -> &'static [Status] {
        match self {
            Status::Pending => &[
                Status::Retry,
                Status::Sending,
                Status::Dropped,
                Status::Failed,
            ],
            // `sent` from `retry`: a late `delivered` of the row's last attempt.
            Status::Retry => &[
                Status::Retry,
                Status::Sending,
                Status::Sent,
                Status::Dropped,
                Status::Failed,
            ],
            Status::Sending => &[Status::Sent, Status::Retry, Status::Dropped, Status::Failed],
            Status::Sent | Status::Dropped | Status::Failed => &[],
        }
    }

    pub fn can_move_to(self, to: Status) -> bool {
        self.legal_targets().contains(&to)
    }
}

names! {
    /// Why a notification was correctly withheld.
    pub enum DropReason("drop reason") {
        WatchRemoved = "watch_removed",
        WatchPaused = "watch_paused",
        SubscriptionInactive = "subscription_inactive",
        OutOfStock = "out_of_stock",
        ItemPaused = "item_paused",
        NotFound = "not_found",
        ConditionLost = "condition_lost",
        SubscriptionGone = "subscription_gone",
        /// An operator paused the device.
        DevicePaused = "device_paused",
        /// An operator cancelled the notification before it was sent.
        Cancelled = "cancelled",
        /// Its validity ran out before the push could go out (docs/design.md).
        ValidityExpired = "validity_expired",
        /// A withdrawal whose notification a later one of its watch and trigger had already
        /// replaced.
        Superseded = "superseded",
        /// A withdrawal not sent: the push service deleted the notification it withdraws before
        /// the device fetched it.
        Recalled = "recalled",
    }
}

names! {
    /// Why a notification could not be delivered and will not be tried again.
    pub enum FailReason("failure reason") {
        /// Transient failures until `max_retries`.
        RetriesExhausted = "retries_exhausted",
        /// The push service rejected the request as malformed (400).
        PushRejected = "push_rejected",
        /// The push service rejected our VAPID credentials (401, 403): an operator must act.
        VapidRejected = "vapid_rejected",
        /// The encrypted payload was too large for the push service (413).
        PayloadTooLarge = "payload_too_large",
        /// The endpoint failed the SSRF guard: not https, not an allowed host, or a private address.
        EndpointRefused = "endpoint_refused",
        /// A webhook endpoint refused the request (a 4xx other than 408, 410, 425 and 429).
        WebhookRejected = "webhook_rejected",
        /// The mail relay refused the mail for good (a 5xx other than to its recipient).
        MailRejected = "mail_rejected",
    }
}

/// The reason a terminal row records (`sent` records none). Sent, stored and documented as its
/// name alone: the names of the two sets never overlap (a test checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    Dropped(DropReason),
    Failed(FailReason),
}

impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Reason::parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format!("unknown drop or failure reason {name:?}"))
        })
    }
}

/// A string, one of every reason's name (what the api's document lists for a `reason`).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Reason {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("Why a row was dropped (withheld) or failed."))
            .enum_values(Some(Reason::all().map(Reason::as_str)))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Reason {}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Dropped(r) => r.as_str(),
            Reason::Failed(r) => r.as_str(),
        }
    }

    /// Every reason a row can record: the drop reasons, then the failure reasons.
    pub fn all() -> impl Iterator<Item = Reason> {
        let dropped = DropReason::ALL.into_iter().map(Reason::Dropped);
        dropped.chain(FailReason::ALL.into_iter().map(Reason::Failed))
    }
}

names! {
    /// What a row means to the person it was for: what a device's history shows.
    pub enum Delivery("delivery") {
        /// Not decided yet (pending, retry, sending).
        InProgress = "in_progress",
        /// The push service accepted it.
        Delivered = "delivered",
        /// Ended without a confirmed delivery, but an attempt's outcome was unknown (a timeout after
        /// the request went out): the notification may have arrived.
        MayHaveBeenDelivered = "may_have_been_delivered",
        /// Tidings decided not to send it (the condition no longer held, the watch was paused, …).
        Withheld = "withheld",
        /// It could not be delivered (subscription gone, rejected, retries exhausted).
        NotDelivered = "not_delivered",
    }
}

impl Delivery {
    pub fn of(status: Status, reason: Option<Reason>, maybe_delivered: bool) -> Delivery {
        match status {
            Status::Pending | Status::Retry | Status::Sending => Delivery::InProgress,
            Status::Sent => Delivery::Delivered,
            Status::Dropped | Status::Failed if maybe_delivered => Delivery::MayHaveBeenDelivered,
            Status::Dropped
                if !matches!(
                    reason,
                    Some(Reason::Dropped(
                        DropReason::SubscriptionGone | DropReason::Cancelled
                    ))
                ) =>
            {
                Delivery::Withheld
            }
            Status::Dropped | Status::Failed => Delivery::NotDelivered,
        }
    }
}

impl Reason {
    /// The reason named `s`, dropped or failed.
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::all().find(|r| r.as_str() == s)
    }
}

/// Something that happened to a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A pre-guard or the re-check decided the notification must not be sent.
    Withheld(DropReason),
    /// Re-check holds; a PushRequest is published.
    Dispatched,
    /// A failure worth retrying, known not to have reached the user: source timeout/429/5xx,
    /// push 429/5xx, a request refused after its deadline, a connection that never opened.
    Transient,
    /// A push attempt whose outcome is unknown: the request may have reached the push service
    /// (timeout after it was sent, lease expired with no result and no delivery on record).
    Unknown,
    /// The push service accepted the message.
    Delivered,
    /// The push service says the subscription no longer exists (404, 410).
    Gone,
    /// The push service (or our endpoint guard) refused the message for good.
    Rejected(FailReason),
    /// An operator cancelled it. Only a row no push is out for can be cancelled: once `sending`,
    /// the push may already have reached the user.
    Cancelled,
    /// The pusher did not send the row's push because its validity had run out.
    Outlived,
    /// The pusher did not send a withdrawal: the push service deleted, undelivered, the message
    /// it withdraws.
    Recalled,
}

/// The outcome of applying an [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub to: Status,
    pub reason: Option<Reason>,
    /// Retries used after this transition.
    pub retry_count: u32,
    /// Push attempts made after this transition (a `Dispatched` starts a new one).
    pub attempt: u32,
    /// Only `sent` moves the watch's baseline.
    pub advances_baseline: bool,
    /// The attempt may have reached the user although the row is not `sent`: the row keeps this
    /// mark for good (see *Maybe delivered* above).
    pub maybe_delivered: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("event {event:?} is not allowed in state {from}")]
pub struct IllegalTransition {
    pub from: Status,
    pub event: Event,
}

/// The counters a row carries into a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub status: Status,
    pub retry_count: u32,
    pub attempt: u32,
}

impl Transition {
    /// The row as this transition leaves it, to apply the next event to.
    pub fn row(&self) -> Row {
        Row {
            status: self.to,
            retry_count: self.retry_count,
            attempt: self.attempt,
        }
    }
}

/// A failure worth retrying: `retry` with one more retry counted, or `failed/retries_exhausted`
/// once `max_retries` have been made.
fn retry_or_fail(row: Row, max_retries: u32) -> Transition {
    let (to, reason, retry_count) = if row.retry_count >= max_retries {
        let exhausted = Reason::Failed(FailReason::RetriesExhausted);
        (Status::Failed, Some(exhausted), row.retry_count)
    } else {
        (Status::Retry, None, row.retry_count + 1)
    };
    Transition {
        to,
        reason,
        retry_count,
        attempt: row.attempt,
        advances_baseline: false,
        maybe_delivered: false,
    }
}

/// Applies `event` to `row`. `max_retries` is the number of retries allowed before a transient
/// failure becomes `failed/retries_exhausted` (0: the first transient failure is final).
pub fn apply(row: Row, event: Event, max_retries: u32) -> Result<Transition, IllegalTransition> {
    let illegal = IllegalTransition {
        from: row.status,
        event,
    };
    let stay = |to, reason| Transition {
        to,
        reason,
        retry_count: row.retry_count,
        attempt: row.attempt,
        advances_baseline: false,
        maybe_delivered: false,
    };
    let t = match (row.status, event) {
        (Status::Pending | Status::Retry, Event::Withheld(reason))
            if !matches!(
                reason,
                DropReason::SubscriptionGone
                    | DropReason::Cancelled
                    | DropReason::ValidityExpired
                    | DropReason::Recalled
            ) =>
        {
            stay(Status::Dropped, Some(Reason::Dropped(reason)))
        }
        (Status::Pending | Status::Retry, Event::Cancelled) => stay(
            Status::Dropped,
            Some(Reason::Dropped(DropReason::Cancelled)),
        ),
        (Status::Pending | Status::Retry, Event::Dispatched) => Transition {
            attempt: row.attempt + 1,
            ..stay(Status::Sending, None)
        },
        (Status::Pending | Status::Retry | Status::Sending, Event::Transient)
        | (Status::Sending, Event::Unknown) => Transition {
            maybe_delivered: event == Event::Unknown,
            ..retry_or_fail(row, max_retries)
        },
        // From `retry`: a late result of the row's last attempt (the caller checks the attempt).
        (Status::Sending | Status::Retry, Event::Delivered) => Transition {
            advances_baseline: true,
            ..stay(Status::Sent, None)
        },
        (Status::Sending | Status::Retry, Event::Gone) => stay(
            Status::Dropped,
            Some(Reason::Dropped(DropReason::SubscriptionGone)),
        ),
        (Status::Sending | Status::Retry, Event::Recalled) => {
            stay(Status::Dropped, Some(Reason::Dropped(DropReason::Recalled)))
        }
        (Status::Sending | Status::Retry, Event::Rejected(reason))
            if reason != FailReason::RetriesExhausted =>
        {
            stay(Status::Failed, Some(Reason::Failed(reason)))
        }
        // Only from `sending`: a row already retrying gets a fresh re-check and validity.
        (Status::Sending, Event::Outlived) => stay(
            Status::Dropped,
            Some(Reason::Dropped(DropReason::ValidityExpired)),
        ),
        _ => return Err(illegal),
    };
    debug_assert!(row.status.can_move_to(t.to));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(status: Status) -> Row {
        Row {
            status,
            retry_count: 0,
            attempt: 0,
        }
    }

    #[test]
    fn the_happy_path() {
        let sending = apply(row(Status::Pending), Event::Dispatched, 5).unwrap();
        let sent = apply(sending.row(), Event::Delivered, 5).unwrap();
        let (to, attempt, advances) = (sending.to, sending.attempt, sending.advances_baseline);
        assert_eq!((to, attempt, advances), (Status::Sending, 1, false));
        let (to, reason, advances) = (sent.to, sent.reason, sent.advances_baseline);
        assert_eq!((to, reason, advances), (Status::Sent, None, true));
    }

    #[test]
    fn transient_failures_retry_until_the_cap() {
        let mut r = row(Status::Pending);
        for expected in 1..=3 {
            let t = apply(r, Event::Transient, 3).unwrap();
            assert_eq!((t.to, t.retry_count), (Status::Retry, expected));
            r = t.row();
        }
        let t = apply(r, Event::Transient, 3).unwrap();
        assert_eq!(t.to, Status::Failed);
        assert_eq!(t.reason, Some(Reason::Failed(FailReason::RetriesExhausted)));
        let t = apply(row(Status::Sending), Event::Transient, 0).unwrap();
        assert_eq!(t.to, Status::Failed);
    }

    #[test]
    fn withheld_and_rejected_record_their_reason() {
        let t = apply(
            row(Status::Retry),
            Event::Withheld(DropReason::ConditionLost),
            5,
        )
        .unwrap();
        assert_eq!(t.to, Status::Dropped);
        assert_eq!(t.reason.map(Reason::as_str), Some("condition_lost"));
        let t = apply(row(Status::Sending), Event::Gone, 5).unwrap();
        assert_eq!(t.reason.map(Reason::as_str), Some("subscription_gone"));
        let t = apply(
            row(Status::Sending),
            Event::Rejected(FailReason::VapidRejected),
            5,
        )
        .unwrap();
        assert_eq!(
            (t.to, t.reason.map(Reason::as_str)),
            (Status::Failed, Some("vapid_rejected"))
        );
    }

    #[test]
    fn events_out_of_place_are_illegal() {
        for (status, event) in [
            (Status::Pending, Event::Delivered),
            (Status::Pending, Event::Gone),
            (Status::Sending, Event::Dispatched),
            (Status::Sending, Event::Withheld(DropReason::ConditionLost)),
            (
                Status::Pending,
                Event::Withheld(DropReason::SubscriptionGone),
            ),
            (
                Status::Sending,
                Event::Rejected(FailReason::RetriesExhausted),
            ),
            (Status::Pending, Event::Rejected(FailReason::PushRejected)),
            (Status::Pending, Event::Unknown),
            (Status::Retry, Event::Unknown),
            (Status::Pending, Event::Outlived),
            (Status::Retry, Event::Outlived),
            (Status::Pending, Event::Recalled),
            (Status::Pending, Event::Withheld(DropReason::Recalled)),
            (
                Status::Pending,
                Event::Withheld(DropReason::ValidityExpired),
            ),
        ] {
            assert_eq!(
                apply(row(status), event, 5),
                Err(IllegalTransition {
                    from: status,
                    event
                })
            );
        }
    }

    #[test]
    fn only_a_row_with_no_push_out_can_be_cancelled() {
        for status in Status::ALL {
            let t = apply(row(status), Event::Cancelled, 5);
            if status.is_due_state() {
                let t = t.unwrap();
                assert_eq!(
                    (t.to, t.reason.map(Reason::as_str)),
                    (Status::Dropped, Some("cancelled"))
                );
            } else {
                assert!(t.is_err(), "{status}");
            }
        }
        // No service can withhold a row as `cancelled`: that is the operator's word.
        assert!(
            apply(
                row(Status::Pending),
                Event::Withheld(DropReason::Cancelled),
                5
            )
            .is_err()
        );
        let cancelled = Some(Reason::Dropped(DropReason::Cancelled));
        assert_eq!(
            Delivery::of(Status::Dropped, cancelled, false),
            Delivery::NotDelivered
        );
        let paused = Some(Reason::Dropped(DropReason::DevicePaused));
        assert_eq!(
            Delivery::of(Status::Dropped, paused, false),
            Delivery::Withheld
        );
    }

    #[test]
    fn a_withdrawal_whose_original_was_deleted_undelivered_is_not_sent() {
        for from in [Status::Sending, Status::Retry] {
            let t = apply(row(from), Event::Recalled, 5).unwrap();
            assert_eq!(t.to, Status::Dropped);
            assert_eq!(t.reason, Some(Reason::Dropped(DropReason::Recalled)));
            assert!(!t.advances_baseline && !t.maybe_delivered);
        }
    }

    #[test]
    fn a_push_that_outlived_its_validity_is_withheld() {
        let t = apply(row(Status::Sending), Event::Outlived, 5).unwrap();
        assert_eq!(t.to, Status::Dropped);
        assert_eq!(t.reason, Some(Reason::Dropped(DropReason::ValidityExpired)));
        assert!(!t.advances_baseline && !t.maybe_delivered);
        assert_eq!(
            Delivery::of(t.to, t.reason, t.maybe_delivered),
            Delivery::Withheld
        );
    }

    #[test]
    fn a_late_result_of_the_last_attempt_ends_a_retrying_row() {
        // The sweeper gave up waiting for attempt 1 (outcome unknown), then its result arrived.
        let t = apply(row(Status::Sending), Event::Unknown, 5).unwrap();
        assert_eq!(
            (t.to, t.retry_count, t.maybe_delivered),
            (Status::Retry, 1, true)
        );
        let retrying = Row {
            attempt: 1,
            ..t.row()
        };
        let t = apply(retrying, Event::Delivered, 5).unwrap();
        assert_eq!(
            (t.to, t.advances_baseline, t.attempt),
            (Status::Sent, true, 1)
        );
        let t = apply(retrying, Event::Gone, 5).unwrap();
        assert_eq!(t.reason.map(Reason::as_str), Some("subscription_gone"));
        let t = apply(retrying, Event::Rejected(FailReason::PayloadTooLarge), 5).unwrap();
        assert_eq!(t.to, Status::Failed);
    }

    #[test]
    fn only_an_unknown_outcome_marks_a_row_maybe_delivered() {
        let t = apply(row(Status::Sending), Event::Transient, 5).unwrap();
        assert!(!t.maybe_delivered);
        let t = apply(row(Status::Sending), Event::Unknown, 0).unwrap();
        assert_eq!(
            (t.to, t.maybe_delivered),
            (Status::Failed, true),
            "at the cap it fails, still marked"
        );
    }

    #[test]
    fn history_tells_withheld_from_maybe_delivered() {
        let lost = Some(Reason::Dropped(DropReason::ConditionLost));
        assert_eq!(
            Delivery::of(Status::Dropped, lost, false),
            Delivery::Withheld
        );
        assert_eq!(
            Delivery::of(Status::Dropped, lost, true),
            Delivery::MayHaveBeenDelivered
        );
        let gone = Some(Reason::Dropped(DropReason::SubscriptionGone));
        assert_eq!(
            Delivery::of(Status::Dropped, gone, false),
            Delivery::NotDelivered
        );
        let exhausted = Some(Reason::Failed(FailReason::RetriesExhausted));
        assert_eq!(
            Delivery::of(Status::Failed, exhausted, true),
            Delivery::MayHaveBeenDelivered
        );
        assert_eq!(Delivery::of(Status::Sent, None, true), Delivery::Delivered);
        assert_eq!(
            Delivery::of(Status::Retry, None, true),
            Delivery::InProgress
        );
        for r in DropReason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(Reason::Dropped(r)));
        }
        for r in FailReason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(Reason::Failed(r)));
        }
        assert_eq!(Reason::parse("bogus"), None);
        for r in Reason::all() {
            let sent = serde_json::to_string(&r).unwrap();
            assert_eq!(sent, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<Reason>(&sent).unwrap(), r);
        }
        assert!(serde_json::from_str::<Reason>("\"bogus\"").is_err());
        let names: std::collections::HashSet<&str> = Reason::all().map(Reason::as_str).collect();
        assert_eq!(names.len(), Reason::all().count(), "a name in both sets");
        assert_eq!(Reason::parse("condition_lost\0"), None);
        assert_eq!(
            Reason::all().count(),
            DropReason::ALL.len() + FailReason::ALL.len()
        );
    }

    #[test]
    fn names_round_trip() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>(), Ok(s));
        }
        assert!("bogus".parse::<Status>().is_err());
    }

    fn any_event() -> impl Strategy<Value = Event> {
        prop_oneof![
            proptest::sample::select(DropReason::ALL.to_vec()).prop_map(Event::Withheld),
            Just(Event::Dispatched),
            Just(Event::Transient),
            Just(Event::Unknown),
            Just(Event::Delivered),
            Just(Event::Gone),
            proptest::sample::select(FailReason::ALL.to_vec()).prop_map(Event::Rejected),
            Just(Event::Cancelled),
            Just(Event::Outlived),
            Just(Event::Recalled),
        ]
    }

    /// Progress order: nothing moves to a lower rank. retry and sending share a rank because a
    /// row goes back and forth between them until it ends.
    fn rank(s: Status) -> u8 {
        match s {
            Status::Pending => 0,
            Status::Retry | Status::Sending => 1,
            Status::Sent | Status::Dropped | Status::Failed => 2,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn any_sequence_of_events_respects_the_machine(
            events in proptest::collection::vec(any_event(), 1..40),
            max_retries in 0u32..6,
        ) {
            let mut r = row(Status::Pending);
            let mut sent_once = false;
            for event in events {
                match apply(r, event, max_retries) {
                    Err(e) => {
                        // Illegal events change nothing; terminal rows take no event at all.
                        prop_assert_eq!(e.from, r.status);
                    }
                    Ok(t) => {
                        prop_assert!(!r.status.is_terminal(), "left terminal state {}", r.status);
                        prop_assert!(r.status.can_move_to(t.to), "{} -> {}", r.status, t.to);
                        prop_assert_ne!(t.to, Status::Pending);
                        prop_assert!(rank(t.to) >= rank(r.status), "went backwards: {} -> {}", r.status, t.to);
                        prop_assert!(t.retry_count >= r.retry_count && t.retry_count <= max_retries);
                        prop_assert!(t.attempt >= r.attempt);
                        prop_assert_eq!(t.advances_baseline, t.to == Status::Sent);
                        prop_assert_eq!(t.reason.is_some(), matches!(t.to, Status::Dropped | Status::Failed));
                        prop_assert_eq!(t.maybe_delivered, event == Event::Unknown);
                        // Only an operator's cancel records `cancelled`, and only before a push.
                        prop_assert_eq!(
                            t.reason == Some(Reason::Dropped(DropReason::Cancelled)),
                            event == Event::Cancelled
                        );
                        if event == Event::Cancelled {
                            prop_assert!(r.status.is_due_state());
                        }
                        // Only a push the pusher held back records `validity_expired`.
                        prop_assert_eq!(
                            t.reason == Some(Reason::Dropped(DropReason::ValidityExpired)),
                            event == Event::Outlived
                        );
                        if event == Event::Outlived {
                            prop_assert_eq!(r.status, Status::Sending);
                        }
                        // Only the push service's deletion of a withdrawn message records
                        // `recalled`, once a push is out.
                        prop_assert_eq!(
                            t.reason == Some(Reason::Dropped(DropReason::Recalled)),
                            event == Event::Recalled
                        );
                        if event == Event::Recalled {
                            prop_assert!(!r.status.is_due_state() || r.status == Status::Retry);
                        }
                        if t.advances_baseline {
                            prop_assert!(!sent_once, "baseline advanced twice");
                            sent_once = true;
                        }
                        r = t.row();
                    }
                }
            }
        }

        #[test]
        fn terminal_states_accept_no_event(
            status in proptest::sample::select(vec![Status::Sent, Status::Dropped, Status::Failed]),
            event in any_event(),
            retry_count in 0u32..10,
            max_retries in 0u32..10,
        ) {
            let r = Row { status, retry_count, attempt: 1 };
            prop_assert!(apply(r, event, max_retries).is_err());
        }
    }
}
