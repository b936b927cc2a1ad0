//! Web Push: RFC 8291 message encryption ([`webpush`]), RFC 8292 VAPID ([`vapid`]), and the
//! guard that decides which push endpoints may be used ([`endpoint`]; the api applies it when a
//! subscription is registered, the pusher before every request). And Standard Webhooks
//! signatures ([`standard_webhooks`]), which the api verifies on change hints and the dispatcher
//! signs webhooks with, and their secrets sealed for storage ([`sealed`]).

pub mod endpoint;
pub mod sealed;
pub mod standard_webhooks;
pub mod vapid;
pub mod webpush;

pub use endpoint::EndpointArgs;
