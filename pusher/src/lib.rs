//! The Tidings pusher: PushRequests from JetStream → encrypted (RFC 8291), VAPID-signed
//! (RFC 8292) HTTPS POSTs to push services → PushResults back to the dispatcher. It has no
//! database: a PushRequest carries everything needed to deliver it.
//!
//! - [`worker`]: the consume loop, result publishing, redelivery safety.
//! - [`deliver`]: one delivery: deadline, endpoint guard, encryption, VAPID, HTTP.
//! - [`classify`]: what a push service's answer means.
//! - [`config`]: configuration and validated settings.
//!
//! Encryption, VAPID and the endpoint guard live in the shared crate, where the api uses them
//! too.

pub mod classify;
pub mod config;
pub mod deliver;
pub mod worker;

pub use config::{Config, Settings};
