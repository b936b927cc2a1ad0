//! What the Tidings services share at their edges (I/O), around the pure domain
//! ([`tidings_domain`], re-exported here so `tidings_shared::outbox` and the like keep working):
//!
//! - the catalog client: [`source`];
//! - Web Push: [`webpush`] (RFC 8291), [`vapid`] (RFC 8292), [`endpoint`] (the push-endpoint
//!   guard);
//! - JetStream: [`streams`], [`publish`], [`pull`], [`delivered`] (the delivery log), [`dlq`];
//! - Postgres: [`db`] (the embedded migrations), [`baselines`];
//! - the service plumbing: [`service`] (flags, signals), [`startup`] (waiting for dependencies),
//!   [`telemetry`] (logs and traces, [`trace_context`] for NATS headers), [`metrics`] and [`ops`]
//!   (`/livez`, `/readyz`, `/metrics`).

pub mod baselines;
pub mod db;
pub mod delivered;
pub mod dlq;
pub mod endpoint;
pub mod metrics;
pub mod ops;
pub mod publish;
pub mod pull;
pub mod service;
pub mod source;
pub mod startup;
pub mod streams;
pub mod telemetry;
pub mod trace_context;
pub mod vapid;
pub mod webpush;

pub use tidings_domain::{
    Baseline, Channel, DeviceId, ItemCode, Observation, OutboxId, SourceErrorKind, SubscriptionId,
    Trigger, Verdict, WatchId, evaluate,
};
pub use tidings_domain::{
    backoff, channel, dedup, duration, ids, item, messages, notification, outbox, subjects, trigger,
};
