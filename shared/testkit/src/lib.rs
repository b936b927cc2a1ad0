//! Test support shared by every Tidings test, and the fakes the tests and the demo run against.
//! It depends on the library crates only, so a library's tests never compile a service.
//!
//! - [`harness`]: the one Postgres and one NATS that `deploy/local/stack test` started, a fresh
//!   migrated database per test and a unique subject prefix per test, so tests run in parallel.
//! - [`binaries`]: the service binaries and the operator CLI, built once and run by a test.
//! - [`brokers`]: nats-servers of a test's own — one (with authentication or TLS if asked) or
//!   a three-node JetStream cluster.
//! - [`fixtures`]: devices, subscriptions, watches and outbox rows to build a story on.
//! - [`fake_catalog`], [`fake_push`], [`fake_webhooks`]: the outside world, served on loopback;
//!   [`fake_smtp`]: a real SMTP server (aiosmtpd) playing the operator's relay.
//! - [`temp_file`]: a key or secret file handed to a service, removed after the run.
//! - [`world`]: a database, streams and catalog of a test's own, and the other services' parts
//!   played by hand around the one under test.

pub mod binaries;
pub mod brokers;
pub mod fake_catalog;
pub mod fake_push;
pub mod fake_smtp;
pub mod fake_webhooks;
pub mod fixtures;
pub mod harness;
pub mod temp_file;
pub mod walk;
pub mod world;
