//! The dead-letter stream as operators work it: list and read what was dead-lettered, redrive a
//! message to the subject it came from once its cause is fixed, or purge it.
//!
//! Messages are read one at a time by sequence (`STREAM.MSG.GET` with `next_by_subject`), so a
//! listing skips deleted ones and never creates a consumer. A redrive publishes the payload and
//! the original headers to the original subject with a new `Nats-Msg-Id` — the old one may still
//! be inside the stream's duplicate window — and a header naming the dead letter it came from,
//! then deletes the dead letter. The new id is derived from the dead letter's sequence, so a
//! redrive repeated after a failed delete is dropped by JetStream as a duplicate; and whatever
//! arrives twice anyway is absorbed downstream (the outbox's dedup key, the results'
//! compare-and-set).

use crate::dlq::{REASON_HEADER, SUBJECT_HEADER};
use async_nats::jetstream::{self, stream::RawMessageErrorKind};
use chrono::{DateTime, Utc};
use tidings_domain::subjects::{StreamKind, Subjects};

/// Set on a redriven message: the dead letter's sequence it was redriven from.
pub const REDRIVEN_FROM_HEADER: &str = "Tidings-Redriven-From";
/// Set on a redriven message: how many times this message has been redriven.
pub const REDRIVE_COUNT_HEADER: &str = "Tidings-Redrive-Count";

#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("reading dead letter {sequence} from stream {stream}: {source}")]
    Read {
        stream: String,
        sequence: u64,
        #[source]
        source: crate::Cause,
    },
    #[error("redriving dead letter {sequence} to {subject}: {source}")]
    Publish {
        sequence: u64,
        subject: String,
        #[source]
        source: crate::Cause,
    },
    #[error("deleting dead letter {sequence} from stream {stream}: {source}")]
    Delete {
        stream: String,
        sequence: u64,
        #[source]
        source: crate::Cause,
    },
    #[error("dead letter {sequence} cannot be redriven: {why}")]
    NotRedrivable { sequence: u64, why: String },
}

/// One dead-lettered message.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub sequence: u64,
    /// The stream it was consumed from, when its subject says.
    pub from: Option<StreamKind>,
    /// Where it was published before it was dead-lettered.
    pub original_subject: Option<String>,
    pub reason: Option<String>,
    pub msg_id: Option<String>,
    /// How often it had been redriven before it came back here.
    pub redrives: u32,
    pub at: DateTime<Utc>,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

/// Which dead letters an operation is about.
#[derive(Clone, Debug, Default)]
pub struct DeadLetterFilter {
    pub from: Option<StreamKind>,
    /// A case-insensitive part of the reason.
    pub reason: Option<String>,
}

impl DeadLetterFilter {
    fn subject(&self, subjects: &Subjects) -> String {
        match self.from {
            Some(kind) => subjects.dlq(kind),
            None => subjects.all(StreamKind::Dlq),
        }
    }

    fn matches(&self, letter: &DeadLetter) -> bool {
        match &self.reason {
            None => true,
            Some(part) => letter
                .reason
                .as_deref()
                .is_some_and(|r| r.to_lowercase().contains(&part.to_lowercase())),
        }
    }
}

fn header(headers: &async_nats::HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.as_str().to_owned())
}

fn letter(subjects: &Subjects, m: jetstream::message::StreamMessage) -> DeadLetter {
    let from_name = m
        .subject
        .as_str()
        .strip_prefix(&format!("{}.dlq.", subjects.prefix()))
        .map(str::to_owned);
    let from = StreamKind::ALL
        .into_iter()
        .find(|k| Some(k.as_str()) == from_name.as_deref());
    let at =
        DateTime::from_timestamp(m.time.unix_timestamp(), m.time.nanosecond()).unwrap_or_default();
    let headers: Vec<(String, String)> = m
        .headers
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().to_owned()))
        })
        .collect();
    DeadLetter {
        sequence: m.sequence,
        from,
        original_subject: header(&m.headers, SUBJECT_HEADER),
        reason: header(&m.headers, REASON_HEADER),
        msg_id: header(&m.headers, "Nats-Msg-Id"),
        redrives: header(&m.headers, REDRIVE_COUNT_HEADER)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        at,
        headers,
        payload: m.payload.to_vec(),
    }
}

/// The dead-letter stream and what it reads and writes.
#[derive(Clone, Debug)]
pub struct DeadLetters {
    js: jetstream::Context,
    subjects: Subjects,
}

impl DeadLetters {
    pub fn new(js: jetstream::Context, subjects: Subjects) -> Self {
        DeadLetters { js, subjects }
    }

    fn stream_name(&self) -> String {
        self.subjects.stream(StreamKind::Dlq)
    }

    fn read_error(&self, sequence: u64) -> impl FnOnce(crate::Cause) -> DeadLetterError + '_ {
        move |source| DeadLetterError::Read {
            stream: self.stream_name(),
            sequence,
            source,
        }
    }

    /// The first dead letter at or after `from_sequence` matching `filter`'s subject, if any.
    async fn next(
        &self,
        stream: &jetstream::stream::Stream<()>,
        filter: &DeadLetterFilter,
        from_sequence: u64,
    ) -> Result<Option<DeadLetter>, DeadLetterError> {
        let found = stream
            .raw_message_builder()
            .sequence(from_sequence.max(1))
            .next_by_subject(filter.subject(&self.subjects))
            .send()
            .await;
        match found {
            Ok(m) => Ok(Some(letter(&self.subjects, m))),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(self.read_error(from_sequence)(e.into())),
        }
    }

    async fn stream(&self) -> Result<jetstream::stream::Stream<()>, DeadLetterError> {
        self.js
            .get_stream_no_info(self.stream_name())
            .await
            .map_err(|e| self.read_error(0)(e.into()))
    }

    /// Up to `limit` dead letters matching `filter` with a sequence above `after`, oldest first,
    /// and whether more may follow. `examine` bounds how many are read to find them.
    pub async fn list(
        &self,
        filter: &DeadLetterFilter,
        after: u64,
        limit: usize,
        examine: usize,
    ) -> Result<Page, DeadLetterError> {
        let stream = self.stream().await?;
        let mut page = Page::default();
        let mut next = after + 1;
        while page.items.len() < limit {
            if page.examined >= examine {
                page.last = Some(next - 1);
                return Ok(page);
            }
            let Some(found) = self.next(&stream, filter, next).await? else {
                return Ok(page);
            };
            page.examined += 1;
            next = found.sequence + 1;
            if filter.matches(&found) {
                page.items.push(found);
            }
        }
        page.last = Some(next - 1);
        Ok(page)
    }

    /// The dead letter with this sequence, if it is there.
    pub async fn get(&self, sequence: u64) -> Result<Option<DeadLetter>, DeadLetterError> {
        let stream = self.stream().await?;
        match stream.get_raw_message(sequence).await {
            Ok(m) => Ok(Some(letter(&self.subjects, m))),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(self.read_error(sequence)(e.into())),
        }
    }

    /// Where `letter` would be redriven to, or why it cannot be.
    pub fn target(&self, letter: &DeadLetter) -> Result<String, DeadLetterError> {
        let refuse = |why: &str| DeadLetterError::NotRedrivable {
            sequence: letter.sequence,
            why: why.to_owned(),
        };
        let subject = letter
            .original_subject
            .clone()
            .ok_or_else(|| refuse("it does not say which subject it came from"))?;
        match letter.from {
            // A push request's row stays `sending` until its lease runs out; the sweeper then
            // retries it with a new attempt. Sending the old attempt again would race that.
            Some(StreamKind::Push) => Err(refuse(
                "a push request is not redriven: its row is retried by the lease sweeper",
            )),
            Some(kind @ (StreamKind::Enqueue | StreamKind::Result))
                if subject.starts_with(&format!(
                    "{}.{}.",
                    self.subjects.prefix(),
                    kind.as_str()
                )) =>
            {
                Ok(subject)
            }
            _ => Err(refuse(&format!(
                "its original subject {subject} is not an enqueue or result subject of this prefix"
            ))),
        }
    }

    /// Publishes `letter` back to its original subject and deletes it here; returns the subject.
    pub async fn redrive(&self, letter: &DeadLetter) -> Result<String, DeadLetterError> {
        let subject = self.target(letter)?;
        let mut headers = async_nats::HeaderMap::new();
        for (name, value) in &letter.headers {
            if [
                REASON_HEADER,
                SUBJECT_HEADER,
                "Nats-Msg-Id",
                REDRIVEN_FROM_HEADER,
                REDRIVE_COUNT_HEADER,
            ]
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
            {
                continue;
            }
            headers.append(name.as_str(), value.as_str());
        }
        let msg_id = format!(
            "{}:redrive:{}",
            letter.msg_id.as_deref().unwrap_or("dlq"),
            letter.sequence
        );
        headers.insert("Nats-Msg-Id", msg_id.as_str());
        headers.insert(REDRIVEN_FROM_HEADER, letter.sequence.to_string().as_str());
        headers.insert(
            REDRIVE_COUNT_HEADER,
            (letter.redrives + 1).to_string().as_str(),
        );
        let publish_err = |source: crate::Cause| DeadLetterError::Publish {
            sequence: letter.sequence,
            subject: subject.clone(),
            source,
        };
        self.js
            .publish_with_headers(subject.clone(), headers, letter.payload.clone().into())
            .await
            .map_err(|e| publish_err(e.into()))?
            .await
            .map_err(|e| publish_err(e.into()))?;
        self.purge(letter.sequence).await?;
        tracing::info!(sequence = letter.sequence, subject = %subject, "dead letter redriven");
        Ok(subject)
    }

    /// Deletes the dead letter with this sequence; false if it was not there.
    pub async fn purge(&self, sequence: u64) -> Result<bool, DeadLetterError> {
        let stream = self.stream().await?;
        match stream.delete_message(sequence).await {
            Ok(deleted) => Ok(deleted),
            // nats-server answers a delete of a missing message with the generic "delete
            // failed" code; whether the message is there tells the two apart, not the text.
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::stream::DeleteMessageErrorKind::JetStream(js)
                        if js.error_code() == jetstream::ErrorCode::STREAM_MESSAGE_DELETE_FAILED
                ) && matches!(
                    stream.get_raw_message(sequence).await.map_err(|e| e.kind()),
                    Err(RawMessageErrorKind::NoMessageFound)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(DeadLetterError::Delete {
                stream: self.stream_name(),
                sequence,
                source: e.into(),
            }),
        }
    }
}

/// A page of [`DeadLetters::list`].
#[derive(Debug, Default)]
pub struct Page {
    pub items: Vec<DeadLetter>,
    /// Dead letters read (matching the filter's subject) to fill the page.
    pub examined: usize,
    /// The last sequence read when the page stopped early (full, or `examine` reached): the
    /// cursor to go on from. `None`: the stream was read to its end.
    pub last: Option<u64>,
}
