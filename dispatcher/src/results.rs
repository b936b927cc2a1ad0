//! Results: apply each PushResult to its row, as a compare-and-set on (id, `sending`, attempt).
//!
//! A message carries one result or a batch of them (`PushResults`, what the pusher sends). Up to
//! 1,000 results are one transaction: the rows are locked (in id order, so concurrent result
//! consumers cannot deadlock), transitions computed by the shared state machine, written with
//! compare-and-set, and — for rows that became `sent` — the baseline advanced to the value that
//! was sent, in the same transaction. A duplicate or stale result (wrong attempt, row already
//! terminal) changes nothing. Messages are acked after the commit.
//!
//! A result is honoured whenever it arrives, as long as its row has not started a newer attempt
//! (see `tidings_domain::outbox`): a `delivered` that comes after the lease sweeper moved the row
//! back to `retry` still ends it `sent`. [`apply_in`] is also how the sweeper applies a delivery
//! it found in the delivery log.

use async_nats::jetstream;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tidings_bus::consume::{self, Consumer, ConsumerError, Decoded, Durable, Incoming, Shape};
use tidings_domain::messages::PushResult;
use tidings_domain::outbox::{self, Status};
use tidings_domain::push;
use tidings_domain::subjects::StreamKind;
use tidings_domain::{Channel, OutboxId, SubscriptionId};
use tidings_runtime::telemetry;

use crate::config::Settings;
use crate::digest;
use crate::resolve::{Said, advance, plan};
use crate::stage::Stage;
use tidings_store::attempts;
use tidings_store::rows::{self, Locked};
use tidings_store::transition::{self, Change};
use tidings_store::{baselines, subscriptions};

pub const CONSUMER: &str = tidings_bus::streams::consumer_of(StreamKind::Result);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResultStats {
    pub applied: usize,
    /// Duplicate or stale results that changed nothing.
    pub ignored: usize,
    pub dead_lettered: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("applying {count} push results: {source}")]
    Db {
        count: usize,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
}

pub struct Results {
    stage: Stage,
}

impl Results {
    pub async fn new(
        pool: PgPool,
        js: jetstream::Context,
        settings: Arc<Settings>,
    ) -> Result<Self, ResultsError> {
        let durable = Durable {
            name: CONSUMER,
            kind: StreamKind::Result,
            filter: None,
            max_ack_pending: 20_000,
            ack_wait: settings.result_ack_wait,
            // 1,000 messages a batch; their results are applied 1,000 to a transaction
            // (`RESULTS_PER_TRANSACTION`), which locks, updates and advances baselines for all
            // of them.
            shape: Shape::batches(1000, settings.consumer_concurrency),
        };
        let stage = Stage::new(pool, js, settings, durable).await?;
        Ok(Results { stage })
    }

    /// Applies results, [`RESULTS_PER_TRANSACTION`] to a transaction; returns how many changed a
    /// row. A message carries up to `MAX_RESULTS_PER_MESSAGE` results, so a pull's worth can be
    /// many times a transaction's. If a later transaction fails, the caller naks every message,
    /// and the redelivery finds the earlier transactions' rows already moved: their results
    /// change nothing the second time.
    async fn apply_all(&self, results: &[&PushResult]) -> Result<usize, sqlx::Error> {
        let mut applied = 0;
        for chunk in results.chunks(RESULTS_PER_TRANSACTION) {
            applied += self.apply(chunk).await?;
        }
        Ok(applied)
    }

    /// Applies results in one transaction; returns how many changed a row.
    pub async fn apply(&self, results: &[&PushResult]) -> Result<usize, sqlx::Error> {
        let mut tx = self.stage.pool.begin().await?;
        let applied = apply_in(&mut tx, &self.stage.settings, results).await?;
        tx.commit().await?;
        applied.observe();
        Ok(applied.count())
    }
}

impl consume::Handler for Results {
    type Item = PushResult;
    type Done = ResultStats;
    type Error = ResultsError;

    fn consumer(&self) -> &Consumer {
        &self.stage.consumer
    }

    async fn handle(&self, batch: Decoded<PushResult>) -> Result<ResultStats, ResultsError> {
        let Decoded {
            deliveries: decoded,
            dead_lettered,
        } = batch;
        let mut stats = ResultStats {
            dead_lettered,
            ..ResultStats::default()
        };
        if decoded.is_empty() {
            return Ok(stats);
        }
        // The last span of a notification's trace: a child of the push that produced the result.
        let spans: Vec<tracing::Span> = if telemetry::exporting() {
            decoded
                .iter()
                .flat_map(|d| d.items.iter().map(move |r| result_span(d, r)))
                .collect()
        } else {
            Vec::new()
        };
        let results: Vec<&PushResult> = decoded.iter().flat_map(|d| &d.items).collect();
        let applied = self.apply_all(&results).await;
        if let Err(e) = &applied {
            telemetry::fail_all(&spans, &format!("applying push results failed: {e}"));
        }
        drop(spans);
        match applied {
            Ok(applied) => {
                stats.applied = applied;
                // A digest's result applies to each of its rows.
                stats.ignored = results.len().saturating_sub(applied);
                consume::ack_all(decoded.iter().map(|d| &d.message)).await;
                Ok(stats)
            }
            Err(source) => {
                consume::nak_all(decoded.iter().map(|d| &d.message)).await;
                Err(ResultsError::Db {
                    count: results.len(),
                    source,
                })
            }
        }
    }
}

/// Results applied in one transaction.
const RESULTS_PER_TRANSACTION: usize = 1000;

/// The span of one result, a child of its push: the trace context is the result's own in a
/// batch, its message's header when it came alone.
fn result_span(d: &Incoming<PushResult>, r: &PushResult) -> tracing::Span {
    let msg = &d.message;
    let span = tracing::info_span!(
        "result",
        otel.kind = "consumer",
        messaging.system = "nats",
        messaging.operation.type = "process",
        messaging.destination.name = msg.subject.as_str(),
        messaging.message.id = consume::message_id(msg),
        outbox_id = %r.outbox_id,
        // i64: tracing-opentelemetry exports unsigned fields as strings.
        attempt = i64::from(r.attempt),
        outcome = r.outcome().as_str(),
        http.response.status_code = r.http_status.map(i64::from),
    );
    telemetry::set_parent(&span, d.traceparent(r));
    span
}

/// What [`apply_in`] changed; [`Applied::observe`] counts it in the metrics once committed.
#[derive(Default)]
pub struct Applied {
    changes: Vec<Change>,
    won: HashSet<OutboxId>,
    /// Detection times of the rows that became `sent`, with their notification's trace id.
    sent_detected_at: Vec<(DateTime<Utc>, Option<String>)>,
}

impl Applied {
    /// Rows the results changed.
    pub fn count(&self) -> usize {
        self.won.len()
    }

    pub fn observe(&self) {
        transition::observe(&self.changes, &self.won);
        let now = Utc::now();
        let latency = &crate::metrics::metrics().detection_to_delivery;
        for (detected_at, trace_id) in &self.sent_detected_at {
            latency.observe(
                (now - *detected_at).as_seconds_f64().max(0.0),
                tidings_runtime::metrics::exemplar(trace_id.clone()),
                None,
            );
        }
    }
}

/// Applies results inside `tx`: rows locked in id order, transitions by compare-and-set, and
/// for rows that became `sent` the baseline advanced to the value that was sent.
pub async fn apply_in(
    tx: &mut PgConnection,
    settings: &Settings,
    results: &[&PushResult],
) -> Result<Applied, sqlx::Error> {
    let members = member_results(results);
    let carried_by = digest::leaders(
        (results.iter())
            .filter(|r| !r.members.is_empty())
            .map(|r| (r.outbox_id, r.members.iter().map(|m| m.id))),
    );
    let with_members: Vec<&PushResult>;
    let results = if members.is_empty() {
        results
    } else {
        with_members = results.iter().copied().chain(&members).collect();
        &with_members
    };
    let locked = lock_rows_of(tx, results).await?;
    let rows: HashMap<OutboxId, &Locked> = locked.iter().map(|l| (l.id, l)).collect();
    let mut planned = plan(results, &rows, settings);
    digest::retry_together(&mut planned.changes, |id| carried_by.get(&id));
    let won = transition::apply(&mut *tx, &planned.changes).await?;
    attempts::insert_new(&mut *tx, &planned.fresh).await?;
    attempts::record(&mut *tx, &planned.late).await?;
    let sent_detected_at = follow_up(tx, &planned.changes, &won, &rows).await?;
    let paced: HashMap<OutboxId, Duration> = (results.iter())
        .filter(|r| push::back_pressure(r.http_status, r.ended.retry_after()))
        .map(|r| {
            let asked = r.ended.retry_after().unwrap_or(0);
            (r.outbox_id, Duration::from_secs(asked))
        })
        .collect();
    let counted = Counted {
        changes: &planned.changes,
        won: &won,
        rows: &rows,
        paced: &paced,
    };
    count_webhook_results(tx, counted, settings).await?;
    Ok(Applied {
        changes: planned.changes,
        won,
        sent_detected_at,
    })
}

/// A digest's result as each of its other rows' own: the same outcome, for their attempt, in
/// their partition. Applied with the leader's in one transaction, so a digest's rows never part.
fn member_results(results: &[&PushResult]) -> Vec<PushResult> {
    (results.iter())
        .flat_map(|r| {
            r.members.iter().map(move |m| PushResult {
                outbox_id: m.id,
                attempt: m.attempt,
                dedup_day: Some(m.day),
                members: Vec::new(),
                ..(*r).clone()
            })
        })
        .collect()
}

/// Locks the rows `results` are about, in id order.
async fn lock_rows_of(
    tx: &mut PgConnection,
    results: &[&PushResult],
) -> Result<Vec<Locked>, sqlx::Error> {
    let mut ids: Vec<OutboxId> = results.iter().map(|r| r.outbox_id).collect();
    ids.sort();
    ids.dedup();
    // The rows' dedup days, when every result carries its own (older pushers' do not): then the
    // lookup reads only those days' partitions instead of every one.
    let mut days: Option<Vec<NaiveDate>> = results.iter().map(|r| r.dedup_day).collect();
    if let Some(days) = &mut days {
        days.sort();
        days.dedup();
    }
    rows::lock(&mut *tx, &ids, days.as_deref()).await
}

/// The changes a batch of results made, as its endpoints' circuits count them.
struct Counted<'a> {
    changes: &'a [Change],
    won: &'a HashSet<OutboxId>,
    rows: &'a HashMap<OutboxId, &'a Locked>,
    /// Rows whose receiver asked to slow down (`push::back_pressure`), with its `Retry-After`.
    paced: &'a HashMap<OutboxId, Duration>,
}

/// Counts a batch's results on their webhook endpoints' health (Web Push rows are skipped here,
/// so their batches pay no statement for it), one observation per endpoint: a delivery closes
/// its circuit, failures count once however many the batch holds, and back-pressure (a `429`, a
/// `503` with `Retry-After`) slows its pace and never counts as a failure
/// (`tidings_domain::receiver`).
async fn count_webhook_results(
    tx: &mut PgConnection,
    counted: Counted<'_>,
    settings: &Settings,
) -> Result<(), sqlx::Error> {
    let mut said: BTreeMap<SubscriptionId, Said> = BTreeMap::new();
    for c in (counted.changes.iter()).filter(|c| counted.won.contains(&c.id)) {
        let Some(sub) = (counted.rows.get(&c.id))
            .filter(|r| r.channel == Channel::Webhook)
            .and_then(|r| r.subscription_id)
        else {
            continue;
        };
        let s = said.entry(sub).or_default();
        if let Some(ra) = counted.paced.get(&c.id) {
            s.slow_down = Some(s.slow_down.map_or(*ra, |d| d.max(*ra)));
            continue;
        }
        match c.transition.to {
            Status::Sent => s.delivered = true,
            Status::Retry | Status::Failed => s.failed = true,
            // Neither a delivery nor a failure of the endpoint: a row dropped (gone, expired,
            // recalled) or not moved. Named, so a new state must say which it is.
            Status::Dropped | Status::Pending | Status::Sending => {}
        }
    }
    let ids: Vec<SubscriptionId> = said.keys().copied().collect();
    let now = Utc::now();
    let (breaker, pacing) = (settings.webhook_breaker, settings.webhook_pacing);
    let (mut health, mut closed) = (Vec::new(), Vec::new());
    for (sub, before) in subscriptions::lock_health(&mut *tx, &ids).await? {
        let Some(s) = said.get(&sub) else { continue };
        let circuit = breaker.observe(before.circuit, s.observed(), now);
        let pace = match s.slow_down {
            Some(ra) => pacing.slow_down(before.pace, ra, now),
            None if s.delivered => pacing.speed_up(before.pace),
            None => before.pace,
        };
        if circuit.opens > before.circuit.opens {
            tracing::warn!(subscription_id = %sub, failures = circuit.failures, opens = circuit.opens, open_until = ?circuit.open_until, "webhook endpoint failing: its circuit is open and its rows are held back");
        } else if circuit.opens == 0 && before.circuit.opens > 0 {
            tracing::info!(subscription_id = %sub, "webhook endpoint delivers again: its circuit is closed");
            closed.push(sub);
        }
        if pace.per_second != before.pace.per_second {
            tracing::info!(subscription_id = %sub, per_second = ?pace.per_second, until = ?pace.until, "webhook endpoint's pace changed");
        }
        let after = subscriptions::Health { circuit, pace };
        if after != before {
            health.push((sub, after));
        }
    }
    subscriptions::write_health(&mut *tx, &health, &closed).await
}

/// What follows from the changes that won: baselines advance for rows that became `sent`, and
/// subscriptions a push service said are gone are deactivated. Returns the detection time (and
/// trace) of each row sent.
async fn follow_up(
    tx: &mut PgConnection,
    changes: &[Change],
    won: &HashSet<OutboxId>,
    rows: &HashMap<OutboxId, &Locked>,
) -> Result<Vec<(DateTime<Utc>, Option<String>)>, sqlx::Error> {
    let mut advanced = Vec::new();
    let mut gone_subs = Vec::new();
    let mut sent_detected_at = Vec::new();
    for c in changes.iter().filter(|c| won.contains(&c.id)) {
        let Some(row) = rows.get(&c.id) else { continue };
        if c.transition.to == Status::Sent {
            let trace_id = row.traceparent.as_deref().and_then(telemetry::trace_id_of);
            sent_detected_at.push((row.detected_at, trace_id));
        }
        if c.transition.advances_baseline
            && let Some(Json(sent)) = &row.sent_value
        {
            advanced.push(advance(row, sent));
        }
        let gone = Some(outbox::Reason::Dropped(
            outbox::DropReason::SubscriptionGone,
        ));
        if c.transition.reason == gone
            && let Some(sub) = row.subscription_id
        {
            gone_subs.push(sub);
        }
    }
    baselines::advance(&mut *tx, &advanced, Utc::now()).await?;
    subscriptions::deactivate_gone(&mut *tx, &gone_subs).await?;
    Ok(sent_detected_at)
}
