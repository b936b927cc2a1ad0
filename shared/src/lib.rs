//! The Tidings domain, shared by every service.
//!
//! The domain modules are pure (no I/O). The rules that decide whether a notification is sent
//! live here once, so that detection and the dispatcher's re-check can never disagree:
//!
//! - [`trigger::evaluate`]: does a trigger hold for an observation against a baseline?
//! - [`outbox`]: the outbox state machine (docs/design.md), mirrored by a database guard.
//! - [`backoff`]: when a retry is due.
//! - [`dedup`]: the dedup key and the calendar day it is scoped to.
//! - [`messages`] and [`subjects`]: the wire contract between services.
//!
//! What the services share at their edges (I/O) lives here too: [`source`] (the catalog client),
//! [`webpush`] and [`vapid`], [`endpoint`] (the push-endpoint guard), [`streams`], [`publish`],
//! [`pull`], [`delivered`] and [`dlq`] (JetStream), [`db`] (the embedded migrations), and the service plumbing: [`service`]
//! (flags, signals), [`startup`] (waiting for dependencies), [`telemetry`] (logs and traces, [`trace_context`] for NATS headers),
//! [`metrics`] and [`ops`] (`/livez`, `/readyz`, `/metrics`).

pub mod backoff;
pub mod channel;
pub mod db;
pub mod dedup;
pub mod delivered;
pub mod dlq;
pub mod duration;
pub mod endpoint;
pub mod ids;
pub mod item;
pub mod messages;
pub mod metrics;
pub mod notification;
pub mod ops;
pub mod outbox;
pub mod publish;
pub mod pull;
pub mod service;
pub mod source;
pub mod startup;
pub mod streams;
pub mod subjects;
pub mod telemetry;
pub mod trace_context;
pub mod trigger;
pub mod vapid;
pub mod webpush;

pub use channel::Channel;
pub use ids::{DeviceId, OutboxId, SubscriptionId, WatchId};
pub use item::ItemCode;
pub use trigger::{Baseline, Observation, SourceErrorKind, Trigger, Verdict, evaluate};
