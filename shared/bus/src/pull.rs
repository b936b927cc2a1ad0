//! Leaving a JetStream pull consumer cleanly.
//!
//! A pull subscription asks the server for messages ahead of need, so a consumer that stops
//! holds messages it never started. Left alone they wait out the consumer's ack wait before
//! JetStream hands them to another replica: in a rolling deploy that is the ack wait added to
//! every such notification, and for a PushRequest possibly its deadline passing. A stopping
//! consumer therefore hands them back at once with a NAK (redeliver now, elsewhere).

use async_nats::jetstream::{self, AckKind};
use futures::{Stream, StreamExt};
use std::time::Duration;

/// How long the subscription must stay quiet before everything pulled is taken to be handed
/// back: the server sends what a pull request asked for in one burst.
pub const HAND_BACK_QUIET: Duration = Duration::from_millis(100);

/// NAKs every message `messages` still yields, until it is quiet for [`HAND_BACK_QUIET`] or `cap`
/// messages were handed back (the subscription keeps asking for more while it lives, so a busy
/// stream would otherwise feed it forever). Returns how many were handed back. Drop the
/// subscription afterwards: the server then stops sending to it.
pub async fn hand_back<S, E>(messages: &mut S, cap: usize) -> usize
where
    S: Stream<Item = Result<jetstream::Message, E>> + Unpin,
{
    let mut handed = 0;
    while handed < cap {
        match tokio::time::timeout(HAND_BACK_QUIET, messages.next()).await {
            Ok(Some(Ok(msg))) => {
                if let Err(e) = msg.ack_with(AckKind::Nak(None)).await {
                    // It comes back after the ack wait instead: late, not lost.
                    tracing::warn!(subject = %msg.subject, error = %e, "handing back a message failed");
                }
                handed += 1;
            }
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    if handed > 0 {
        tracing::info!(
            messages = handed,
            "handed back messages pulled but not started"
        );
    }
    handed
}
