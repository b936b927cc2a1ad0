//! Web Push: RFC 8291 message encryption ([`encryption`]) and RFC 8292 VAPID ([`vapid`]).
//!
//! What every channel shares lives beside it: the guard on outbound endpoints in
//! `tidings-endpoint-guard`, Standard Webhooks signatures in `tidings-signatures`, webhook
//! secrets sealed at rest in `tidings-sealing`.

pub mod encryption;
pub mod vapid;
