//! Dead-lettering: a message that cannot be decoded or fails validation is copied to
//! `<prefix>.dlq.<stream>` with the reason, then terminated, so it is never retried forever and
//! never stops its consumer.

use async_nats::jetstream::{self, AckKind};
use tidings_domain::subjects::{StreamKind, Subjects};

pub const REASON_HEADER: &str = "Tidings-Dlq-Reason";
pub const SUBJECT_HEADER: &str = "Tidings-Dlq-Subject";

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("publishing to {subject}: {source}")]
    Publish {
        subject: String,
        #[source]
        source: crate::Cause,
    },
    #[error("terminating the original message: {0}")]
    Term(#[source] crate::Cause),
}

/// Copies `msg` to the DLQ subject of `from` and terminates it. If the copy cannot be stored the
/// original is left unacknowledged, so JetStream redelivers it rather than losing it.
pub async fn dead_letter(
    js: &jetstream::Context,
    subjects: &Subjects,
    from: StreamKind,
    msg: &jetstream::Message,
    reason: &str,
) -> Result<(), DlqError> {
    dead_letter_part(js, subjects, from, msg, msg.payload.to_vec(), reason).await?;
    msg.ack_with(AckKind::Term).await.map_err(DlqError::Term)
}

/// Copies `payload`, the part of `msg` that cannot be used (some requests of a batch whose others
/// were), to the DLQ subject of `from` with `msg`'s headers and the reason. `msg` itself is left
/// to the caller, which acks it only once this returned `Ok`.
pub async fn dead_letter_part(
    js: &jetstream::Context,
    subjects: &Subjects,
    from: StreamKind,
    msg: &jetstream::Message,
    payload: Vec<u8>,
    reason: &str,
) -> Result<(), DlqError> {
    let subject = subjects.dlq(from);
    let mut headers = msg.headers.clone().unwrap_or_default();
    // A header value may not contain line breaks.
    let reason: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(512)
        .collect();
    headers.insert(REASON_HEADER, reason.as_str());
    headers.insert(SUBJECT_HEADER, msg.subject.as_str());
    let publish_err = |source: crate::Cause| DlqError::Publish {
        subject: subject.clone(),
        source,
    };
    js.publish_with_headers(subject.clone(), headers, payload.into())
        .await
        .map_err(|e| publish_err(e.into()))?
        .await
        .map_err(|e| publish_err(e.into()))?;
    crate::metrics::metrics()
        .dead_lettered
        .get_or_create(&tidings_runtime::metrics::KindLabels {
            kind: from.as_str().to_owned(),
        })
        .inc();
    Ok(())
}
