//! Pipelined JetStream publishing: many acks in flight, never one round-trip per message.
//!
//! Each message's future publishes *and* awaits its own ack, and at most `window` run at once.
//! Publishing everything first and awaiting the acks afterwards would deadlock: the client caps
//! the acks in flight and waits for a free slot before publishing, a slot only an awaited ack
//! frees.

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishError, publish::PublishAck};
use futures::StreamExt;

/// One message to publish.
pub struct Outgoing {
    pub subject: String,
    pub headers: HeaderMap,
    pub payload: Vec<u8>,
}

impl Outgoing {
    /// A message JetStream stores once per `msg_id` (its `Nats-Msg-Id`) within the stream's
    /// duplicate window.
    pub fn deduplicated(subject: impl Into<String>, msg_id: &str, payload: Vec<u8>) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id);
        Outgoing {
            subject: subject.into(),
            headers,
            payload,
        }
    }
}

/// Publishes `messages` with up to `window` in flight; answers in the same order.
pub async fn publish_all(
    js: &jetstream::Context,
    messages: Vec<Outgoing>,
    window: usize,
) -> Vec<Result<PublishAck, PublishError>> {
    futures::stream::iter(messages)
        .map(|m| async move {
            js.publish_with_headers(m.subject, m.headers, m.payload.into())
                .await?
                .await
        })
        .buffered(window.max(1))
        .collect()
        .await
}
