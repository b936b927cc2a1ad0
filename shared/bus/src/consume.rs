//! The one consume loop of every Tidings consumer (the dispatcher's ingest and results, the
//! pusher): pull messages from a durable JetStream consumer, hand them to a handler in batches
//! with a bounded number in flight, decode them (dead-lettering what cannot be decoded), and let
//! the handler ack only what it has committed. On shutdown it hands back what it pulled but did
//! not start.
//!
//! The enqueue and result streams keep messages by limits (see [`crate::streams`]), so their
//! loops purge what the consumer has acknowledged every [`PURGE_EVERY`], everything below the
//! consumer's ack floor at once. Below the floor every message has been acked or terminated, by
//! whichever replica received it, so a purge never removes work that is still to be committed.
//! The push stream is a work queue: JetStream removes what is acked, and its loop has no purger.

use crate::dlq::dead_letter;
use crate::pull::hand_back;
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, consumer::pull, stream};
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tidings_domain::messages::{DecodeError, PushRequest};
use tidings_domain::subjects::{StreamKind, Subjects};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Delay before a batch that failed to commit (e.g. Postgres unavailable) is redelivered.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);

/// How often acknowledged messages are purged; storage holds at most this much more than what is
/// in flight.
pub const PURGE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("stream {stream}: {source}")]
    Stream {
        stream: String,
        #[source]
        source: crate::Cause,
    },
    #[error("consumer {consumer} on {stream}: {source}")]
    Consumer {
        consumer: String,
        stream: String,
        #[source]
        source: crate::Cause,
    },
    #[error("purging acknowledged messages from stream {stream}: {source}")]
    Purge {
        stream: String,
        #[source]
        source: crate::Cause,
    },
}

/// Purges a stream below the ack floor of its durable consumer; made by [`Consumer::durable`].
pub struct Purger {
    consumer: PullConsumer,
    stream: jetstream::stream::Stream,
}

impl Purger {
    /// Removes every message below the consumer's ack floor, unless that was already done up to
    /// `purged_below`. Returns the sequence everything below which is gone.
    pub async fn purge_acked(&self, purged_below: u64) -> Result<u64, ConsumerError> {
        let err = |source: crate::Cause| ConsumerError::Purge {
            stream: self.stream.cached_info().config.name.clone(),
            source,
        };
        let info = self.consumer.get_info().await.map_err(|e| err(e.into()))?;
        let below = info.ack_floor.stream_sequence + 1;
        if below <= purged_below {
            return Ok(purged_below);
        }
        self.stream
            .purge()
            .sequence(below)
            .await
            .map_err(|e| err(e.into()))?;
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

/// A durable pull consumer: its name, the stream it reads, which subjects of it, and how much it
/// may hold unacknowledged, for how long.
#[derive(Clone, Debug)]
pub struct Durable {
    pub name: &'static str,
    pub kind: StreamKind,
    /// `None`: every subject of the stream.
    pub filter: Option<String>,
    pub max_ack_pending: i64,
    pub ack_wait: Duration,
    /// How the running loop takes its messages.
    pub shape: Shape,
}

/// A durable pull consumer, with the purger of what it acknowledges when its stream keeps
/// messages by limits (a work queue removes them itself).
pub struct Consumer {
    pull: PullConsumer,
    purger: Option<Purger>,
    shape: Shape,
    /// Where undecodable messages go: the broker and the deployment's subjects.
    js: jetstream::Context,
    subjects: Subjects,
}

/// What a consumer does with its messages: a batch at a time, decoded at the edge (the loop
/// dead-letters what cannot be decoded), acking (or nak'ing) each message itself once its work is
/// committed (or failed). [`Handler::run`] is the service's loop, [`Handler::run_once`] one step
/// of it for tests and benchmarks.
pub trait Handler: Send + Sync + Sized + 'static {
    /// What the stream's messages carry.
    type Item: Carried + Send + Sync + 'static;
    type Done: Send + 'static;
    type Error: std::fmt::Display + From<ConsumerError> + Send + 'static;

    fn consumer(&self) -> &Consumer;

    /// One decoded batch, and how many of its messages were dead-lettered undecoded.
    fn handle(
        &self,
        batch: Decoded<Self::Item>,
    ) -> impl Future<Output = Result<Self::Done, Self::Error>> + Send;

    /// Decodes `messages` (dead-lettering what cannot be), then [`Handler::handle`]s them.
    fn decode_and_handle(
        &self,
        messages: Vec<jetstream::Message>,
    ) -> impl Future<Output = Result<Self::Done, Self::Error>> + Send {
        async move {
            let c = self.consumer();
            let batch = decode_all(&c.js, &c.subjects, messages).await;
            self.handle(batch).await
        }
    }

    /// A gate the loop waits on before it takes more messages: while it holds `false` nothing
    /// new is taken, and JetStream keeps the rest (e.g. ingest while dispatch is behind).
    /// `None` (the default): always open.
    fn gate(&self) -> Option<watch::Receiver<bool>> {
        None
    }

    /// Handles whatever is available now (waiting at most `wait` for it) as one batch.
    fn run_once(&self, wait: Duration) -> impl Future<Output = Result<Self::Done, Self::Error>> {
        async move {
            let messages = self.consumer().fetch(wait).await?;
            self.decode_and_handle(messages).await
        }
    }

    /// Handles messages until `shutdown`; see [`Consumer::run`].
    fn run(
        self,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        async move {
            let this = Arc::new(self);
            this.consumer().run(Arc::clone(&this), shutdown).await?;
            Ok(())
        }
    }
}

impl Consumer {
    /// Creates (or binds to, updating its settings) the durable pull consumer `d` on its
    /// stream. Every replica binds to the same consumer, so JetStream spreads messages across
    /// them.
    pub async fn durable(
        js: &jetstream::Context,
        subjects: &Subjects,
        d: Durable,
    ) -> Result<Self, ConsumerError> {
        let shape = d.shape;
        let (pull, stream) = durable(js, subjects, d).await?;
        let limits = stream.cached_info().config.retention == stream::RetentionPolicy::Limits;
        let purger = limits.then(|| Purger {
            consumer: pull.clone(),
            stream,
        });
        Ok(Consumer {
            pull,
            purger,
            shape,
            js: js.clone(),
            subjects: subjects.clone(),
        })
    }

    /// The JetStream consumer itself.
    pub fn pull(&self) -> &PullConsumer {
        &self.pull
    }

    /// Purges what was acknowledged, as the running loop does every [`PURGE_EVERY`] (a work
    /// queue needs none: `purged_below` is returned).
    pub async fn purge_acked(&self, purged_below: u64) -> Result<u64, ConsumerError> {
        match &self.purger {
            Some(p) => p.purge_acked(purged_below).await,
            None => Ok(purged_below),
        }
    }

    /// One batch of whatever is available now (waiting at most `wait`), for step-by-step tests.
    pub async fn fetch(&self, wait: Duration) -> Result<Vec<jetstream::Message>, ConsumerError> {
        fetch(&self.pull, self.shape.batch, wait).await
    }

    /// Feeds the messages to `handler` in batches of its shape until `shutdown`, with up to
    /// `concurrency` calls in flight, each its own task (so JetStream delivery, decoding
    /// and the work overlap), while the purger, if any, removes what was acked. A message is
    /// taken from the subscription only when a call can start, so none sits taken but unstarted.
    /// On shutdown it stops, hands back what it pulled but did not start (so another replica
    /// takes it at once), and waits for the calls in flight, acked by the handler, before it
    /// returns. A call that fails is logged; the handler has already nak'ed its messages.
    pub async fn run<H: Handler>(
        &self,
        handler: Arc<H>,
        shutdown: CancellationToken,
    ) -> Result<(), ConsumerError> {
        let handle = |messages| {
            let handler = Arc::clone(&handler);
            async move { handler.decode_and_handle(messages).await }
        };
        let purger = self.purger.as_ref();
        let gate = handler.gate();
        run(&self.pull, purger, self.shape, gate, shutdown, handle).await
    }
}

async fn durable(
    js: &jetstream::Context,
    subjects: &Subjects,
    d: Durable,
) -> Result<(PullConsumer, jetstream::stream::Stream), ConsumerError> {
    let (name, kind) = (d.name, d.kind);
    // What this consumer may dead-letter, and its failed batches, counted from 0.
    tidings_runtime::metrics::at_zero(
        &crate::metrics::metrics().dead_lettered,
        tidings_runtime::metrics::kinds([kind.as_str()]),
    );
    tidings_runtime::metrics::metrics()
        .may_fail(&[tidings_runtime::metrics::Failure::Consumer(name)]);
    let stream_name = subjects.stream(kind);
    let stream = js
        .get_stream(&stream_name)
        .await
        .map_err(|e| ConsumerError::Stream {
            stream: stream_name.clone(),
            source: e.into(),
        })?;
    // Create or update: a changed ack wait takes effect on the next start.
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: d.ack_wait,
            max_ack_pending: d.max_ack_pending,
            // Never give up on a message: what cannot be decoded is dead-lettered explicitly,
            // and everything else must eventually be committed.
            max_deliver: -1,
            filter_subject: d.filter.unwrap_or_else(|| subjects.all(kind)),
            ..Default::default()
        })
        .await
        .map_err(|e| ConsumerError::Consumer {
            consumer: name.to_owned(),
            stream: stream_name,
            source: e.into(),
        })?;
    Ok((consumer, stream))
}

/// A message's `Nats-Msg-Id` (the id JetStream deduplicates it by), for its consumer's span.
pub fn message_id(msg: &jetstream::Message) -> Option<&str> {
    Some(msg.headers.as_ref()?.get("Nats-Msg-Id")?.as_str())
}

/// What a message on one of the pipeline's streams carries: one item alone, or a batch of them.
/// A batch's items each carry their own trace context; an item alone carries it in its
/// message's `traceparent` header.
pub trait Carried: Sized {
    /// The stream the messages come from (where an undecodable one is dead-lettered from).
    const STREAM: StreamKind;

    /// The items of a message's payload, alone or batched.
    fn decode_payload(bytes: &[u8]) -> Result<Vec<Self>, DecodeError>;

    /// The item's own trace context, if it carries one.
    fn own_traceparent(&self) -> Option<&str>;
}

/// `Carried` for a message type: its stream and its decoder (each carries its own trace field).
macro_rules! carried {
    ($($item:ident on $stream:ident by $decode:ident;)*) => {$(
        impl Carried for tidings_domain::messages::$item {
            const STREAM: StreamKind = StreamKind::$stream;
            fn decode_payload(bytes: &[u8]) -> Result<Vec<Self>, DecodeError> {
                tidings_domain::messages::$decode(bytes)
            }
            fn own_traceparent(&self) -> Option<&str> {
                self.traceparent.as_deref()
            }
        }
    )*};
}

carried! {
    EnqueueRequest on Enqueue by decode_enqueues;
    PushResult on Result by decode_results;
}

/// A push request with its payload read as `P`: the pusher reads it as
/// [`RawPayload`](tidings_domain::messages::RawPayload), the JSON it encrypts.
impl<P: serde::Serialize + serde::de::DeserializeOwned> Carried for PushRequest<P> {
    const STREAM: StreamKind = StreamKind::Push;
    fn decode_payload(bytes: &[u8]) -> Result<Vec<Self>, DecodeError> {
        tidings_domain::messages::decode_batched(bytes)
    }
    fn own_traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
}

/// A message decoded at the edge: the message itself (to ack or nak once its work is done) and
/// the items it carries.
pub struct Incoming<T> {
    pub message: jetstream::Message,
    pub items: Vec<T>,
}

impl<T: Carried> Incoming<T> {
    /// The trace context `item` (one of this delivery's) continues.
    pub fn traceparent<'a>(&'a self, item: &'a T) -> Option<&'a str> {
        traceparent_of(&self.message, item)
    }
}

/// The trace context `item` (carried by `message`) continues: its own, or its message's header
/// for an item alone. The one place the two shapes are told apart.
pub fn traceparent_of<'a, T: Carried>(
    message: &'a jetstream::Message,
    item: &'a T,
) -> Option<&'a str> {
    item.own_traceparent().or_else(|| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get("traceparent"))
            .map(|v| v.as_str())
    })
}

/// The items `message` carries; if it cannot be decoded it is dead-lettered (and so
/// acknowledged) and `None` returned. If dead-lettering fails too, the message is left for
/// redelivery. Every consumer's undecodable messages go through here.
pub async fn decode_one<T: Carried>(
    js: &jetstream::Context,
    subjects: &Subjects,
    message: &jetstream::Message,
) -> Option<Vec<T>> {
    match T::decode_payload(&message.payload) {
        Ok(items) => Some(items),
        Err(e) => {
            tracing::warn!(subject = %message.subject, error = %e, "dead-lettering undecodable message");
            if let Err(dlq) = dead_letter(js, subjects, T::STREAM, message, &e.to_string()).await {
                tracing::error!(subject = %message.subject, error = %dlq, "could not dead-letter message; it will be redelivered");
            }
            None
        }
    }
}

/// A batch of messages decoded at the edge.
pub struct Decoded<T> {
    /// The messages that decoded, in order.
    pub deliveries: Vec<Incoming<T>>,
    /// How many did not, and were dead-lettered (or left for redelivery if that failed).
    pub dead_lettered: usize,
}

/// Decodes `messages` from `T`'s stream; each that cannot be decoded is dead-lettered (and so
/// acknowledged), or, if dead-lettering fails too, left for redelivery.
pub async fn decode_all<T: Carried>(
    js: &jetstream::Context,
    subjects: &Subjects,
    messages: Vec<jetstream::Message>,
) -> Decoded<T> {
    let total = messages.len();
    let mut deliveries = Vec::with_capacity(total);
    for message in messages {
        if let Some(items) = decode_one(js, subjects, &message).await {
            deliveries.push(Incoming { message, items });
        }
    }
    let dead_lettered = total - deliveries.len();
    Decoded {
        deliveries,
        dead_lettered,
    }
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

/// How a loop takes its messages.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Messages asked for per pull request.
    pub pull: usize,
    /// Messages per handler call; a partial batch waits up to `linger` for more.
    pub batch: usize,
    pub linger: Duration,
    /// Handler calls in flight, each its own task (so they use every core).
    pub concurrency: usize,
}

impl Shape {
    /// Batches of `batch` for a handler that commits many messages in one statement.
    pub fn batches(batch: usize, concurrency: usize) -> Self {
        Shape {
            pull: batch,
            batch,
            linger: LINGER,
            concurrency,
        }
    }

    /// One message per handler call, `concurrency` at a time, for a handler that waits on
    /// something slow per message (an HTTP exchange).
    pub fn each(concurrency: usize) -> Self {
        Shape {
            pull: concurrency,
            batch: 1,
            linger: Duration::ZERO,
            concurrency,
        }
    }
}

/// The loop behind [`Consumer::run`].
async fn run<F, Fut, T, E>(
    consumer: &PullConsumer,
    purger: Option<&Purger>,
    shape: Shape,
    mut gate: Option<watch::Receiver<bool>>,
    shutdown: CancellationToken,
    mut handle: F,
) -> Result<(), ConsumerError>
where
    F: FnMut(Vec<jetstream::Message>) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let name = consumer.cached_info().name.clone();
    let stream_name = consumer.cached_info().stream_name.clone();
    let err = |source: crate::Cause| ConsumerError::Consumer {
        consumer: name.clone(),
        stream: stream_name.clone(),
        source,
    };
    let batch = shape.batch.max(1);
    let mut chunks = pull_stream(consumer, shape.pull)
        .await
        .map_err(|e| err(e.into()))?
        .ready_chunks(batch);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut result = Ok(());
    // Never finishes; it ends with this loop, also when the loop ends in an error.
    let purging = purge(purger);
    tokio::pin!(purging);
    // Progress: a free slot (the loop can take work, or there is none to take) or a closed gate
    // (held on purpose); all slots busy past the bound means a handler hangs.
    let progress = tidings_runtime::liveness::Progress::register(name.clone());
    let mut looking = tokio::time::interval(
        (tidings_runtime::liveness::stall_after() / 4).max(Duration::from_millis(100)),
    );
    loop {
        let open = gate.as_ref().is_none_or(|g| *g.borrow());
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = looking.tick() => {
                if !open || in_flight.len() < shape.concurrency.max(1) {
                    progress.beat();
                }
            }
            () = &mut purging => {}
            changed = opened(gate.as_mut()), if !open => {
                // A gate whose sender is gone can never open again: run without it.
                if changed.is_err() {
                    gate = None;
                }
            }
            Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Err(e) = joined {
                    tracing::error!(consumer = %name, error = %e, "batch handler panicked; its messages will be redelivered");
                }
            }
            next = chunks.next(), if open && in_flight.len() < shape.concurrency.max(1) => {
                let Some(mut chunk) = next else {
                    result = Err(err("message stream ended".into()));
                    break;
                };
                linger(&mut chunk, &mut chunks, batch, shape.linger).await;
                let ok = usable(chunk, &name);
                if !ok.is_empty() {
                    in_flight.spawn(reported(name.clone(), handle(ok)));
                }
            }
        }
    }
    let mut pulled = chunks.into_inner();
    hand_back(&mut pulled, shape.pull.max(batch) * 2).await;
    drop(pulled);
    while in_flight.join_next().await.is_some() {}
    result
}

/// Purges acked messages while the loop runs (never finishes; without a purger, does nothing).
async fn purge(purger: Option<&Purger>) {
    match purger {
        Some(p) => p.run().await,
        None => std::future::pending().await,
    }
}

/// The consumer's messages, pulled `pull` at a time.
async fn pull_stream(
    consumer: &PullConsumer,
    pull: usize,
) -> Result<
    async_nats::jetstream::consumer::pull::Stream,
    async_nats::jetstream::consumer::StreamError,
> {
    consumer
        .stream()
        .max_messages_per_batch(pull.max(1))
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
}

/// A handler call whose failure is counted and logged (its messages are redelivered).
async fn reported<T, E: std::fmt::Display>(
    consumer: String,
    work: impl Future<Output = Result<T, E>>,
) {
    if let Err(e) = work.await {
        tidings_runtime::metrics::metrics()
            .failed(tidings_runtime::metrics::Failure::Consumer(&consumer));
        tracing::error!(consumer = %consumer, error = %e, "batch failed; it will be redelivered");
    }
}

/// Waits up to `wait` for a short `chunk` to fill to `batch` from `chunks`.
async fn linger<S, I>(chunk: &mut Vec<I>, chunks: &mut S, batch: usize, wait: Duration)
where
    S: futures::Stream<Item = Vec<I>> + Unpin,
{
    if chunk.len() >= batch || wait.is_zero() {
        return;
    }
    let deadline = tokio::time::Instant::now() + wait;
    while chunk.len() < batch {
        match tokio::time::timeout_at(deadline, chunks.next()).await {
            Ok(Some(more)) => chunk.extend(more),
            _ => break,
        }
    }
}

/// The messages of a chunk; the stream's errors (missed heartbeats and the like, from which it
/// recovers by itself) are logged.
fn usable<E: std::fmt::Display>(
    chunk: Vec<Result<jetstream::Message, E>>,
    consumer: &str,
) -> Vec<jetstream::Message> {
    let mut ok = Vec::with_capacity(chunk.len());
    for m in chunk {
        match m {
            Ok(m) => ok.push(m),
            Err(e) => tracing::warn!(consumer = %consumer, error = %e, "consumer hiccup"),
        }
    }
    ok
}

/// Until `gate` changes (never without one).
async fn opened(gate: Option<&mut watch::Receiver<bool>>) -> Result<(), watch::error::RecvError> {
    match gate {
        Some(g) => g.changed().await,
        None => std::future::pending().await,
    }
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
            source: e.into(),
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
