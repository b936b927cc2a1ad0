//! The messages services exchange over JetStream (docs/design.md, "Messages").
//!
//! JSON with a `v` schema version; unknown fields are ignored so a newer producer can add fields
//! without breaking an older consumer. A message that fails [`decode`] is dead-lettered by the
//! consumer, never retried.

use crate::WatchId;
use crate::dedup::DedupKey;
use crate::names::names;
use crate::trigger::{Baseline, Observation, Trigger};
use crate::withdrawal::Announces;
use crate::{Channel, DeviceId, OutboxId};
use chrono::{DateTime, NaiveDate, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod flat;
mod raw;
mod result;
pub use raw::RawPayload;
pub use result::{Ended, PushResult};

/// The schema version this build writes and reads.
pub const VERSION: u32 = 1;

/// Why a message could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not valid JSON for this message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("schema version {got} is not supported (this build reads {VERSION})")]
    Version { got: u32 },
    #[error("invalid message: {0}")]
    Invalid(String),
}

/// A message with a schema version and its own validity rules.
pub trait Message: Serialize + DeserializeOwned {
    fn version(&self) -> u32;
    fn validate(&self) -> Result<(), DecodeError> {
        Ok(())
    }
}

pub fn encode<M: Message>(message: &M) -> Vec<u8> {
    // Serializing these plain structs cannot fail: no maps with non-string keys, no custom
    // serializers that error.
    serde_json::to_vec(message).unwrap_or_default()
}

pub fn decode<M: Message>(bytes: &[u8]) -> Result<M, DecodeError> {
    let m: M = serde_json::from_slice(bytes)?;
    if m.version() != VERSION {
        return Err(DecodeError::Version { got: m.version() });
    }
    m.validate()?;
    Ok(m)
}

/// Detector → dispatcher: a trigger held for a watch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnqueueRequest {
    pub v: u32,
    pub watch_id: WatchId,
    pub device_id: DeviceId,
    pub trigger: Trigger,
    pub channel: Channel,
    pub detected_at: DateTime<Utc>,
    /// The observation that made the trigger hold: the immutable detection snapshot.
    pub detected: Observation,
    /// The baseline the trigger was evaluated against.
    #[serde(default)]
    pub baseline: Baseline,
    /// Calendar day of `detected_at` in the device's time zone; for a withdrawal, the withdrawn
    /// row's day (so a sent row is withdrawn at most once).
    pub dedup_day: NaiveDate,
    /// The `sent` row this request withdraws ([`crate::withdrawal`]): its trigger stopped holding
    /// at `detected`, against `baseline`, the one the row was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraws: Option<OutboxId>,
    /// The W3C trace context of the detection span, in an [`EnqueueRequests`] batch (whose one
    /// header cannot carry every request's). A request alone carries it as its message's header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl EnqueueRequest {
    /// What the row it makes tells its reader: the trigger holds, or (a withdrawal) has ended.
    pub fn announces(&self) -> Announces {
        match self.withdraws {
            None => Announces::Holds(self.trigger.clone()),
            Some(_) => Announces::Ended(self.trigger.clone()),
        }
    }

    pub fn dedup_key(&self) -> DedupKey {
        DedupKey {
            watch_id: self.watch_id,
            trigger: self.announces().key(),
            dedup_day: self.dedup_day,
            channel: self.channel,
        }
    }
}

impl Message for EnqueueRequest {
    fn version(&self) -> u32 {
        self.v
    }

    fn validate(&self) -> Result<(), DecodeError> {
        self.trigger
            .validate()
            .map_err(|e| DecodeError::Invalid(e.to_string()))?;
        // Every time zone is within a day of UTC; a day further off is a producer bug.
        let utc_day = self.detected_at.date_naive();
        let off = (self.dedup_day - utc_day).num_days().abs();
        if off > 1 {
            return Err(DecodeError::Invalid(format!(
                "dedup_day {} is {off} days from detected_at {}",
                self.dedup_day, self.detected_at
            )));
        }
        Ok(())
    }
}

/// Several requests of one kind in one message, `{"v": 1, "requests": [...]}`, so a message's
/// cost in JetStream (store, deliver, ack, its duplicate-window entry) is paid once per batch
/// rather than once per request: [`EnqueueRequests`] (detector → dispatcher) and
/// [`PushRequests`] (dispatcher → pusher).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch<T> {
    pub v: u32,
    pub requests: Vec<T>,
}

/// A request that may travel in a [`Batch`], and how many one batch may carry.
pub trait Batched: Message {
    const MAX_PER_MESSAGE: usize;
}

impl<T> Batch<T> {
    pub fn new(requests: Vec<T>) -> Self {
        Batch {
            v: VERSION,
            requests,
        }
    }
}

impl<T: Batched> Message for Batch<T> {
    fn version(&self) -> u32 {
        self.v
    }

    /// 1 to `T::MAX_PER_MESSAGE` requests, each of this build's version and valid (one that is
    /// not makes the whole batch invalid).
    fn validate(&self) -> Result<(), DecodeError> {
        let n = self.requests.len();
        if n == 0 || n > T::MAX_PER_MESSAGE {
            return Err(DecodeError::Invalid(format!(
                "a batch carries 1 to {} requests, not {n}",
                T::MAX_PER_MESSAGE
            )));
        }
        if let Some(r) = self.requests.iter().find(|r| r.version() != VERSION) {
            return Err(DecodeError::Version { got: r.version() });
        }
        self.requests.iter().try_for_each(Message::validate)
    }
}

/// The requests a message carries: a [`Batch`], or one request alone (the only shape producers
/// before batches send). Which of the two is read from whether the object has `requests`.
pub fn decode_batched<T: Batched>(bytes: &[u8]) -> Result<Vec<T>, DecodeError> {
    #[derive(Deserialize)]
    struct Shape {
        #[serde(default)]
        requests: Option<serde::de::IgnoredAny>,
    }
    // Looking for the key reads the whole message once more, a fifth of a pusher's decode; a
    // batch as serde writes it says what it is in its first bytes.
    let batch =
        written_as_batch(bytes) || serde_json::from_slice::<Shape>(bytes)?.requests.is_some();
    if batch {
        Ok(decode::<Batch<T>>(bytes)?.requests)
    } else {
        Ok(vec![decode::<T>(bytes)?])
    }
}

/// Whether `bytes` begin as serde writes a [`Batch`]: `{"v":<digits>,"requests":[`.
fn written_as_batch(bytes: &[u8]) -> bool {
    let Some(rest) = bytes.strip_prefix(b"{\"v\":") else {
        return false;
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    digits > 0 && rest[digits..].starts_with(b",\"requests\":[")
}

/// Detector → dispatcher: the triggers a scan round found, in one message.
pub type EnqueueRequests = Batch<EnqueueRequest>;

/// The most requests one [`EnqueueRequests`] may carry; the detector's batch setting is capped
/// here, so one message never holds more than one ingest statement's worth.
pub const MAX_ENQUEUES_PER_MESSAGE: usize = 100;

impl Batched for EnqueueRequest {
    const MAX_PER_MESSAGE: usize = MAX_ENQUEUES_PER_MESSAGE;
}

impl EnqueueRequests {
    /// `Nats-Msg-Id`: the first request's dedup key, the count, and a hash of every key. A
    /// publish retried after a lost ack carries the same keys and so the same id, and JetStream's
    /// duplicate window drops it; a batch of other keys cannot be taken for it. (The same key in
    /// a differently made batch, after a restart, is stored again and absorbed by the outbox's
    /// unique key.)
    pub fn msg_id(&self) -> String {
        use sha2::Digest;
        let Some(first) = self.requests.first() else {
            return String::new();
        };
        // SHA-256, whose output its specification fixes: every process of every release makes
        // the same id for the same keys (std's DefaultHasher may change between Rust releases,
        // so a rolling upgrade could have made new ids for old batches).
        let mut h = sha2::Sha256::new();
        for r in &self.requests {
            h.update(r.dedup_key().to_string().as_bytes());
            h.update(b"\n");
        }
        let digest = h.finalize();
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}+{}#{hex}", first.dedup_key(), self.requests.len())
    }
}

/// The requests a message on the enqueue stream carries: an [`EnqueueRequests`] batch, or one
/// [`EnqueueRequest`] (what detectors send for a trigger found alone, and all that detectors
/// before batches send).
pub fn decode_enqueues(bytes: &[u8]) -> Result<Vec<EnqueueRequest>, DecodeError> {
    decode_batched(bytes)
}

/// Where a push goes: a browser's `PushSubscription`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    pub endpoint: String,
    /// The user agent's P-256 public key, base64url.
    pub p256dh: String,
    /// The 16-byte auth secret, base64url.
    pub auth: String,
}

/// Where one request goes: a browser's push subscription, or a signed webhook call. On the wire
/// it is the request's `subscription` or `webhook` object (a web push request has the shape it
/// always had).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    #[serde(rename = "subscription")]
    WebPush(Subscription),
    #[serde(rename = "webhook")]
    Webhook(WebhookCall),
    #[serde(rename = "mail")]
    Email(MailCall),
}

impl Target {
    pub fn channel(&self) -> Channel {
        match self {
            Target::WebPush(_) => Channel::WebPush,
            Target::Webhook(_) => Channel::Webhook,
            Target::Email(_) => Channel::Email,
        }
    }

    /// Where the request goes: a URL, or a mail's address.
    pub fn url(&self) -> &str {
        match self {
            Target::WebPush(s) => &s.endpoint,
            Target::Webhook(w) => &w.url,
            Target::Email(m) => &m.to,
        }
    }
}

/// A mail as the dispatcher wrote and DKIM-signed it: the pusher submits `message` to the
/// relay for `to`, with `from` as the envelope sender, and holds no key itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailCall {
    /// The envelope sender (the bounce address).
    pub from: String,
    pub to: String,
    /// The whole message (RFC 5322), headers and the DKIM signature included: 7-bit text with
    /// CRLF line ends, as composed.
    pub message: String,
}

impl MailCall {
    /// The recipient's domain: the per-destination concurrency key.
    pub fn domain(&self) -> &str {
        self.to.rsplit_once('@').map_or("", |(_, d)| d)
    }
}

/// A webhook as the dispatcher signed it (Standard Webhooks): the pusher posts `body` to `url`
/// with `webhook-id` (the outbox row's id), `webhook-timestamp` and `webhook-signature` as given,
/// and holds no secret itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookCall {
    pub url: String,
    /// Unix seconds the signature covers.
    pub timestamp: i64,
    /// `v1,<base64>` for each signing secret, space-separated.
    pub signature: String,
    /// The JSON body, exactly as signed.
    pub body: String,
}

/// What the user sees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "flat::FlatPayload")]
pub struct Payload {
    pub title: String,
    pub body: String,
    /// The notification's outbox row: what the service worker asks the api about when it shows
    /// it, and what a click hands the page. Rows rendered before it existed have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<OutboxId>,
    /// The notification's tag: its watch and trigger ([`crate::validity::tag`]), so a browser
    /// shows a newer notification of the same watch, or a redelivery, in place of the older one.
    /// Rows rendered by earlier releases carry their row id, or no tag at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// When the value the text states was observed (the re-check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<DateTime<Utc>>,
    /// Until when the text may be shown as current ([`crate::validity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<DateTime<Utc>>,
    /// Set on a withdrawal ([`crate::withdrawal`]): the notification it replaces, whose tag it
    /// carries. It says what changed when it was sent and is shown as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraws: Option<OutboxId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default)]
    pub data: serde_json::Value,
    /// The same notification in the Declarative Web Push format (`web_push: 8030`), which Safari
    /// (iOS and macOS 18.4+) shows without running the service worker; `mutable` lets a service
    /// worker that does run correct it. Absent when there is no page to open (`navigate` is
    /// required).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub declarative: Option<Declarative>,
}

/// The Declarative Web Push envelope (WebKit's format): `{"web_push": 8030, "notification":
/// {...}, "mutable": true}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Declarative {
    /// The format's magic number, always [`Declarative::WEB_PUSH`].
    pub web_push: u16,
    pub notification: DeclarativeNotification,
    /// Whether a service worker may change the notification before it is shown.
    pub mutable: bool,
}

impl Declarative {
    pub const WEB_PUSH: u16 = 8030;
}

/// The notification of a [`Declarative`] push, in the format's own keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeclarativeNotification {
    pub title: String,
    pub body: String,
    /// The page a click opens (required by the format).
    pub navigate: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// BCP 47 language of the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
    /// Unix milliseconds of the value the text states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
}

impl Payload {
    /// A notification with a title and a body and nothing else, for callers to add to.
    pub fn new(title: impl Into<String>, body: impl Into<String>) -> Self {
        Payload {
            title: title.into(),
            body: body.into(),
            id: None,
            tag: None,
            observed_at: None,
            valid_until: None,
            withdraws: None,
            url: None,
            data: serde_json::Value::Null,
            declarative: None,
        }
    }
}

names! {
    /// Web Push `Urgency` (RFC 8030 §5.3).
    pub enum Urgency("urgency") {
        VeryLow = "very-low",
        Low = "low",
        Normal = "normal",
        High = "high",
    }
}

/// Dispatcher → pusher: everything needed to deliver, so the pusher needs no database. Its
/// payload is a [`Payload`] where one is built or read field by field (tests, benches), and a
/// [`RawPayload`] where it is only passed on ([`RawPushRequest`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "flat::FlatPushRequest<P>")]
pub struct PushRequest<P = Payload> {
    pub v: u32,
    pub outbox_id: OutboxId,
    pub attempt: u32,
    /// The pusher refuses (reports `expired`) a request it starts after this instant; the
    /// dispatcher's lease outlives it, which is what makes the lease sweeper safe.
    pub deadline: DateTime<Utc>,
    #[serde(flatten)]
    pub target: Target,
    pub payload: P,
    /// Seconds the push service may hold the message for an offline device.
    pub ttl: u32,
    pub urgency: Urgency,
    pub topic: String,
    /// The row's dedup day (its outbox partition's key), carried back in the result so the
    /// result finds its row in one partition. Older dispatchers omit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_day: Option<NaiveDate>,
    /// For a withdrawal: the push service's message resource (`Location`) of the notification it
    /// withdraws. The pusher first asks the push service to delete it (RFC 8030 §6.3): if that
    /// message was still waiting for its device, the device never sees it and the withdrawal is
    /// not sent ([`Outcome::Recalled`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<String>,
    /// The W3C trace context of the dispatch span, in a [`PushRequests`] batch (whose one header
    /// cannot carry every request's). A request alone carries it as its message's header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// For a digest: the other rows this one message carries (this request's row leads it).
    /// The pusher hands them back in the result, which the dispatcher applies to each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<Member>,
}

/// A row a digest carries besides its leader: its attempt, and its partition's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: OutboxId,
    pub attempt: u32,
    pub day: NaiveDate,
}

/// The most rows one digest carries; a reader with more due at once gets another digest.
pub const MAX_DIGEST_MEMBERS: usize = 100;

impl<P> PushRequest<P> {
    /// `Nats-Msg-Id`: one message per (row, attempt).
    pub fn msg_id(&self) -> String {
        format!("{}:{}", self.outbox_id, self.attempt)
    }
}

/// A request whose payload is its JSON text: the dispatcher renders a notification into it once
/// (a row sent alone stores that text), and the pusher encrypts those bytes as they came.
pub type RawPushRequest = PushRequest<RawPayload>;

/// Dispatcher → pusher: a cycle's requests, in one message.
pub type PushRequests = Batch<PushRequest>;

/// The most requests one [`PushRequests`] may carry. The dispatcher sends far fewer (its setting
/// is capped here); the bound keeps one message from holding a pusher's every slot and its
/// ack for long.
pub const MAX_REQUESTS_PER_MESSAGE: usize = 100;

impl<P: Serialize + DeserializeOwned> Batched for PushRequest<P> {
    const MAX_PER_MESSAGE: usize = MAX_REQUESTS_PER_MESSAGE;
}

impl<P> Batch<PushRequest<P>> {
    /// `Nats-Msg-Id`: the first request's (row, attempt) and the count. A (row, attempt) is
    /// published once, in one batch, so this names the batch as uniquely as a single request's
    /// id names it.
    pub fn msg_id(&self) -> String {
        match self.requests.first() {
            Some(first) => format!("{}+{}", first.msg_id(), self.requests.len()),
            None => String::new(),
        }
    }
}

/// The requests a message on the push stream carries: a [`PushRequests`] batch, or one
/// [`PushRequest`] (what dispatchers send unless `TIDINGS_DISPATCH_PUSH_BATCH` says otherwise).
pub fn decode_requests(bytes: &[u8]) -> Result<Vec<PushRequest>, DecodeError> {
    decode_batched(bytes)
}

impl<P: Serialize + DeserializeOwned> Message for PushRequest<P> {
    fn version(&self) -> u32 {
        self.v
    }

    fn validate(&self) -> Result<(), DecodeError> {
        if self.attempt == 0 {
            return Err(DecodeError::Invalid("attempt must be at least 1".into()));
        }
        if self.members.len() >= MAX_DIGEST_MEMBERS {
            return Err(DecodeError::Invalid(format!(
                "a digest carries at most {MAX_DIGEST_MEMBERS} rows, not {}",
                self.members.len() + 1
            )));
        }
        if self.topic.len() > crate::validity::MAX_TOPIC_LEN {
            return Err(DecodeError::Invalid(format!(
                "topic is {} characters; Web Push allows 32",
                self.topic.len()
            )));
        }
        Ok(())
    }
}

names! {
    /// How a push attempt ended.
    pub enum Outcome("push outcome") {
        /// 2xx: the push service accepted it.
        Delivered = "delivered",
        /// 429, 5xx, timeouts, connection errors: try again later. With
        /// [`Ended::Transient::maybe_delivered`] the request may have reached the push service all the same.
        Transient = "transient",
        /// 404, 410: the subscription no longer exists.
        Gone = "gone",
        /// 400, 401, 403, 413, or a refused endpoint: trying again will not help.
        Permanent = "permanent",
        /// The request reached the pusher after its deadline, or after its notification's
        /// validity ran out ([`Ended::Expired::outlived`]), and was not sent.
        Expired = "expired",
        /// A withdrawal that was not sent because the push service deleted the message it
        /// withdraws before the device fetched it ([`PushRequest::recall`]).
        Recalled = "recalled",
    }
}

names! {
    /// How a recorded attempt ended: the pusher's [`Outcome`], or no result at all before the
    /// row's lease ran out (the sweeper's record, replaced if the real result turns up). Only the
    /// outbox's records carry `LeaseExpired`; no pusher reports it.
    pub enum AttemptOutcome("attempt outcome") {
        Delivered = "delivered",
        Transient = "transient",
        Gone = "gone",
        Permanent = "permanent",
        Expired = "expired",
        Recalled = "recalled",
        LeaseExpired = "lease_expired",
    }
}

impl From<Outcome> for AttemptOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Delivered => AttemptOutcome::Delivered,
            Outcome::Transient => AttemptOutcome::Transient,
            Outcome::Gone => AttemptOutcome::Gone,
            Outcome::Permanent => AttemptOutcome::Permanent,
            Outcome::Expired => AttemptOutcome::Expired,
            Outcome::Recalled => AttemptOutcome::Recalled,
        }
    }
}

/// Pusher → dispatcher: several results in one message, so a message's cost in JetStream (store,
/// deliver, ack) is paid once per batch rather than once per push.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PushResults {
    pub v: u32,
    pub results: Vec<PushResult>,
}

/// The most results one [`PushResults`] may carry: what a pusher sends stays far below it, and a
/// bound keeps one message from growing one of the dispatcher's transactions without limit.
pub const MAX_RESULTS_PER_MESSAGE: usize = 1000;

impl PushResults {
    pub fn new(results: Vec<PushResult>) -> Self {
        PushResults {
            v: VERSION,
            results,
        }
    }
}

impl Message for PushResults {
    fn version(&self) -> u32 {
        self.v
    }

    fn validate(&self) -> Result<(), DecodeError> {
        if self.results.is_empty() || self.results.len() > MAX_RESULTS_PER_MESSAGE {
            return Err(DecodeError::Invalid(format!(
                "a batch carries 1 to {MAX_RESULTS_PER_MESSAGE} results, not {}",
                self.results.len()
            )));
        }
        match self.results.iter().find(|r| r.v != VERSION) {
            Some(r) => Err(DecodeError::Version { got: r.v }),
            None => self.results.iter().try_for_each(PushResult::validate),
        }
    }
}

/// The results a message on the result stream carries: a [`PushResults`] batch, or one
/// [`PushResult`] (what pushers before batching sent, and the sweeper's shape).
pub fn decode_results(bytes: &[u8]) -> Result<Vec<PushResult>, DecodeError> {
    /// Which of the two a message is, read without building either.
    #[derive(Deserialize)]
    struct Shape {
        #[serde(default)]
        results: Option<serde::de::IgnoredAny>,
    }
    let shape: Shape = serde_json::from_slice(bytes)?;
    if shape.results.is_some() {
        Ok(decode::<PushResults>(bytes)?.results)
    } else {
        Ok(vec![decode::<PushResult>(bytes)?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn enqueue() -> EnqueueRequest {
        let detected_at = Utc.with_ymd_and_hms(2026, 11, 30, 23, 30, 0).unwrap();
        EnqueueRequest {
            v: VERSION,
            watch_id: WatchId::new(),
            device_id: DeviceId::new(),
            trigger: Trigger::PriceBelow { threshold: 1200 },
            channel: Channel::WebPush,
            detected_at,
            detected: Observation::on_sale(1100, "EUR", detected_at),
            baseline: Baseline::default(),
            dedup_day: NaiveDate::from_ymd_opt(2026, 12, 1).unwrap(),
            withdraws: None,
            traceparent: None,
        }
    }

    #[test]
    fn round_trips_and_ignores_unknown_fields() {
        let m = enqueue();
        let mut json: serde_json::Value = serde_json::from_slice(&encode(&m)).unwrap();
        json["added_in_v1_1"] = serde_json::json!("ignored");
        let back: EnqueueRequest = decode(&serde_json::to_vec(&json).unwrap()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn rejects_other_versions_garbage_and_invalid_content() {
        let mut m = enqueue();
        m.v = 2;
        assert!(matches!(
            decode::<EnqueueRequest>(&encode(&m)),
            Err(DecodeError::Version { got: 2 })
        ));
        assert!(matches!(
            decode::<EnqueueRequest>(b"{not json"),
            Err(DecodeError::Json(_))
        ));
        let mut m = enqueue();
        m.trigger = Trigger::PriceDrop { percent: 0 };
        assert!(matches!(
            decode::<EnqueueRequest>(&encode(&m)),
            Err(DecodeError::Invalid(_))
        ));
        let mut m = enqueue();
        m.dedup_day = NaiveDate::from_ymd_opt(2026, 12, 5).unwrap();
        assert!(matches!(
            decode::<EnqueueRequest>(&encode(&m)),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn enqueues_decode_from_a_batch_or_alone() {
        let mut traced = enqueue();
        traced.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        let batch = vec![enqueue(), traced];
        let decoded = decode_enqueues(&encode(&EnqueueRequests::new(batch.clone()))).unwrap();
        assert_eq!(decoded, batch);
        let one = enqueue();
        assert_eq!(decode_enqueues(&encode(&one)).unwrap(), vec![one]);
    }

    #[test]
    fn enqueue_batches_are_bounded_versioned_and_checked_whole() {
        assert!(matches!(
            decode_enqueues(&encode(&EnqueueRequests::new(Vec::new()))),
            Err(DecodeError::Invalid(_))
        ));
        let too_many = vec![enqueue(); MAX_ENQUEUES_PER_MESSAGE + 1];
        assert!(matches!(
            decode_enqueues(&encode(&EnqueueRequests::new(too_many))),
            Err(DecodeError::Invalid(_))
        ));
        let most = vec![enqueue(); MAX_ENQUEUES_PER_MESSAGE];
        assert_eq!(
            decode_enqueues(&encode(&EnqueueRequests::new(most)))
                .unwrap()
                .len(),
            MAX_ENQUEUES_PER_MESSAGE
        );
        let mut newer = enqueue();
        newer.v = VERSION + 1;
        assert!(matches!(
            decode_enqueues(&encode(&EnqueueRequests::new(vec![enqueue(), newer]))),
            Err(DecodeError::Version { .. })
        ));
        let mut invalid = enqueue();
        invalid.trigger = Trigger::PriceDrop { percent: 0 };
        assert!(matches!(
            decode_enqueues(&encode(&EnqueueRequests::new(vec![enqueue(), invalid]))),
            Err(DecodeError::Invalid(_))
        ));
        assert!(matches!(
            decode_enqueues(b"{\"v\":1,\"requests\":7}"),
            Err(DecodeError::Json(_))
        ));
    }

    #[test]
    fn an_enqueue_batch_id_names_its_keys() {
        let (a, b, c) = (enqueue(), enqueue(), enqueue());
        let ab = EnqueueRequests::new(vec![a.clone(), b.clone()]);
        assert_eq!(
            ab.msg_id(),
            EnqueueRequests::new(vec![a.clone(), b.clone()]).msg_id(),
            "a retried publish is the same message"
        );
        assert!(ab.msg_id().starts_with(&format!("{}+2#", a.dedup_key())));
        // Same first key, same count, another second key: another message.
        assert_ne!(ab.msg_id(), EnqueueRequests::new(vec![a, c]).msg_id());
    }

    /// The id is pinned: a detector of another build (or Rust release) must name the same batch
    /// the same way, or JetStream's duplicate window would store a retried publish twice.
    #[test]
    fn an_enqueue_batch_id_is_the_same_in_every_build() {
        let with_watch = |n: u128| EnqueueRequest {
            watch_id: WatchId(uuid::Uuid::from_u128(n)),
            ..enqueue()
        };
        let batch = EnqueueRequests::new(vec![with_watch(1), with_watch(2)]);
        // The first 8 bytes of SHA-256 over "<key>\n" per request, as Python's hashlib computes
        // them for these two keys.
        assert_eq!(
            batch.msg_id(),
            "00000000-0000-0000-0000-000000000001:price_below:1200:2026-12-01:web_push+2#37a591747b1aea83"
        );
    }

    #[test]
    fn an_attempt_outcome_is_named_as_the_pushers_outcome_or_lease_expired() {
        for o in [
            Outcome::Delivered,
            Outcome::Transient,
            Outcome::Gone,
            Outcome::Permanent,
            Outcome::Expired,
        ] {
            let a = AttemptOutcome::from(o);
            assert_eq!(a.as_str(), o.as_str());
            assert_eq!(serde_json::to_value(a).unwrap(), o.as_str());
        }
        let lease = AttemptOutcome::LeaseExpired;
        assert_eq!(serde_json::to_value(lease).unwrap(), lease.as_str());
        assert_eq!(lease.as_str(), "lease_expired");
    }

    fn result(attempt: u32) -> PushResult {
        PushResult {
            http_status: Some(201),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            ..PushResult::new(OutboxId::new(), attempt, Ended::of(Outcome::Delivered))
        }
    }

    #[test]
    fn results_decode_from_a_batch_or_alone() {
        let batch = vec![result(1), result(2)];
        let decoded = decode_results(&encode(&PushResults::new(batch.clone()))).unwrap();
        assert_eq!(decoded, batch);
        let one = result(3);
        assert_eq!(decode_results(&encode(&one)).unwrap(), vec![one]);
    }

    #[test]
    fn results_batches_are_bounded_and_versioned() {
        assert!(matches!(
            decode_results(&encode(&PushResults::new(Vec::new()))),
            Err(DecodeError::Invalid(_))
        ));
        let too_many = vec![result(1); MAX_RESULTS_PER_MESSAGE + 1];
        assert!(matches!(
            decode_results(&encode(&PushResults::new(too_many))),
            Err(DecodeError::Invalid(_))
        ));
        let mut newer = result(1);
        newer.v = 2;
        assert!(matches!(
            decode_results(&encode(&PushResults::new(vec![result(1), newer]))),
            Err(DecodeError::Version { got: 2 })
        ));
        assert!(matches!(
            decode_results(b"{\"v\":1,\"results\":7}"),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(decode_results(b"[1]"), Err(DecodeError::Json(_))));
        // A digest's result names at most the rows a digest carries, alone or in a batch.
        let member = Member {
            id: OutboxId::new(),
            attempt: 1,
            day: NaiveDate::from_ymd_opt(2026, 12, 5).unwrap(),
        };
        let digest = |n: usize| PushResult {
            members: vec![member; n],
            ..result(1)
        };
        let largest = digest(MAX_DIGEST_MEMBERS - 1);
        assert_eq!(decode_results(&encode(&largest)).unwrap(), vec![largest]);
        let oversized = digest(MAX_DIGEST_MEMBERS);
        assert!(matches!(
            decode_results(&encode(&oversized)),
            Err(DecodeError::Invalid(_))
        ));
        assert!(matches!(
            decode_results(&encode(&PushResults::new(vec![result(1), oversized]))),
            Err(DecodeError::Invalid(_))
        ));
    }

    fn request(attempt: u32) -> PushRequest {
        let outbox_id = OutboxId::new();
        PushRequest {
            v: VERSION,
            outbox_id,
            attempt,
            deadline: Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 5).unwrap(),
            target: Target::WebPush(Subscription {
                endpoint: "https://push.example/s/1".into(),
                p256dh: "BK".into(),
                auth: "AA".into(),
            }),
            payload: Payload {
                id: Some(outbox_id),
                ..Payload::new("SKU-1", "Now 10.50")
            },
            ttl: 3600,
            urgency: Urgency::High,
            topic: crate::validity::topic(WatchId::new(), &Trigger::BackInStock),
            dedup_day: NaiveDate::from_ymd_opt(2026, 12, 1),
            recall: None,
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            members: Vec::new(),
        }
    }

    #[test]
    fn a_web_push_request_keeps_its_wire_shape_and_a_webhook_has_its_own() {
        let push = request(1);
        let json: serde_json::Value = serde_json::from_slice(&encode(&push)).unwrap();
        // What pushers before webhooks read.
        assert_eq!(json["subscription"]["endpoint"], "https://push.example/s/1");
        assert!(json.get("webhook").is_none() && json.get("target").is_none());
        let hook = PushRequest {
            target: Target::Webhook(WebhookCall {
                url: "https://hooks.example/in".into(),
                timestamp: 1_700_000_000,
                signature: "v1,abc=".into(),
                body: "{\"type\":\"watch.triggered\"}".into(),
            }),
            ..request(1)
        };
        let json: serde_json::Value = serde_json::from_slice(&encode(&hook)).unwrap();
        assert_eq!(json["webhook"]["url"], "https://hooks.example/in");
        assert!(json.get("subscription").is_none());
        let back = decode_requests(&encode(&hook)).unwrap();
        assert_eq!(back, vec![hook.clone()]);
        assert_eq!(back[0].target.channel(), Channel::Webhook);
        assert_eq!(push.target.channel(), Channel::WebPush);
        // Neither target: not a request.
        let mut neither = json.clone();
        neither.as_object_mut().unwrap().remove("webhook");
        assert!(decode::<PushRequest>(neither.to_string().as_bytes()).is_err());
    }

    #[test]
    fn requests_decode_from_a_batch_or_alone() {
        let batch = vec![request(1), request(2), request(1)];
        let decoded = decode_requests(&encode(&PushRequests::new(batch.clone()))).unwrap();
        assert_eq!(decoded, batch);
        let one = request(3);
        assert_eq!(decode_requests(&encode(&one)).unwrap(), vec![one]);
    }

    #[test]
    fn a_batch_is_read_as_one_whatever_its_key_order_or_spacing() {
        let batch = vec![request(1), request(2)];
        let written = encode(&PushRequests::new(batch.clone()));
        assert!(
            written_as_batch(&written),
            "serde's own order takes the short way"
        );
        let value: serde_json::Value = serde_json::from_slice(&written).unwrap();
        let requests = value["requests"].to_string();
        for other in [
            format!(r#"{{"requests":{requests},"v":1}}"#),
            format!(r#"{{ "v": 1, "requests": {requests} }}"#),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            assert!(!written_as_batch(other.as_bytes()));
            assert_eq!(decode_requests(other.as_bytes()).unwrap(), batch, "{other}");
        }
        assert!(!written_as_batch(&encode(&request(3))));
        for not_a_batch in [
            &br#"{"v":,"requests":["#[..],
            br#"{"v":1,"requests":"#,
            b"{\"v\":1",
        ] {
            assert!(!written_as_batch(not_a_batch));
        }
        // The short way checks the batch as the long way does.
        let empty = br#"{"v":1,"requests":[]}"#;
        assert!(written_as_batch(empty));
        assert!(matches!(
            decode_requests(empty),
            Err(DecodeError::Invalid(_))
        ));
        let newer = br#"{"v":2,"requests":[]}"#;
        assert!(matches!(
            decode_requests(newer),
            Err(DecodeError::Version { got: 2 })
        ));
    }

    #[test]
    fn requests_batches_are_bounded_versioned_and_checked_request_by_request() {
        assert!(matches!(
            decode_requests(&encode(&PushRequests::new(Vec::new()))),
            Err(DecodeError::Invalid(_))
        ));
        let too_many = vec![request(1); MAX_REQUESTS_PER_MESSAGE + 1];
        assert!(matches!(
            decode_requests(&encode(&PushRequests::new(too_many))),
            Err(DecodeError::Invalid(_))
        ));
        let most = vec![request(1); MAX_REQUESTS_PER_MESSAGE];
        assert_eq!(
            decode_requests(&encode(&PushRequests::new(most)))
                .unwrap()
                .len(),
            MAX_REQUESTS_PER_MESSAGE
        );
        let newer = PushRequest { v: 2, ..request(1) };
        assert!(matches!(
            decode_requests(&encode(&PushRequests::new(vec![request(1), newer]))),
            Err(DecodeError::Version { got: 2 })
        ));
        // One bad request makes the whole message undecodable (it is dead-lettered whole).
        let attempt_zero = request(0);
        assert!(matches!(
            decode_requests(&encode(&PushRequests::new(vec![request(1), attempt_zero]))),
            Err(DecodeError::Invalid(_))
        ));
        assert!(matches!(
            decode_requests(b"{\"v\":1,\"requests\":7}"),
            Err(DecodeError::Json(_))
        ));
    }

    #[test]
    fn a_batch_is_named_by_its_first_request_and_its_size() {
        let batch = PushRequests::new(vec![request(2), request(1)]);
        let first = &batch.requests[0];
        assert_eq!(
            batch.msg_id(),
            format!("{}:2+2", first.outbox_id),
            "the id JetStream deduplicates the batch by"
        );
    }
}
