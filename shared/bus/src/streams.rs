//! Creating the JetStream streams (idempotent; every service calls it at start-up).
//!
//! The enqueue and result streams keep messages by limits (age), and the dispatcher's consume
//! loop purges what its consumer has acknowledged (`tidings_dispatcher::consume`): a work-queue
//! stream removes each acked message on its own and writes a tombstone for it, which was a fifth
//! of nats-server's work in ingest; a purge below the consumer's ack floor removes thousands at
//! once, so storage stays bounded by what is in flight all the same. The push stream stays a work
//! queue: its length is the dispatcher's back-pressure signal (a purge would lag it).
//!
//! The enqueue stream's duplicate window is the first idempotency layer (docs/design.md): a detector
//! that re-publishes the same dedup key within the window is answered `duplicate` and nothing is
//! stored. A purge by sequence leaves the window as it is (tested).

use crate::connection::{ConnectionArgs, ConnectionError};
use async_nats::jetstream::{self, stream};
use std::time::Duration;
use tidings_domain::duration::parse_duration;
use tidings_domain::subjects::{InvalidPrefix, StreamKind, Subjects};
use tidings_runtime::flags;
use tidings_runtime::ops::{Starting, nats_check};
use tidings_runtime::startup::{self, Dependency};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// 1 for a single local server; 3 in production (docs/design.md).
    pub replicas: usize,
    pub duplicate_window: Duration,
    /// How long an unconsumed work message is kept; Postgres and the detector recover anything
    /// older, so this only bounds storage when a consumer is down for long.
    pub max_age: Duration,
    pub dlq_max_age: Duration,
    /// How long the delivery log remembers a delivered row (`crate::delivered`): the window in
    /// which a redelivered or retried push is recognised and not sent again.
    pub delivery_log_ttl: Duration,
    /// Where the push and result streams keep their messages (see [`PushStorage`]).
    pub push_storage: PushStorage,
}

/// Where the push and result streams keep their messages. Nothing rests on them (docs/design.md):
/// a push or result they lose, in a crash or a restart, is recovered by the dispatcher's lease
/// sweeper within a lease, so they may live in memory, which costs nats-server less than file
/// storage (docs/benchmarks.md); with three replicas a memory stream survives a node's loss. The
/// enqueue stream stays on file whatever this says: a lost enqueue is found again only by the
/// detector's re-publish (`TIDINGS_REPUBLISH_AFTER`, minutes), and the dead letters are the
/// operator's evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PushStorage {
    File,
    Memory,
}

impl PushStorage {
    fn of(self) -> stream::StorageType {
        match self {
            PushStorage::File => stream::StorageType::File,
            PushStorage::Memory => stream::StorageType::Memory,
        }
    }
}

/// What the flags give when none is set.
impl Default for StreamSettings {
    fn default() -> Self {
        flags::parsed_defaults::<NatsArgs>(&[]).streams()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("could not create or update stream {stream}: {source}")]
    Stream {
        stream: String,
        #[source]
        source: async_nats::jetstream::context::CreateStreamError,
    },
    #[error(transparent)]
    DeliveryLog(#[from] crate::delivered::DeliveryLogError),
}

/// A stream a service needs is not there: the dispatcher, which alone may create streams,
/// has not run yet.
#[derive(Debug, thiserror::Error)]
#[error("stream {stream} does not exist yet (the dispatcher creates the streams): {source}")]
pub struct MissingStream {
    pub stream: String,
    #[source]
    pub source: async_nats::jetstream::context::GetStreamError,
}

/// Whether a service creates the streams it needs or waits for them: only the dispatcher
/// creates (its NATS user alone may, so the internet-facing pusher cannot make or reshape one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streams {
    Create,
    Await,
}

/// Ok once every stream exists.
pub async fn require_streams(
    js: &jetstream::Context,
    subjects: &Subjects,
) -> Result<(), MissingStream> {
    for kind in StreamKind::ALL {
        let name = subjects.stream(kind);
        js.get_stream(&name).await.map_err(|source| MissingStream {
            stream: name,
            source,
        })?;
    }
    Ok(())
}

/// The durable consumers the workers run: (stream, name). `doctor` checks that each exists.
pub const CONSUMERS: [(StreamKind, &str); 3] = [
    (StreamKind::Enqueue, "dispatcher-ingest"),
    (StreamKind::Result, "dispatcher-results"),
    (StreamKind::Push, "pusher"),
];

/// The name of the durable consumer on `kind`'s stream ([`CONSUMERS`]).
pub const fn consumer_of(kind: StreamKind) -> &'static str {
    match kind {
        StreamKind::Enqueue => CONSUMERS[0].1,
        StreamKind::Result => CONSUMERS[1].1,
        StreamKind::Push | StreamKind::Dlq => CONSUMERS[2].1,
    }
}

/// The configuration of one stream, public so tests and operators can compare it.
pub fn stream_config(subjects: &Subjects, kind: StreamKind, s: &StreamSettings) -> stream::Config {
    let work = kind != StreamKind::Dlq;
    stream::Config {
        name: subjects.stream(kind),
        subjects: vec![subjects.all(kind)],
        retention: match kind {
            StreamKind::Push => stream::RetentionPolicy::WorkQueue,
            StreamKind::Enqueue | StreamKind::Result | StreamKind::Dlq => {
                stream::RetentionPolicy::Limits
            }
        },
        storage: match kind {
            StreamKind::Push | StreamKind::Result => s.push_storage.of(),
            StreamKind::Enqueue | StreamKind::Dlq => stream::StorageType::File,
        },
        num_replicas: s.replicas,
        duplicate_window: s.duplicate_window,
        max_age: if work { s.max_age } else { s.dlq_max_age },
        ..Default::default()
    }
}

/// Creates every stream under the prefix and the delivery log's bucket, or leaves them as they
/// are when they already exist. The dispatcher alone does this: the pusher, which talks to URLs
/// strangers chose, may neither make nor reshape one (it could shorten the delivery log's memory
/// and with it the guard against a second push).
pub async fn ensure_streams(
    js: &jetstream::Context,
    subjects: &Subjects,
    settings: &StreamSettings,
) -> Result<(), StreamError> {
    // First: the pusher starts once the streams exist, and then opens the bucket.
    crate::delivered::DeliveryLog::new(js.clone(), subjects, settings)
        .creating()
        .ensure()
        .await?;
    for kind in StreamKind::ALL {
        let config = stream_config(subjects, kind, settings);
        let name = config.name.clone();
        let error = |source| StreamError::Stream {
            stream: name.clone(),
            source,
        };
        let stream = js
            .get_or_create_stream(config.clone())
            .await
            .map_err(error)?;
        // A stream made by an earlier release keeps its settings, but for the duplicate window,
        // which every service reads from the same configuration: it follows the setting.
        let current = stream.cached_info().config.duplicate_window;
        if current != config.duplicate_window {
            let mut updated = stream.cached_info().config.clone();
            updated.duplicate_window = config.duplicate_window;
            js.update_stream(updated).await.map_err(error)?;
            tracing::info!(stream = %name, from = ?current, to = ?config.duplicate_window, "duplicate window changed");
        }
    }
    Ok(())
}

/// Where NATS is and how the streams are named and replicated.
#[derive(clap::Args, Clone, Debug)]
pub struct NatsArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Prefix of every subject and stream.
    #[arg(long, env = "TIDINGS_PREFIX", default_value = Subjects::DEFAULT_PREFIX)]
    pub prefix: String,
    /// JetStream replicas per stream (3 in production).
    #[arg(long, env = "TIDINGS_STREAM_REPLICAS", default_value_t = 1)]
    pub stream_replicas: usize,
    /// How long the delivery log remembers a delivered row, so a redelivered or retried push is
    /// not sent again (pusher and dispatcher read the same setting).
    #[arg(long, env = "TIDINGS_DELIVERY_LOG_TTL", default_value = "10m", value_parser = parse_duration)]
    pub delivery_log_ttl: Duration,
    /// How long the enqueue stream remembers a dedup key, answering a re-publish `duplicate`
    /// without storing it. Longer than the detector's TIDINGS_REPUBLISH_AFTER, so a trigger that
    /// keeps holding is re-published into the window; the outbox's unique key is the real
    /// dedup. nats-server holds ~300 bytes per key for this long (docs/scaling.md).
    #[arg(long, env = "TIDINGS_DUPLICATE_WINDOW", default_value = "15m", value_parser = parse_duration)]
    pub duplicate_window: Duration,
    /// Storage of the push and result streams, `file` or `memory` (every service reads the
    /// same setting; a stream keeps the storage it was made with, see docs/operations.md).
    #[arg(long, env = "TIDINGS_PUSH_STORAGE", value_enum, default_value = "file")]
    pub push_storage: PushStorage,
}

impl NatsArgs {
    pub fn subjects(&self) -> Result<Subjects, InvalidPrefix> {
        Subjects::new(&self.prefix)
    }

    /// [`connect`] with these flags' connection and stream settings.
    pub async fn connect(
        &self,
        subjects: &Subjects,
        role: Streams,
    ) -> Result<(async_nats::Client, Dependency), ConnectionError> {
        connect(&self.connection, subjects, &self.streams(), role).await
    }

    pub fn streams(&self) -> StreamSettings {
        StreamSettings {
            replicas: self.stream_replicas,
            duplicate_window: self.duplicate_window,
            max_age: Duration::from_secs(7 * 24 * 60 * 60),
            dlq_max_age: Duration::from_secs(14 * 24 * 60 * 60),
            delivery_log_ttl: self.delivery_log_ttl,
            push_storage: self.push_storage,
        }
    }
}

/// Waits until NATS is connected and the streams exist, creating them with [`Streams::Create`]
/// (see `tidings_runtime::startup`).
pub async fn wait_for_streams(
    client: &async_nats::Client,
    url: &str,
    subjects: &Subjects,
    settings: &StreamSettings,
    role: Streams,
    starting: &Starting,
    shutdown: &CancellationToken,
) -> Option<()> {
    startup::wait_for_nats(client, url, starting, shutdown).await?;
    let js = jetstream::new(client.clone());
    match role {
        Streams::Create => {
            startup::retry("JetStream streams", starting, shutdown, || {
                ensure_streams(&js, subjects, settings)
            })
            .await
        }
        Streams::Await => {
            startup::retry("JetStream streams", starting, shutdown, || {
                require_streams(&js, subjects)
            })
            .await
        }
    }
}

/// Connects to NATS as `connection` says (the connection keeps trying in the background until a
/// server answers) and returns the client with NATS and the streams as a start-up dependency:
/// ready while connected; start-up waits until the connection is up and the streams exist.
pub async fn connect(
    connection: &ConnectionArgs,
    subjects: &Subjects,
    settings: &StreamSettings,
    role: Streams,
) -> Result<(async_nats::Client, Dependency), ConnectionError> {
    let client = connection.connect().await?;
    let (url, subjects, settings) = (
        connection.nats_url.clone(),
        subjects.clone(),
        settings.clone(),
    );
    let waiting = client.clone();
    let dependency = Dependency {
        check: nats_check(client.clone()),
        wait: Box::new(move |starting, shutdown| {
            Box::pin(async move {
                wait_for_streams(
                    &waiting, &url, &subjects, &settings, role, &starting, &shutdown,
                )
                .await
            })
        }),
    };
    Ok((client, dependency))
}
