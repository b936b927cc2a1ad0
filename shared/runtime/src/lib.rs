//! What every Tidings service runs on, whatever its work: JSON logs and OpenTelemetry traces
//! ([`telemetry`], with [`trace_context`] carrying them over NATS headers), the Prometheus
//! registry ([`metrics`]), the ops endpoint (`/livez`, `/readyz`, `/metrics`: [`ops`]), start-up
//! that waits for its dependencies ([`startup`]) and shutdown on a signal ([`signals`]).

pub mod flags;
pub mod liveness;
pub mod metrics;
pub mod ops;
pub mod sampling;
pub mod secrets;
pub mod signals;
pub mod startup;
pub mod telemetry;
mod trace_context;
