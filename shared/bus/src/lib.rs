//! Tidings over NATS JetStream: reaching the servers ([`connection`]), the streams and the flags that name them ([`streams`]),
//! pipelined publishing ([`publish`]), the delivery log ([`delivered`]), dead letters ([`dlq`]),
//! the one consume loop every consumer runs ([`consume`]), what each service may do on NATS
//! ([`permissions`]), and leaving a pull consumer without
//! stranding what it pulled ([`pull`]).

pub mod connection;
pub mod consume;
pub mod delivered;
pub mod dlq;
pub mod permissions;
pub mod publish;
mod pull;
pub mod streams;

pub use streams::NatsArgs;
