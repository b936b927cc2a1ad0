//! Web Push: RFC 8291 message encryption ([`webpush`]), RFC 8292 VAPID ([`vapid`]), and the
//! guard that decides which push endpoints may be used ([`endpoint`]; the api applies it when a
//! subscription is registered, the pusher before every request).

pub mod endpoint;
pub mod vapid;
pub mod webpush;

pub use endpoint::EndpointArgs;
