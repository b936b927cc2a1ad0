//! The Tidings domain: what a notification is and the rules it goes by, with no I/O at all (no
//! database, broker or HTTP dependency), so that every rule is a plain function its tests call.
//!
//! The rules that decide whether a notification is sent live here once, so that detection and
//! the dispatcher's re-check can never disagree:
//!
//! - [`trigger::evaluate`]: does a trigger hold for an observation against a baseline?
//! - [`outbox`]: the outbox state machine (docs/design.md), mirrored by a database guard.
//! - [`backoff`]: when a retry is due.
//! - [`dedup`]: the dedup key and the calendar day it is scoped to.
//! - [`messages`] and [`subjects`]: the wire contract between services; [`push`]: what a push
//!   service's answer means, as a reported outcome and as an outbox event.
//! - [`notification`]: the notification a user receives, from the value re-checked at send time,
//!   in their language ([`texts`]) with amounts in the currency's minor units ([`money`]).
//! - [`validity`]: how long a notification stays current, its push TTL, topic and tag;
//!   [`withdrawal`]: when a sent one stopped holding and is followed by a correction.
//! - [`webhook`]: what a webhook's body says; [`receiver`]: how its receiver is judged (a
//!   breaker) and paced.
//! - [`holding`]: when a notification that holds may go, by quiet hours, a cap and a digest.
//! - [`ids`], [`channel`], [`item`], [`duration`]: the values everything else is built from.
//!
//! The `sqlx` feature lets the ids be bound as Postgres values by the crates that talk to the
//! database; nothing here uses it.

pub mod backoff;
mod channel;
pub mod dedup;
pub mod digest;
pub mod duration;
pub mod hints;
pub mod holding;
mod ids;
pub mod item;
pub mod mail;
pub mod messages;
pub mod money;
pub mod names;
pub mod notification;
pub mod outbox;
pub mod preferences;
pub mod push;
pub mod receiver;
pub mod retention;
pub mod shown;
#[cfg(feature = "sqlx")]
pub mod sql;
pub mod strict;
pub mod subjects;
pub mod subscription;
pub mod texts;
pub mod trigger;
pub mod validity;
pub mod webhook;
pub mod withdrawal;

pub use channel::Channel;
pub use ids::{DeviceId, OutboxId, SubscriptionId, WatchId};
pub use item::ItemCode;
pub use trigger::{Baseline, Observation, SourceErrorKind, Trigger, Verdict, evaluate};
