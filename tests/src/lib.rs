//! Test support that needs the services, the cross-service tests' world, and the demo. What
//! needs no service is in `tidings-testkit`, re-exported here so a service's tests use one crate.
//!
//! - [`api`]: the api served in-process, and a browser-like client.
//! - [`pushers`]: a pusher driven by hand against the fake push service.
//! - [`scenario`]: a story-test world (NATS streams, the dispatcher's loops in-process).
//! - [`services`]: the real binaries, started by a test.
//! - [`demo`]: the README's demo, also run by `tidings-demo`.

pub use tidings_testkit::{
    brokers, fake_catalog, fake_push, fake_webhooks, fixtures, harness, walk,
};

pub mod api;
pub mod demo;
pub mod manifests;
pub mod network_policy;
pub mod otlp;
#[path = "../../pusher/tests/support/pushers.rs"]
pub mod pushers;
pub mod scenario;
pub mod services;
