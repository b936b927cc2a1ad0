//! A device's push subscription or webhook endpoint, once it stops receiving.

use crate::names::names;

names! {
    /// Why a subscription stopped receiving (`push_subscriptions.deactivation_reason`).
    pub enum Deactivation("subscription deactivation") {
        /// The push service or receiver said it no longer exists (404, 410).
        Gone = "gone",
        /// Its device registered another subscription in its place.
        Replaced = "replaced",
        /// Its device was removed.
        DeviceRemoved = "device_removed",
        /// The API client that registered the endpoint was revoked.
        ClientRevoked = "client_revoked",
        /// The mail relay refused the address (a 5xx to RCPT), or reported a bounce.
        MailboxRejected = "mailbox_rejected",
        /// The address's owner unsubscribed (the link or the one-click header in each mail).
        Unsubscribed = "unsubscribed",
    }
}
