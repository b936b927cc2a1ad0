//! The api's answers as types, shared by the api (which serves them and documents them in its
//! OpenAPI schema) and the `tidings` CLI (which reads them), so the two cannot disagree about a
//! field without a compile error. Only the wire shapes live here: no I/O, no handlers.

pub mod attempts;
pub mod audit;
pub mod clients;
pub mod dead_letters;
pub mod devices;
pub mod doctor;
pub mod endpoints;
pub mod objects;
pub mod outbox;
pub mod problem;
pub mod triggers;
