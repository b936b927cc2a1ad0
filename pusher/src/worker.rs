//! The pusher's consume loop: PushRequests from a durable JetStream consumer, delivered with up
//! to `concurrency` in flight; for each, a PushResult is published (and stored by JetStream, in a
//! batch with others: [`crate::report`]) before the request is acked, so a crash in between means
//! a redelivery, never a lost result.
//!
//! A message carries one request or a `PushRequests` batch (`TIDINGS_DISPATCH_PUSH_BATCH`). Each
//! request of a batch takes one of the `concurrency` slots a single request takes, so batches
//! never multiply the pushes in flight; the message is acked once every request's result is
//! stored, and handed back whole if any result could not be published (its delivered requests
//! are then found in the delivery log, below). While a batch waits for slots it tells JetStream
//! it is in progress, so its ack wait does not run out and hand it to another pusher.
//!
//! Redelivery safety: a delivered row is recorded in the delivery log
//! ([`tidings_bus::delivered`]) before its result is published. A redelivered request
//! (JetStream's delivery count > 1), or a later attempt of a row, found there is not sent again;
//! `delivered` is reported instead. First deliveries of a first attempt skip the lookup: the
//! dispatcher publishes each (outbox_id, attempt) once, so only a redelivery or a retry can repeat
//! a row.
//!
//! Shutdown: the loop stops pulling, hands back (NAKs) what it pulled but did not start, so
//! another pusher sends it at once, and finishes what is in flight.

use crate::Request;
use async_nats::jetstream::{self, AckKind};
use std::sync::Arc;
use std::time::Duration;
use tidings_bus::consume::{self, Consumer, ConsumerError, Decoded, Durable, Incoming, Shape};
use tidings_bus::delivered::{Delivery, DeliveryLog, DeliveryLogError};
use tidings_bus::streams::require_streams;
use tidings_domain::Channel;
use tidings_domain::messages::{Ended, Outcome, PushResult, Target};
use tidings_domain::subjects::StreamKind;
use tidings_runtime::metrics::{Failure, metrics};
use tidings_runtime::telemetry;
use tokio::sync::Semaphore;

use crate::config::Settings;
use crate::deliver::Deliverer;
use crate::report::Reporter;

/// The web push consumer.
pub const CONSUMER: &str = tidings_bus::streams::consumer_of(StreamKind::Push);
/// The webhook consumer: its own, so each channel has its own slots and backlog.
pub const WEBHOOK_CONSUMER: &str = "pusher-webhook";
/// The email consumer, for the same reason.
pub const EMAIL_CONSUMER: &str = "pusher-email";

/// The durable consumer that takes `channel`'s requests.
pub fn consumer_for(channel: Channel) -> &'static str {
    match channel {
        Channel::WebPush => CONSUMER,
        Channel::Webhook => WEBHOOK_CONSUMER,
        Channel::Email => EMAIL_CONSUMER,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PusherError {
    #[error(transparent)]
    Streams(#[from] tidings_bus::streams::MissingStream),
    #[error(transparent)]
    DeliveryLog(#[from] DeliveryLogError),
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    #[error("HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// How one request was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    Reported(Outcome),
    /// A redelivered request already delivered: reported `delivered` again, not sent.
    AlreadyDelivered,
    DeadLettered,
    /// The result could not be published; the request is left for redelivery.
    Retried,
}

struct Inner {
    settings: Settings,
    /// Shared by the channels' pushers: one HTTP client each for push services and receivers.
    deliverer: Arc<Deliverer>,
    delivered: DeliveryLog,
    reporter: Reporter,
    /// One per push in flight, whatever messages the requests came in.
    slots: Semaphore,
}

#[derive(Clone)]
pub struct Pusher {
    inner: Arc<Inner>,
    consumer: Arc<Consumer>,
    channel: Channel,
}

impl Pusher {
    /// The web push pusher.
    pub async fn new(js: jetstream::Context, settings: Settings) -> Result<Self, PusherError> {
        let deliverer = Arc::new(Deliverer::new(&settings)?);
        Self::for_channel(js, settings, Channel::WebPush, deliverer).await
    }

    /// The pusher of `channel`'s requests, on its own consumer, delivering with `deliverer`.
    pub async fn for_channel(
        js: jetstream::Context,
        settings: Settings,
        channel: Channel,
        deliverer: Arc<Deliverer>,
    ) -> Result<Self, PusherError> {
        require_streams(&js, &settings.subjects).await?;
        crate::metrics::init(channel);
        let delivered = DeliveryLog::new(js.clone(), &settings.subjects, &settings.streams);
        // The dispatcher made it with the streams; the pusher may not.
        delivered.open().await?;
        // Updated on start: a changed ack wait (it follows the HTTP timeout) takes effect.
        let durable = Durable {
            name: consumer_for(channel),
            kind: StreamKind::Push,
            filter: Some(settings.subjects.subject(StreamKind::Push, channel)),
            // Concurrency is a few hundred; the fallback is never taken.
            max_ack_pending: i64::try_from(settings.concurrency * 2).unwrap_or(512),
            ack_wait: settings.ack_wait(),
            shape: Shape::each(settings.concurrency),
        };
        let consumer = Arc::new(Consumer::durable(&js, &settings.subjects, durable).await?);
        let reporter = Reporter::start(
            js.clone(),
            settings.subjects.subject(StreamKind::Result, channel),
        );
        Ok(Pusher {
            inner: Arc::new(Inner {
                reporter,
                slots: Semaphore::new(settings.concurrency.max(1)),
                settings,
                deliverer,
                delivered,
            }),
            consumer,
            channel,
        })
    }

    /// Delivers (or recognises a redelivery of), records and reports each request `msg`
    /// carries, each in a slot of its own.
    async fn deliver_all(
        &self,
        msg: &jetstream::Message,
        mut requests: Vec<Request>,
    ) -> Vec<Handled> {
        let inner = &self.inner;
        let incoming = |req: &Request| consume::traceparent_of(msg, req).map(str::to_owned);
        // Only a redelivery or a retry can repeat a row that was already delivered.
        let redelivered = msg.info().map(|i| i.delivered > 1).unwrap_or(true);
        if requests.len() == 1 {
            let req = requests.remove(0);
            let incoming = incoming(&req);
            return vec![self.push(msg, req, incoming, redelivered).await];
        }
        let pushes = futures::future::join_all(requests.into_iter().map(|req| {
            let incoming = incoming(&req);
            self.push(msg, req, incoming, redelivered)
        }));
        tokio::pin!(pushes);
        let every = inner.settings.ack_wait() / 2;
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                handled = &mut pushes => return handled,
                _ = progress.tick() => {
                    if let Err(e) = msg.ack_with(AckKind::Progress).await {
                        tracing::warn!(subject = %msg.subject, error = %e, "could not extend a batch's ack wait; it may be redelivered, and its delivered requests are found in the delivery log");
                    }
                }
            }
        }
    }

    /// One request, once a slot is free: deliver it (or recognise a redelivery of a delivered
    /// row), record, report.
    async fn push(
        &self,
        msg: &jetstream::Message,
        req: Request,
        incoming: Option<String>,
        redelivered: bool,
    ) -> Handled {
        let inner = &self.inner;
        // A webhook waits for its host first, holding none of the slots others need.
        let _host = inner.deliverer.host_slot(&req).await;
        // The semaphore is never closed; were it, the push would go ahead without a slot.
        let _slot = inner.slots.acquire().await.ok();
        // The push service's host: a span attribute, a metrics label, and part of the attempt's
        // record.
        let host = match &req.target {
            Target::Email(mail) => Some(mail.domain().to_owned()),
            target => reqwest::Url::parse(target.url())
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned)),
        };
        let started_at = chrono::Utc::now();
        let span = push_span(msg, &req, host.as_deref(), incoming.as_deref());
        let (mut result, handled) = self.attempt(&req, redelivered).await;
        // Back to the row's partition (absent from an older dispatcher's request).
        result.dedup_day = req.dedup_day;
        // A digest's other rows: the dispatcher applies the result to each.
        result.members.clone_from(&req.members);
        result.started_at = Some(started_at);
        result.push_host = host.clone();
        finish_span(&span, &result);
        // Push services are a handful of hosts; webhook hosts are as many as clients' endpoints,
        // too many for a label.
        let label = match self.channel {
            Channel::WebPush => host.clone(),
            Channel::Webhook | Channel::Email => Some(self.channel.to_string()),
        };
        if !matches!(handled, Handled::AlreadyDelivered) {
            // A redelivery recognised as already delivered made no request: not counted.
            let trace_id = telemetry::trace_id(&span);
            crate::metrics::observe(self.channel, &result, label, trace_id);
        }
        result.traceparent = telemetry::forward(&span, incoming.as_deref());
        if let Err(e) = inner.reporter.report(result).await {
            metrics().failed(Failure::PublishResult);
            tracing::error!(outbox_id = %req.outbox_id, attempt = req.attempt, error = %e, "could not publish PushResult; request will be redelivered");
            return Handled::Retried;
        }
        handled
    }

    /// Delivers `req`, unless the delivery log says an attempt of its row was delivered already.
    async fn attempt(&self, req: &Request, redelivered: bool) -> (PushResult, Handled) {
        let inner = &self.inner;
        let earlier = if redelivered || req.attempt > 1 || inner.settings.check_every_attempt {
            // Unavailable counts as no record (logged and counted by the log): sending is then
            // what it would have been without the guard.
            inner.delivered.lookup(req.outbox_id).await.ok().flatten()
        } else {
            None
        };
        if let Some(done) = earlier {
            let delivered = Ended::Delivered {
                message_id: done.message_id,
            };
            let result = PushResult {
                error: (done.attempt != req.attempt)
                    .then(|| format!("not sent again: attempt {} was delivered", done.attempt)),
                ..PushResult::new(req.outbox_id, req.attempt, delivered)
            };
            return (result, Handled::AlreadyDelivered);
        }
        let mut r = inner.deliverer.deliver(req).await;
        // A redelivered request the log does not know may still have reached the push service:
        // the pusher that held it before can have died after the service accepted it and before
        // recording it. Not delivering now proves nothing then, whatever this attempt's answer
        // (a subscription gone since, say).
        if redelivered {
            r.ended = r.ended.maybe_arrived();
        }
        if let Ended::Delivered { message_id } = &r.ended {
            let delivery = Delivery {
                attempt: req.attempt,
                message_id: message_id.clone(),
            };
            // Still reported when this fails: the record only narrows the duplicate window, and
            // the failure is logged and counted by the log.
            let _ = inner.delivered.record(req.outbox_id, &delivery).await;
        }
        let handled = Handled::Reported(r.outcome());
        (r, handled)
    }
}

/// The running loop ([`consume::Handler::run`]: deliver until shutdown, then hand back what was
/// pulled but not started and finish what is in flight) hands the pusher one message per call,
/// `concurrency` at a time. Tests take the same path, a call at a time
/// ([`consume::Handler::run_once`]), and read how each request was handled.
impl consume::Handler for Pusher {
    type Item = Request;
    /// How each request of the batch was handled, in order; then one `DeadLettered` for each
    /// message that could not be decoded.
    type Done = Vec<Handled>;
    type Error = PusherError;

    fn consumer(&self) -> &Consumer {
        &self.consumer
    }

    async fn handle(&self, batch: Decoded<Request>) -> Result<Vec<Handled>, Self::Error> {
        let mut done = Vec::new();
        for Incoming { message, items } in batch.deliveries {
            let handled = self.deliver_all(&message, items).await;
            acknowledge(&message, &handled).await;
            done.extend(handled);
        }
        done.extend(std::iter::repeat_n(
            Handled::DeadLettered,
            batch.dead_lettered,
        ));
        Ok(done)
    }
}

/// Acks `msg` once its requests were handled, or naks it for redelivery if a result could not
/// be published.
async fn acknowledge(msg: &jetstream::Message, handled: &[Handled]) {
    if handled.contains(&Handled::Retried) {
        let _ = msg
            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
            .await;
    } else if let Err(e) = msg.ack().await {
        tracing::warn!(subject = %msg.subject, error = %e, "ack failed; a redelivery will be absorbed");
    }
}

/// An HTTP client span for the push service's request, carrying the message it came in (none
/// while traces are not exported).
fn push_span(
    msg: &jetstream::Message,
    req: &Request,
    host: Option<&str>,
    incoming: Option<&str>,
) -> tracing::Span {
    if !telemetry::exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "push",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        otel.status_message = tracing::field::Empty,
        http.request.method = "POST",
        server.address = host.unwrap_or_default(),
        http.response.status_code = tracing::field::Empty,
        messaging.system = "nats",
        messaging.destination.name = msg.subject.as_str(),
        outbox_id = %req.outbox_id,
        // i64: tracing-opentelemetry exports unsigned fields as strings.
        attempt = i64::from(req.attempt),
        channel = req.target.channel().as_str(),
        outcome = tracing::field::Empty,
    );
    telemetry::set_parent(&span, incoming);
    span
}

/// Logs the attempt in its span (so the line carries its notification's trace id) and records
/// its outcome on the span.
fn finish_span(span: &tracing::Span, result: &PushResult) {
    tracing::info!(
        parent: span,
        outbox_id = %result.outbox_id,
        attempt = result.attempt,
        outcome = result.outcome().as_str(),
        http_status = result.http_status,
        latency_ms = result.latency_ms,
        error = result.error.as_deref(),
        "push attempt finished"
    );
    span.record("outcome", result.outcome().as_str());
    if let Some(status) = result.http_status {
        span.record("http.response.status_code", i64::from(status));
    }
    if !matches!(result.outcome(), Outcome::Delivered | Outcome::Gone) {
        span.record("otel.status_code", "ERROR");
        span.record(
            "otel.status_message",
            result.error.as_deref().unwrap_or(result.outcome().as_str()),
        );
    }
}
