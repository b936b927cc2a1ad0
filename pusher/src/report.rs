//! Reporting results: every PushResult goes back to the dispatcher, several to a message.
//!
//! A message on a JetStream stream costs nats-server the same whether it carries one result or
//! a hundred: it is stored, delivered to the dispatcher and acked. Handlers hand their result to
//! one [`Reporter`], which gathers what arrives within [`LINGER`] (up to [`BATCH`]) into one
//! [`PushResults`] and tells each handler once JetStream has stored it: only then does the
//! handler ack its PushRequest, so a result is never lost to a crash in between (the request is
//! redelivered, and the delivery log keeps it from being sent twice).

use async_nats::jetstream;
use std::sync::Arc;
use std::time::Duration;
use tidings_domain::messages::{PushResult, PushResults, encode};
use tokio::sync::{mpsc, oneshot};

/// How long the first result of a batch waits for others. Under load a batch fills well before;
/// at light load a result reaches the dispatcher at most this much later.
pub const LINGER: Duration = Duration::from_millis(5);

/// The most results in one message.
pub const BATCH: usize = 100;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ReportError {
    #[error("publishing a batch of {count} PushResults: {source}")]
    Publish {
        count: usize,
        /// Shared: every handler whose result was in the batch gets the same error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    #[error("the result reporter has stopped")]
    Stopped,
}

struct Pending {
    result: PushResult,
    stored: oneshot::Sender<Result<(), ReportError>>,
}

/// The handle handlers report through; its task ends when the last handle is dropped.
#[derive(Clone)]
pub struct Reporter {
    tx: mpsc::Sender<Pending>,
}

impl Reporter {
    /// Starts the task that publishes to `subject`.
    pub fn start(js: jetstream::Context, subject: String) -> Self {
        let (tx, rx) = mpsc::channel(BATCH * 4);
        tokio::spawn(gather(js, subject, rx));
        Reporter { tx }
    }

    /// Returns once `result` is stored in the result stream.
    pub async fn report(&self, result: PushResult) -> Result<(), ReportError> {
        let (stored, done) = oneshot::channel();
        self.tx
            .send(Pending { result, stored })
            .await
            .map_err(|_| ReportError::Stopped)?;
        done.await.map_err(|_| ReportError::Stopped)?
    }
}

async fn gather(js: jetstream::Context, subject: String, mut rx: mpsc::Receiver<Pending>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(p)) => batch.push(p),
                // Lingered long enough, or every handle is gone: send what there is.
                Ok(None) | Err(_) => break,
            }
        }
        // Published on its own task, so the next batch gathers while this one is stored.
        tokio::spawn(publish(js.clone(), subject.clone(), batch));
    }
}

async fn publish(js: jetstream::Context, subject: String, batch: Vec<Pending>) {
    let count = batch.len();
    let (results, waiting): (Vec<PushResult>, Vec<_>) =
        batch.into_iter().map(|p| (p.result, p.stored)).unzip();
    let body = encode(&PushResults::new(results));
    let stored = match js.publish(subject, body.into()).await {
        Ok(ack) => ack.await.map(|_| ()),
        Err(e) => Err(e),
    };
    let stored = stored.map_err(|e| ReportError::Publish {
        count,
        source: Arc::new(e),
    });
    for w in waiting {
        // A handler that stopped waiting has nothing left to ack.
        let _ = w.send(stored.clone());
    }
}
