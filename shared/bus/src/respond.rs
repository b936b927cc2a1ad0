//! Answering requests on a core NATS subject (the roll call, redrive asks) until shutdown,
//! subscribing again whenever the subscription ends (the connection reconnects by itself).

use futures::StreamExt;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Answers each request on `subject` with what `answer` makes of it, until `shutdown`. With a
/// `queue`, each request is answered by one member of the queue group only. `what` names the
/// subject in the logs.
pub async fn serve<F, Fut>(
    client: async_nats::Client,
    subject: String,
    queue: Option<&'static str>,
    what: &'static str,
    shutdown: CancellationToken,
    mut answer: F,
) where
    F: FnMut(async_nats::Message) -> Fut,
    Fut: Future<Output = Vec<u8>>,
{
    while !shutdown.is_cancelled() {
        let subscribed = match queue {
            Some(q) => client.queue_subscribe(subject.clone(), q.into()).await,
            None => client.subscribe(subject.clone()).await,
        };
        let mut requests = match subscribed {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, what, "cannot subscribe; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => continue,
                }
            }
        };
        loop {
            let request = tokio::select! {
                _ = shutdown.cancelled() => return,
                request = requests.next() => request,
            };
            let Some(request) = request else { break };
            let Some(reply) = request.reply.clone() else {
                continue;
            };
            let body = answer(request).await;
            if let Err(e) = client.publish(reply, body.into()).await {
                tracing::warn!(error = %e, what, "cannot answer a request");
            }
        }
    }
}
