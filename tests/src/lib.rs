//! Test support shared by every Tidings test, and the fakes the tests and the demo run against.
//!
//! - [`harness`]: the one Postgres and one NATS that `deploy/local/stack test` started, a fresh
//!   migrated database per test and a unique subject prefix per test, so tests run in parallel.
//! - [`brokers`]: nats-servers of a test's own — one (with authentication or TLS if asked) or
//!   a three-node JetStream cluster.
//! - [`fixtures`]: devices, subscriptions and watches to build a story on.
//! - [`api`]: the api served in-process, and a browser-like client.

pub mod api;
pub mod brokers;
pub mod demo;
pub mod fake_catalog;
pub mod fake_push;
pub mod fixtures;
pub mod harness;
pub mod manifests;
pub mod otlp;
pub mod scenario;
pub mod services;
