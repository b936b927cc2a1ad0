//! The consume loop shared by ingest and results: pull messages in batches from a durable
//! JetStream consumer, decode them (dead-lettering what cannot be decoded), hand each batch to a
//! handler, and ack only what the handler has committed.
//!
//! Both streams keep messages by limits (see `tidings_bus::streams`), and the loop purges what
//! its consumer has acknowledged every [`PURGE_EVERY`], everything below the consumer's ack floor
//! at once. Below the floor every message has been acked or terminated, by whichever replica
//! received it, so a purge never removes work that is still to be committed.

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, consumer::pull};
use futures::StreamExt;
use std::time::Duration;
use tidings_bus::dlq::dead_letter;
use tidings_domain::messages::{Message, decode};
use tidings_domain::subjects::{StreamKind, Subjects};
use tokio_util::sync::CancellationToken;

/// How long an EnqueueRequest may stay unacknowledged before JetStream redelivers it. A batch
/// commits in well under a second; this only matters when a consumer dies mid-batch. (Results
/// use `TIDINGS_RESULT_ACK_WAIT`, which the sending lease must cover.)
pub const INGEST_ACK_WAIT: Duration = Duration::from_secs(30);

/// Delay before a batch that failed to commit (e.g. Postgres unavailable) is redelivered.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);

/// How often acknowledged messages are purged; storage holds at most this much more than what is
/// in flight.
pub const PURGE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("stream {stream}: {detail}")]
    Stream { stream: String, detail: String },
    #[error("consumer {consumer} on {stream}: {detail}")]
    Consumer {
        consumer: String,
        stream: String,
        detail: String,
    },
    #[error("purging acknowledged messages from stream {stream}: {detail}")]
    Purge { stream: String, detail: String },
}

/// Purges a stream below the ack floor of its durable consumer; made by [`durable`].
pub struct Purger {
    consumer: PullConsumer,
    stream: jetstream::stream::Stream,
}

impl Purger {
    /// Removes every message below the consumer's ack floor, unless that was already done up to
    /// `purged_below`. Returns the sequence everything below which is gone.
    pub async fn purge_acked(&self, purged_below: u64) -> Result<u64, ConsumerError> {
        let err = |detail: String| ConsumerError::Purge {
            stream: self.stream.cached_info().config.name.clone(),
            detail,
        };
        let info = self
            .consumer
            .get_info()
            .await
            .map_err(|e| err(e.to_string()))?;
        let below = info.ack_floor.stream_sequence + 1;
        if below <= purged_below {
            return Ok(purged_below);
        }
        self.stream
            .purge()
            .sequence(below)
            .await
            .map_err(|e| err(e.to_string()))?;
        Ok(below)
    }

    /// Purges every [`PURGE_EVERY`], for as long as it is polled.
    async fn run(&self) {
        let mut purged_below = 0;
        let mut tick = tokio::time::interval(PURGE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.purge_acked(purged_below).await {
                Ok(below) => purged_below = below,
                // The next tick tries again; meanwhile acked messages only take space.
                Err(e) => tracing::warn!(error = %e, "purge failed"),
            }
        }
    }
}

/// Creates (or binds to, updating its settings) the durable pull consumer `name` on the stream
/// of `kind`, and the purger of what it acknowledges. Every replica binds to the same consumer,
/// so JetStream spreads messages across them.
pub async fn durable(
    js: &jetstream::Context,
    subjects: &Subjects,
    kind: StreamKind,
    name: &str,
    max_ack_pending: i64,
    ack_wait: Duration,
) -> Result<(PullConsumer, Purger), ConsumerError> {
    let stream_name = subjects.stream(kind);
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| ConsumerError::Stream {
            stream: stream_name.clone(),
            detail: e.to_string(),
        })?;
    // Create or update: a changed ack wait takes effect on the next start.
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait,
            max_ack_pending,
            // Never give up on a message: what cannot be decoded is dead-lettered explicitly,
            // and everything else must eventually be committed.
            max_deliver: -1,
            filter_subject: subjects.all(kind),
            ..Default::default()
        })
        .await
        .map_err(|e| ConsumerError::Consumer {
            consumer: name.to_owned(),
            stream: stream_name,
            detail: e.to_string(),
        })?;
    let purger = Purger {
        consumer: consumer.clone(),
        stream,
    };
    Ok((consumer, purger))
}

/// Decodes each message; those that fail are dead-lettered and left out.
pub async fn decode_batch<M: Message>(
    js: &jetstream::Context,
    subjects: &Subjects,
    kind: StreamKind,
    messages: Vec<jetstream::Message>,
) -> Vec<(jetstream::Message, M)> {
    let mut decoded = Vec::with_capacity(messages.len());
    for msg in messages {
        match decode::<M>(&msg.payload) {
            Ok(m) => decoded.push((msg, m)),
            Err(e) => {
                tracing::warn!(subject = %msg.subject, error = %e, "dead-lettering undecodable message");
                if let Err(dlq) = dead_letter(js, subjects, kind, &msg, &e.to_string()).await {
                    tracing::error!(subject = %msg.subject, error = %dlq, "could not dead-letter message; it will be redelivered");
                }
            }
        }
    }
    decoded
}

pub async fn ack_all<'a>(messages: impl IntoIterator<Item = &'a jetstream::Message>) {
    let acks = messages.into_iter().map(|m| async move {
        if let Err(e) = m.ack().await {
            // The work is committed; a redelivery is absorbed by the idempotency layers.
            tracing::warn!(subject = %m.subject, error = %e, "ack failed; message will be redelivered");
        }
    });
    futures::future::join_all(acks).await;
}

pub async fn nak_all<'a>(messages: impl IntoIterator<Item = &'a jetstream::Message>) {
    let naks = messages
        .into_iter()
        .map(|m| async move { m.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await });
    futures::future::join_all(naks).await;
}

/// How long a partial batch waits for more messages before it is handled. Under load this turns
/// socket-read-sized chunks (~100 messages) into full batches, so per-statement and per-commit
/// costs are paid once per batch; at light load it adds at most this much latency.
pub const LINGER: Duration = Duration::from_millis(5);

/// Feeds batches of up to `batch` messages to `handle` until `shutdown`, with up to `concurrency`
/// batches in flight (so JetStream delivery, decoding and Postgres overlap), while `purger`
/// removes what was acked. On shutdown it stops pulling, hands back what it pulled but did not
/// start (so another replica takes it at once), and finishes the batches in flight, acked by
/// their handler, before it returns. A batch the handler fails on is logged; the handler has already nak'ed it for
/// redelivery.
pub async fn run<F, Fut, T, E>(
    consumer: PullConsumer,
    purger: &Purger,
    batch: usize,
    concurrency: usize,
    shutdown: CancellationToken,
    handle: F,
) -> Result<(), ConsumerError>
where
    F: Fn(Vec<jetstream::Message>) -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let name = consumer.cached_info().name.clone();
    let stream_name = consumer.cached_info().stream_name.clone();
    let err = |detail: String| ConsumerError::Consumer {
        consumer: name.clone(),
        stream: stream_name.clone(),
        detail,
    };
    let messages = consumer
        .stream()
        .max_messages_per_batch(batch)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut chunks = messages.ready_chunks(batch);
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut result = Ok(());
    // Never finishes; it ends with this loop, also when the loop ends in an error.
    let purging = purger.run();
    tokio::pin!(purging);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            () = &mut purging => {}
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            next = chunks.next(), if in_flight.len() < concurrency.max(1) => {
                let Some(mut chunk) = next else {
                    result = Err(err("message stream ended".into()));
                    break;
                };
                let deadline = tokio::time::Instant::now() + LINGER;
                while chunk.len() < batch {
                    match tokio::time::timeout_at(deadline, chunks.next()).await {
                        Ok(Some(more)) => chunk.extend(more),
                        _ => break,
                    }
                }
                let mut ok = Vec::with_capacity(chunk.len());
                for m in chunk {
                    match m {
                        Ok(m) => ok.push(m),
                        // Missed heartbeats and the like: the stream recovers by itself.
                        Err(e) => tracing::warn!(consumer = %name, error = %e, "consumer hiccup"),
                    }
                }
                if !ok.is_empty() {
                    let consumer = name.clone();
                    let work = handle(ok);
                    in_flight.push(async move {
                        if let Err(e) = work.await {
                            tracing::error!(consumer = %consumer, error = %e, "batch failed; it will be redelivered");
                        }
                    });
                }
            }
        }
    }
    let mut pulled = chunks.into_inner();
    tidings_bus::pull::hand_back(&mut pulled, batch * 2).await;
    drop(pulled);
    while in_flight.next().await.is_some() {}
    result
}

/// One batch of whatever is available now (waiting at most `wait`), for step-by-step tests and
/// benchmarks.
pub async fn fetch(
    consumer: &PullConsumer,
    batch: usize,
    wait: Duration,
) -> Result<Vec<jetstream::Message>, ConsumerError> {
    let mut got = consumer
        .fetch()
        .max_messages(batch)
        .expires(wait)
        .messages()
        .await
        .map_err(|e| ConsumerError::Consumer {
            consumer: consumer.cached_info().name.clone(),
            stream: consumer.cached_info().stream_name.clone(),
            detail: e.to_string(),
        })?;
    let mut out = Vec::new();
    while let Some(m) = got.next().await {
        match m {
            Ok(m) => out.push(m),
            Err(e) => tracing::debug!(error = %e, "fetch ended"),
        }
    }
    Ok(out)
}
