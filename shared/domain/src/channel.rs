//! Delivery channels. A channel names a JetStream subject suffix and a pusher.

use crate::names::names;

names! {
    /// Where a notification is delivered. Only Web Push exists today; the enum keeps subjects,
    /// dedup keys and the outbox unique key ready for more.
    pub enum Channel("channel") {
        WebPush = "web_push",
    }
}
