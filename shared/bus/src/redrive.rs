//! Redriving a dead letter is a dispatcher's job, asked for over core NATS: the api (which
//! faces operators and, on its other port, the internet) may read and delete dead letters but
//! publishes nothing to the enqueue or result streams, so it cannot forge the result that ends a
//! row `sent`. It asks on `<prefix>.ops.redrive`; one dispatcher (a queue group) reads the letter
//! by its sequence, publishes it back where it came from and deletes it, and answers.

use crate::dead_letters::{DeadLetterError, DeadLetters};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidings_domain::subjects::Subjects;
use tokio_util::sync::CancellationToken;

/// The subject under the prefix.
pub const SUBJECT: &str = "ops.redrive";

/// The dispatchers answer as one queue group: each ask is handled once.
const QUEUE: &str = "dispatchers";

fn subject(subjects: &Subjects) -> String {
    format!("{}.{SUBJECT}", subjects.prefix())
}

/// What the api asks: redrive the dead letter with this sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    pub sequence: u64,
}

/// What a dispatcher answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Answer {
    /// Published back to `subject` and deleted from the dead-letter stream.
    Redriven { subject: String },
    /// No dead letter has that sequence (any more).
    Gone,
    /// The letter may not be redriven, and why.
    Refused { why: String },
    /// Reading, publishing or deleting failed.
    Failed { detail: String },
}

async fn handle(dlq: &DeadLetters, ask: Ask) -> Answer {
    let letter = match dlq.get(ask.sequence).await {
        Ok(Some(letter)) => letter,
        Ok(None) => return Answer::Gone,
        Err(e) => {
            return Answer::Failed {
                detail: e.to_string(),
            };
        }
    };
    match dlq.redrive(&letter).await {
        Ok(subject) => Answer::Redriven { subject },
        Err(DeadLetterError::NotRedrivable { why, .. }) => Answer::Refused { why },
        Err(e) => Answer::Failed {
            detail: e.to_string(),
        },
    }
}

/// Answers redrive asks until `shutdown` (`crate::respond`), as one of the dispatchers' queue
/// group.
pub async fn serve(client: async_nats::Client, subjects: Subjects, shutdown: CancellationToken) {
    let dlq = std::sync::Arc::new(DeadLetters::new(
        async_nats::jetstream::new(client.clone()),
        subjects.clone(),
    ));
    crate::respond::serve(
        client,
        subject(&subjects),
        Some(QUEUE),
        "redrive asks",
        shutdown,
        move |request| {
            let dlq = dlq.clone();
            async move {
                let answer = match serde_json::from_slice::<Ask>(&request.payload) {
                    Ok(ask) => handle(&dlq, ask).await,
                    Err(e) => Answer::Failed {
                        detail: format!("an ask this dispatcher cannot read: {e}"),
                    },
                };
                serde_json::to_vec(&answer).unwrap_or_default()
            }
        },
    )
    .await;
}

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error("no dispatcher is running to redrive dead letters (they answer on {subject})")]
    NoDispatcher { subject: String },
    #[error("asking a dispatcher to redrive dead letter {sequence} on {subject}")]
    Ask {
        sequence: u64,
        subject: String,
        #[source]
        source: async_nats::RequestError,
    },
    #[error("a dispatcher's answer to the redrive of dead letter {sequence} could not be read")]
    Answer {
        sequence: u64,
        #[source]
        source: serde_json::Error,
    },
}

/// Asks a dispatcher to redrive dead letter `sequence`, waiting at most `wait`.
pub async fn ask(
    client: &async_nats::Client,
    subjects: &Subjects,
    sequence: u64,
    wait: Duration,
) -> Result<Answer, RedriveError> {
    let subject = subject(subjects);
    let body = serde_json::to_vec(&Ask { sequence }).unwrap_or_default();
    let request = async_nats::Request::new()
        .payload(body.into())
        .timeout(Some(wait));
    let answer = client
        .send_request(subject.clone(), request)
        .await
        .map_err(|source| match source.kind() {
            async_nats::RequestErrorKind::NoResponders => RedriveError::NoDispatcher {
                subject: subject.clone(),
            },
            _ => RedriveError::Ask {
                sequence,
                subject: subject.clone(),
                source,
            },
        })?;
    serde_json::from_slice(&answer.payload)
        .map_err(|source| RedriveError::Answer { sequence, source })
}
