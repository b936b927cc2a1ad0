//! Test support that needs the services, the cross-service tests' world, and the demo. What
//! needs no service is in `tidings-testkit` (re-exported here). What needs one service lives
//! beside that service's tests, so they build without the others, and is included here by path:
//!
//! - [`api`]: the api served in-process, and a browser-like client (api/tests/support).
//! - [`pushers`]: a pusher driven by hand against the fake push service (pusher/tests/support).
//! - [`scenario`]: the dispatcher's loops in-process over a test world (dispatcher/tests/support).
//! - [`services`]: the real binaries, started by a test.
//! - [`demo`]: the README's demo, also run by `tidings-demo`.
//! - [`mail`]: mails as Python's `email` and `dkimpy` read them.

pub use tidings_testkit::{
    binaries, brokers, fake_catalog, fake_push, fake_smtp, fake_webhooks, fixtures, harness,
    temp_file, walk, world,
};

#[path = "../../api/tests/support/server.rs"]
pub mod api;
pub mod demo;
pub mod mail;
pub mod manifests;
pub mod network_policy;
pub mod otlp;
#[path = "../../pusher/tests/support/pushers.rs"]
pub mod pushers;
#[path = "../../dispatcher/tests/support/scenario.rs"]
pub mod scenario;
pub mod services;
