//! Ingest: EnqueueRequests from JetStream into the outbox.
//!
//! A message carries one EnqueueRequest or an `EnqueueRequests` batch of them. One batch of
//! messages is one `INSERT … SELECT FROM UNNEST … ON CONFLICT (dedup key) DO NOTHING` per
//! `TIDINGS_INGEST_BATCH` requests; messages are acked only after it commits, so a crash in
//! between means a redelivery, which the unique key absorbs. A message that cannot be decoded is
//! dead-lettered and terminated; a request that names a watch that does not exist (or belongs to
//! another device) is dead-lettered (with the others of its message that were refused) and the
//! rest of its message inserted. Nothing blocks the stream.
//! Acked messages are purged from the stream by the consume loop (`consume::Purger`).

use async_nats::jetstream;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tidings_bus::consume::{self, Consumer, ConsumerError, Decoded, Durable, Incoming, Shape};
use tidings_bus::dlq::{self, dead_letter};
use tidings_domain::messages::{EnqueueRequest, EnqueueRequests, encode};
use tidings_domain::subjects::StreamKind;
use tidings_domain::{DeviceId, WatchId};
use tidings_runtime::metrics::ResultLabels;
use tidings_runtime::telemetry;

use crate::config::Settings;
use crate::stage::Stage;
use tidings_store::enqueue::insert;
use tidings_store::partitions::Partitions;

pub const CONSUMER: &str = tidings_bus::streams::consumer_of(StreamKind::Enqueue);

/// How long an EnqueueRequest may stay unacknowledged before JetStream redelivers it. A batch
/// commits in well under a second; this only matters when a consumer dies mid-batch. (Results
/// use `TIDINGS_RESULT_ACK_WAIT`, which the sending lease must cover.)
pub const ACK_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IngestStats {
    pub inserted: usize,
    pub duplicates: usize,
    pub dead_lettered: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("writing {count} enqueue requests to the outbox: {source}")]
    Db {
        count: usize,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
}

/// What became of an ingested request, as `tidings_ingested_total{result}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingested {
    /// A new outbox row.
    New,
    /// Its dedup key was there already: absorbed.
    Duplicate,
}

impl Ingested {
    pub const ALL: [Ingested; 2] = [Ingested::New, Ingested::Duplicate];

    pub fn as_str(self) -> &'static str {
        match self {
            Ingested::New => "new",
            Ingested::Duplicate => "duplicate",
        }
    }
}

pub struct Ingest {
    stage: Stage,
    partitions: Partitions,
    /// Closed while dispatch is behind ([`crate::admission`]).
    gate: Option<tokio::sync::watch::Receiver<bool>>,
    /// Rung when a batch committed new rows ([`crate::dispatch::Dispatcher::with_wake`]).
    wake: Option<Arc<tokio::sync::Notify>>,
}

impl Ingest {
    pub async fn new(
        pool: PgPool,
        js: jetstream::Context,
        settings: Arc<Settings>,
    ) -> Result<Self, IngestError> {
        let messages = messages_per_call(settings.ingest_batch);
        // A batch is a few hundred messages; the fallback is never taken.
        let max_pending = i64::try_from(messages * 20).unwrap_or(20_000);
        let durable = Durable {
            name: CONSUMER,
            kind: StreamKind::Enqueue,
            filter: None,
            max_ack_pending: max_pending,
            ack_wait: ACK_WAIT,
            shape: Shape::batches(messages, settings.consumer_concurrency),
        };
        let stage = Stage::new(pool, js, settings, durable).await?;
        tidings_runtime::metrics::at_zero(
            &crate::metrics::metrics().ingested,
            Ingested::ALL.map(|result| tidings_runtime::metrics::ResultLabels {
                result: result.as_str().to_owned(),
            }),
        );
        Ok(Ingest {
            stage,
            partitions: Partitions::default(),
            gate: None,
            wake: None,
        })
    }

    /// Rings `wake` whenever a batch committed new rows, so a dispatch loop claims them now
    /// rather than at its next poll.
    pub fn with_wake(mut self, wake: Arc<tokio::sync::Notify>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Takes messages only while `gate` holds `true` (see [`crate::admission`]).
    pub fn with_gate(mut self, gate: Option<tokio::sync::watch::Receiver<bool>>) -> Self {
        self.gate = gate;
        self
    }

    async fn watch_owners(
        &self,
        decoded: &[Incoming<EnqueueRequest>],
    ) -> Result<HashMap<WatchId, DeviceId>, sqlx::Error> {
        let mut ids: Vec<WatchId> = decoded
            .iter()
            .flat_map(|d| d.items.iter().map(|r| r.watch_id))
            .collect();
        ids.sort();
        ids.dedup();
        tidings_store::watches::owners(&self.stage.pool, &ids).await
    }

    /// Stores in the DLQ the requests of `msg` that were refused, when others of it were
    /// inserted; returns whether `msg` may be acked (if the copy could not be stored, it is
    /// redelivered: its inserted requests come back as duplicates, the refused ones are tried
    /// again).
    async fn dead_letter_refused(
        &self,
        msg: &jetstream::Message,
        refused: Vec<(EnqueueRequest, String)>,
    ) -> bool {
        let reason = reasons(&refused);
        let mut requests: Vec<EnqueueRequest> = refused.into_iter().map(|(r, _)| r).collect();
        let payload = if requests.len() == 1 {
            encode(&requests.remove(0))
        } else {
            encode(&EnqueueRequests::new(requests))
        };
        let subjects = &self.stage.settings.subjects;
        match dlq::dead_letter_part(
            &self.stage.js,
            subjects,
            StreamKind::Enqueue,
            msg,
            payload,
            &reason,
        )
        .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(subject = %msg.subject, error = %e, "could not dead-letter the refused requests of a batch; it will be redelivered");
                false
            }
        }
    }
}

/// Messages ingest takes per call, for `TIDINGS_INGEST_BATCH` requests per statement: a twentieth
/// (50 by default). Detectors send up to 50 requests a message, so a call holds about 2,500, and
/// admission (which decides between calls) still steps in thousands of rows, not in the 50,000
/// that as many messages as requests per statement could carry; one by one, 50 requests a call.
pub fn messages_per_call(ingest_batch: usize) -> usize {
    (ingest_batch / 20).max(1)
}

/// The reasons for refused requests, as one dead letter's reason.
fn reasons(refused: &[(EnqueueRequest, String)]) -> String {
    refused
        .iter()
        .map(|(_, why)| why.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why ingest refuses a request whose watch does not exist or belongs to another device.
fn refusal(req: &EnqueueRequest, owners: &HashMap<WatchId, DeviceId>) -> Option<String> {
    match owners.get(&req.watch_id) {
        Some(owner) if *owner == req.device_id => None,
        None => Some(format!("watch {} does not exist", req.watch_id)),
        Some(owner) => Some(format!(
            "watch {} belongs to device {owner}, not {}",
            req.watch_id, req.device_id
        )),
    }
}

impl consume::Handler for Ingest {
    type Item = EnqueueRequest;
    type Done = IngestStats;
    type Error = IngestError;

    fn consumer(&self) -> &Consumer {
        &self.stage.consumer
    }

    fn gate(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.gate.clone()
    }

    /// Decodes, validates and inserts the requests of a batch of messages (each one request or
    /// an `EnqueueRequests` batch), then acks them. On a database error every message is nak'ed
    /// for redelivery and the error returned.
    async fn handle(&self, batch: Decoded<EnqueueRequest>) -> Result<IngestStats, IngestError> {
        let Decoded {
            deliveries: decoded,
            dead_lettered,
        } = batch;
        let mut stats = IngestStats {
            dead_lettered,
            ..IngestStats::default()
        };
        if decoded.is_empty() {
            return Ok(stats);
        }
        let owners = match self.watch_owners(&decoded).await {
            Ok(o) => o,
            Err(source) => {
                consume::nak_all(decoded.iter().map(|d| &d.message)).await;
                return Err(IngestError::Db {
                    count: decoded.len(),
                    source,
                });
            }
        };
        let sorted = self.sort_out(decoded, &owners, &mut stats).await;
        if sorted.valid.is_empty() {
            return Ok(stats);
        }
        let (requests, spans) = traced(&sorted.valid);
        let count = requests.len();
        let result = self.insert(&requests, &spans).await;
        drop(spans);
        drop(requests);
        match result {
            Ok(inserted) => {
                if let Some(wake) = self.wake.as_ref().filter(|_| inserted > 0) {
                    // One permit, kept if no loop is waiting: the loop that finishes its round
                    // next claims at once; a full claim goes on to the rest by itself.
                    wake.notify_one();
                }
                stats.inserted = inserted;
                stats.duplicates = count - inserted;
                self.acknowledge(sorted, &mut stats).await;
                Ok(stats)
            }
            Err(source) => {
                consume::nak_all(sorted.valid.iter().map(|d| &d.message)).await;
                Err(IngestError::Db { count, source })
            }
        }
    }
}

/// A batch's messages after validation.
struct Sorted {
    /// Each message with the requests of it to insert.
    valid: Vec<Incoming<EnqueueRequest>>,
    /// The requests refused from a message otherwise valid (by its index in `valid`): they are
    /// dead-lettered once the rest are committed.
    refused_parts: Vec<(usize, Vec<(EnqueueRequest, String)>)>,
}

impl Ingest {
    /// Splits each message's requests into those to insert and those refused. A message refused
    /// whole is dead-lettered as it is.
    async fn sort_out(
        &self,
        decoded: Vec<Incoming<EnqueueRequest>>,
        owners: &HashMap<WatchId, DeviceId>,
        stats: &mut IngestStats,
    ) -> Sorted {
        let mut sorted = Sorted {
            valid: Vec::new(),
            refused_parts: Vec::new(),
        };
        for Incoming {
            message: msg,
            items: reqs,
        } in decoded
        {
            let (ok, refused) = validate(reqs, owners);
            if ok.is_empty() {
                match dead_letter(
                    &self.stage.js,
                    &self.stage.settings.subjects,
                    StreamKind::Enqueue,
                    &msg,
                    &reasons(&refused),
                )
                .await
                {
                    Ok(()) => stats.dead_lettered += refused.len(),
                    Err(e) => {
                        tracing::error!(subject = %msg.subject, error = %e, "could not dead-letter")
                    }
                }
                continue;
            }
            if !refused.is_empty() {
                sorted.refused_parts.push((sorted.valid.len(), refused));
            }
            sorted.valid.push(Incoming {
                message: msg,
                items: ok,
            });
        }
        sorted
    }

    /// Inserts `requests` (with the traceparent each row stores) in statements of at most
    /// `TIDINGS_INGEST_BATCH` rows, however many requests the messages carry; returns how many
    /// rows are new.
    async fn insert(
        &self,
        requests: &[(&EnqueueRequest, Option<String>)],
        spans: &[tracing::Span],
    ) -> Result<usize, sqlx::Error> {
        let pool = &self.stage.pool;
        let days = requests.iter().map(|(r, _)| r.dedup_day);
        let mut result = self.partitions.ensure(pool, days).await.map(|()| 0);
        for chunk in requests.chunks(self.stage.settings.ingest_batch.max(1)) {
            let Ok(inserted) = result else { break };
            result = insert(pool, chunk).await.map(|n| inserted + n);
        }
        if let Err(e) = &result {
            if tidings_store::partitions::is_missing(e) {
                // A week this process thought was there has been dropped: ask again next time.
                self.partitions.forget();
            }
            telemetry::fail_all(spans, &format!("inserting outbox rows failed: {e}"));
        }
        result
    }

    /// After the insert committed: counts it, dead-letters the refused parts, and acks each
    /// message (or naks one whose refused requests could not be stored, so they come back).
    async fn acknowledge(&self, sorted: Sorted, stats: &mut IngestStats) {
        let m = crate::metrics::metrics();
        for (result, n) in [
            (Ingested::New, stats.inserted),
            (Ingested::Duplicate, stats.duplicates),
        ] {
            m.ingested
                .get_or_create(&ResultLabels {
                    result: result.as_str().into(),
                })
                .inc_by(n as u64);
        }
        let Sorted {
            valid,
            refused_parts,
        } = sorted;
        let mut ack = vec![true; valid.len()];
        for (at, refused) in refused_parts {
            let n = refused.len();
            ack[at] = self.dead_letter_refused(&valid[at].message, refused).await;
            if ack[at] {
                stats.dead_lettered += n;
            }
        }
        let (to_ack, to_nak): (Vec<_>, Vec<_>) = valid.iter().zip(&ack).partition(|(_, ack)| **ack);
        consume::ack_all(to_ack.into_iter().map(|(d, _)| &d.message)).await;
        consume::nak_all(to_nak.into_iter().map(|(d, _)| &d.message)).await;
        if stats.duplicates > 0 {
            tracing::debug!(
                duplicates = stats.duplicates,
                "duplicate enqueue requests absorbed"
            );
        }
    }
}

/// A message's requests: those whose watch exists and is their device's, and the others with
/// why they are refused.
fn validate(
    reqs: Vec<EnqueueRequest>,
    owners: &HashMap<WatchId, DeviceId>,
) -> (Vec<EnqueueRequest>, Vec<(EnqueueRequest, String)>) {
    let mut ok = Vec::with_capacity(reqs.len());
    let mut refused = Vec::new();
    for r in reqs {
        match refusal(&r, owners) {
            None => ok.push(r),
            Some(why) => {
                tracing::warn!(watch_id = %r.watch_id, reason = %why, "dead-lettering enqueue request");
                refused.push((r, why));
            }
        }
    }
    (ok, refused)
}

/// Each request with the traceparent its row stores, and the spans that made them. One span per
/// request, a child of the detection's, so the dispatch of the row continues the same trace. A
/// request in a batch carries its detection's trace itself; one alone, in its message's header.
fn traced(
    valid: &[Incoming<EnqueueRequest>],
) -> (Vec<(&EnqueueRequest, Option<String>)>, Vec<tracing::Span>) {
    let mut spans = Vec::new();
    let requests = valid
        .iter()
        .flat_map(|d| d.items.iter().map(move |req| (d, req)))
        .map(|(d, req)| {
            let (msg, incoming) = (&d.message, d.traceparent(req));
            if !telemetry::exporting() {
                return (req, incoming.map(str::to_owned));
            }
            let span = tracing::info_span!(
                "ingest",
                otel.kind = "consumer",
                messaging.system = "nats",
                messaging.operation.type = "process",
                messaging.destination.name = msg.subject.as_str(),
                messaging.message.id = consume::message_id(msg),
                watch_id = %req.watch_id,
                trigger = %req.trigger,
                channel = req.channel.as_str(),
            );
            telemetry::set_parent(&span, incoming);
            let traceparent = telemetry::forward(&span, incoming);
            spans.push(span);
            (req, traceparent)
        })
        .collect();
    (requests, spans)
}
