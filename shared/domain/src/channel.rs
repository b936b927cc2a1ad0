//! Delivery channels. A channel names a JetStream subject suffix and a pusher.

use crate::names::names;

names! {
    /// Where a notification is delivered: a browser by Web Push, an API client's URL by a
    /// signed webhook, or a confirmed address by email. Each has its own subjects and pusher
    /// consumer; the dedup key and the outbox's unique key hold it.
    pub enum Channel("channel") {
        WebPush = "web_push",
        Webhook = "webhook",
        Email = "email",
    }
}
