//! Tidings over NATS JetStream: reaching the servers ([`connection`]), the streams and the flags that name them ([`streams`]),
//! pipelined publishing ([`publish`]), the delivery log ([`delivered`]), dead letters ([`dlq`];
//! an operator works them with [`dead_letters`]),
//! the one consume loop every consumer runs ([`consume`]), what each service may do on NATS
//! ([`permissions`]), the pushers' roll call ([`roll_call`]), and leaving a pull consumer without
//! stranding what it pulled ([`pull`]).

pub mod connection;
pub mod consume;
pub mod dead_letters;
pub mod delivered;
pub mod dlq;
pub mod metrics;
pub mod permissions;
pub mod publish;
mod pull;
pub mod redrive;
pub mod respond;
pub mod roll_call;
pub mod streams;

pub use streams::NatsArgs;

/// What a NATS operation failed with, kept whole behind one type (each async-nats call has its
/// own error type): the chain a log prints, and a kind a caller can reach by downcasting.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;
