//! Pusher → dispatcher: how one attempt ended. In memory an [`Ended`] holds only what its
//! outcome can carry; on the wire a result keeps the flat shape every pusher and dispatcher so far
//! writes and reads (`outcome` beside optional `message_id`, `retry_after`, `refused`,
//! `maybe_delivered`, `outlived`), so either side can be upgraded first.

use super::{DecodeError, Message, Outcome, VERSION};
use crate::OutboxId;
use crate::outbox::FailReason;
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

/// What can happen to one attempt, each with only what it can carry.
///
/// `maybe_delivered` on every end but `Delivered`: the push service may have accepted the
/// request all the same — it was sent but no answer came (a timeout after the connection was
/// open), or it is a redelivery the delivery log does not know, whose earlier holder may have sent
/// it before it died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Accepted; the push service's message id (its `Location` header), when it gave one.
    Delivered {
        message_id: Option<String>,
    },
    /// Try again later; after `retry_after` seconds when the service said (its `Retry-After`).
    Transient {
        retry_after: Option<u64>,
        maybe_delivered: bool,
    },
    Gone {
        maybe_delivered: bool,
    },
    /// Refused for good: by the service (its status is the result's `http_status`), or by the
    /// pusher itself with no HTTP exchange (endpoint guard, invalid keys, payload too large):
    /// `refused` is then the failure reason to record.
    Permanent {
        refused: Option<FailReason>,
        maybe_delivered: bool,
    },
    /// Not sent in time: past the request's deadline, or `outlived` — its notification's
    /// validity had run out, so the row is withheld rather than retried.
    Expired {
        outlived: bool,
        maybe_delivered: bool,
    },
    Recalled {
        maybe_delivered: bool,
    },
}

impl Ended {
    /// The end with nothing more known than its outcome.
    pub fn of(outcome: Outcome) -> Ended {
        Parts::of(outcome).into()
    }

    /// The end an HTTP answer stands for: its `Location` kept only when delivered, its
    /// `Retry-After` only when to be tried again, `refused` (the reason to record) only when
    /// refused for good.
    pub fn answered(
        outcome: Outcome,
        message_id: Option<String>,
        retry_after: Option<u64>,
        refused: Option<FailReason>,
    ) -> Ended {
        Parts {
            message_id,
            retry_after,
            refused,
            ..Parts::of(outcome)
        }
        .into()
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            Ended::Delivered { .. } => Outcome::Delivered,
            Ended::Transient { .. } => Outcome::Transient,
            Ended::Gone { .. } => Outcome::Gone,
            Ended::Permanent { .. } => Outcome::Permanent,
            Ended::Expired { .. } => Outcome::Expired,
            Ended::Recalled { .. } => Outcome::Recalled,
        }
    }

    pub fn maybe_delivered(&self) -> bool {
        match *self {
            Ended::Delivered { .. } => false,
            Ended::Transient {
                maybe_delivered, ..
            }
            | Ended::Gone { maybe_delivered }
            | Ended::Permanent {
                maybe_delivered, ..
            }
            | Ended::Expired {
                maybe_delivered, ..
            }
            | Ended::Recalled { maybe_delivered } => maybe_delivered,
        }
    }

    /// The same end, known to have perhaps reached the push service all the same (a
    /// delivered one stays as it is).
    pub fn maybe_arrived(self) -> Ended {
        Parts {
            maybe_delivered: true,
            ..Parts::from(self)
        }
        .into()
    }

    pub fn message_id(&self) -> Option<&str> {
        match self {
            Ended::Delivered { message_id } => message_id.as_deref(),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<u64> {
        match *self {
            Ended::Transient { retry_after, .. } => retry_after,
            _ => None,
        }
    }
}

impl From<Outcome> for Ended {
    fn from(outcome: Outcome) -> Ended {
        Ended::of(outcome)
    }
}

/// An end's fields side by side, as the wire carries them.
struct Parts {
    outcome: Outcome,
    message_id: Option<String>,
    retry_after: Option<u64>,
    refused: Option<FailReason>,
    maybe_delivered: bool,
    outlived: bool,
}

impl Parts {
    fn of(outcome: Outcome) -> Parts {
        Parts {
            outcome,
            message_id: None,
            retry_after: None,
            refused: None,
            maybe_delivered: false,
            outlived: false,
        }
    }
}

/// What the outcome cannot carry is left out.
impl From<Parts> for Ended {
    fn from(p: Parts) -> Ended {
        let maybe_delivered = p.maybe_delivered;
        match p.outcome {
            Outcome::Delivered => Ended::Delivered {
                message_id: p.message_id,
            },
            Outcome::Transient => Ended::Transient {
                retry_after: p.retry_after,
                maybe_delivered,
            },
            Outcome::Gone => Ended::Gone { maybe_delivered },
            Outcome::Permanent => Ended::Permanent {
                refused: p.refused,
                maybe_delivered,
            },
            Outcome::Expired => Ended::Expired {
                outlived: p.outlived,
                maybe_delivered,
            },
            Outcome::Recalled => Ended::Recalled { maybe_delivered },
        }
    }
}

impl From<Ended> for Parts {
    fn from(e: Ended) -> Parts {
        let mut p = Parts {
            maybe_delivered: e.maybe_delivered(),
            ..Parts::of(e.outcome())
        };
        match e {
            Ended::Delivered { message_id } => p.message_id = message_id,
            Ended::Transient { retry_after, .. } => p.retry_after = retry_after,
            Ended::Permanent { refused, .. } => p.refused = refused,
            Ended::Expired { outlived, .. } => p.outlived = outlived,
            Ended::Gone { .. } | Ended::Recalled { .. } => {}
        }
        p
    }
}

/// Pusher → dispatcher: how one attempt ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "Flat", into = "Flat")]
pub struct PushResult {
    pub v: u32,
    pub outbox_id: OutboxId,
    pub attempt: u32,
    pub ended: Ended,
    /// The answer's status, when there was an HTTP exchange.
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub latency_ms: u64,
    /// The request's `dedup_day`, when it had one.
    pub dedup_day: Option<NaiveDate>,
    /// When the pusher started the attempt, for its record. Older pushers omit it.
    pub started_at: Option<DateTime<Utc>>,
    /// The push service's host, when the endpoint passed the guard.
    pub push_host: Option<String>,
    /// The W3C trace context of the push span, in a [`super::PushResults`] batch (whose one
    /// header cannot carry every result's). A result alone carries it as its message's header.
    pub traceparent: Option<String>,
    /// The digest's other rows, copied from the request: the result is theirs too.
    pub members: Vec<super::Member>,
}

impl PushResult {
    /// How `attempt` of row `outbox_id` ended, with nothing more known; the pusher and the
    /// sweeper add what they know (status, error, …) with `..PushResult::new(..)`.
    pub fn new(outbox_id: OutboxId, attempt: u32, ended: impl Into<Ended>) -> Self {
        PushResult {
            v: VERSION,
            outbox_id,
            attempt,
            ended: ended.into(),
            http_status: None,
            error: None,
            latency_ms: 0,
            dedup_day: None,
            started_at: None,
            push_host: None,
            traceparent: None,
            members: Vec::new(),
        }
    }

    pub fn outcome(&self) -> Outcome {
        self.ended.outcome()
    }
}

impl Message for PushResult {
    fn version(&self) -> u32 {
        self.v
    }

    /// A digest's result names at most the rows its request could carry: one result never grows
    /// the dispatcher's transaction past a digest.
    fn validate(&self) -> Result<(), DecodeError> {
        if self.members.len() >= super::MAX_DIGEST_MEMBERS {
            return Err(DecodeError::Invalid(format!(
                "a digest's result names at most {} other rows, not {}",
                super::MAX_DIGEST_MEMBERS - 1,
                self.members.len()
            )));
        }
        Ok(())
    }
}

/// A result as it travels: the shape before [`Ended`], field for field.
#[derive(Clone, Serialize, Deserialize)]
struct Flat {
    v: u32,
    outbox_id: OutboxId,
    attempt: u32,
    outcome: Outcome,
    #[serde(default)]
    http_status: Option<u16>,
    #[serde(default)]
    retry_after: Option<u64>,
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    latency_ms: u64,
    #[serde(default)]
    refused: Option<FailReason>,
    /// Older pushers omit it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    maybe_delivered: bool,
    /// Older dispatchers ignore it and retry, as for any expired request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    outlived: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dedup_day: Option<NaiveDate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    push_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    members: Vec<super::Member>,
}

impl From<Flat> for PushResult {
    fn from(f: Flat) -> Self {
        PushResult {
            v: f.v,
            outbox_id: f.outbox_id,
            attempt: f.attempt,
            ended: Parts {
                outcome: f.outcome,
                message_id: f.message_id,
                retry_after: f.retry_after,
                refused: f.refused,
                maybe_delivered: f.maybe_delivered,
                outlived: f.outlived,
            }
            .into(),
            http_status: f.http_status,
            error: f.error,
            latency_ms: f.latency_ms,
            dedup_day: f.dedup_day,
            started_at: f.started_at,
            push_host: f.push_host,
            traceparent: f.traceparent,
            members: f.members,
        }
    }
}

impl From<PushResult> for Flat {
    fn from(r: PushResult) -> Self {
        let p = Parts::from(r.ended);
        Flat {
            v: r.v,
            outbox_id: r.outbox_id,
            attempt: r.attempt,
            outcome: p.outcome,
            http_status: r.http_status,
            retry_after: p.retry_after,
            message_id: p.message_id,
            error: r.error,
            latency_ms: r.latency_ms,
            refused: p.refused,
            maybe_delivered: p.maybe_delivered,
            outlived: p.outlived,
            dedup_day: r.dedup_day,
            started_at: r.started_at,
            push_host: r.push_host,
            traceparent: r.traceparent,
            members: r.members,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{decode, encode};

    /// A result as the pusher before [`Ended`] wrote it, field for field in its order: `tail`
    /// holds what it wrote only when set (`maybe_delivered`, `outlived`, `push_host`, …).
    fn previous(outcome: &str, answer: &str, refused: &str, tail: &str) -> String {
        format!(
            r#"{{"v":1,"outbox_id":"0192e4a1-7b3c-7d2e-9f10-3a4b5c6d7e8f","attempt":2,"outcome":"{outcome}",{answer},"latency_ms":7,"refused":{refused}{tail}}}"#
        )
    }

    const NO_ANSWER: &str =
        r#""http_status":null,"retry_after":null,"message_id":null,"error":null"#;

    #[test]
    fn each_ending_reads_and_writes_the_previous_flat_shape_byte_for_byte() {
        let host = r#","push_host":"push.test""#;
        let cases = [
            (
                previous(
                    "delivered",
                    r#""http_status":201,"retry_after":null,"message_id":"https://push.test/m/1","error":null"#,
                    "null",
                    host,
                ),
                Ended::Delivered {
                    message_id: Some("https://push.test/m/1".into()),
                },
            ),
            (
                previous(
                    "transient",
                    r#""http_status":429,"retry_after":2,"message_id":null,"error":"HTTP 429: slow down""#,
                    "null",
                    host,
                ),
                Ended::Transient {
                    retry_after: Some(2),
                    maybe_delivered: false,
                },
            ),
            (
                previous(
                    "transient",
                    r#""http_status":null,"retry_after":null,"message_id":null,"error":"timeout: …""#,
                    "null",
                    r#","maybe_delivered":true"#,
                ),
                Ended::Transient {
                    retry_after: None,
                    maybe_delivered: true,
                },
            ),
            (
                previous("gone", NO_ANSWER, "null", r#","maybe_delivered":true"#),
                Ended::Gone {
                    maybe_delivered: true,
                },
            ),
            (
                previous("permanent", NO_ANSWER, r#""payload_too_large""#, ""),
                Ended::Permanent {
                    refused: Some(FailReason::PayloadTooLarge),
                    maybe_delivered: false,
                },
            ),
            (
                previous("expired", NO_ANSWER, "null", r#","outlived":true"#),
                Ended::Expired {
                    outlived: true,
                    maybe_delivered: false,
                },
            ),
            (
                previous(
                    "expired",
                    NO_ANSWER,
                    "null",
                    r#","maybe_delivered":true,"outlived":true,"dedup_day":"2026-12-05""#,
                ),
                Ended::Expired {
                    outlived: true,
                    maybe_delivered: true,
                },
            ),
            (
                previous("recalled", NO_ANSWER, "null", ""),
                Ended::Recalled {
                    maybe_delivered: false,
                },
            ),
        ];
        for (text, ended) in cases {
            let decoded = decode::<PushResult>(text.as_bytes()).unwrap();
            assert_eq!(decoded.ended, ended, "{text}");
            assert_eq!(String::from_utf8(encode(&decoded)).unwrap(), text);
        }
    }

    #[test]
    fn what_an_outcome_cannot_carry_is_left_out_when_read() {
        let text = previous(
            "delivered",
            r#""http_status":201,"retry_after":9,"message_id":null,"error":null"#,
            r#""push_rejected""#,
            r#","maybe_delivered":true,"outlived":true"#,
        );
        let decoded = decode::<PushResult>(text.as_bytes()).unwrap();
        assert_eq!(decoded.ended, Ended::Delivered { message_id: None });
        assert_eq!(
            String::from_utf8(encode(&decoded)).unwrap(),
            previous(
                "delivered",
                r#""http_status":201,"retry_after":null,"message_id":null,"error":null"#,
                "null",
                ""
            )
        );
        // An older pusher's result, without the fields added since, reads as before.
        let oldest = r#"{"v":1,"outbox_id":"0192e4a1-7b3c-7d2e-9f10-3a4b5c6d7e8f","attempt":1,"outcome":"transient"}"#;
        let decoded = decode::<PushResult>(oldest.as_bytes()).unwrap();
        assert_eq!(decoded.ended, Ended::of(Outcome::Transient));
        assert_eq!((decoded.latency_ms, decoded.started_at), (0, None));
    }

    #[test]
    fn a_maybe_arrived_ending_keeps_what_it_carried() {
        let transient = Ended::Transient {
            retry_after: Some(3),
            maybe_delivered: false,
        };
        assert_eq!(
            transient.maybe_arrived(),
            Ended::Transient {
                retry_after: Some(3),
                maybe_delivered: true,
            }
        );
        let delivered = Ended::Delivered {
            message_id: Some("m".into()),
        };
        assert_eq!(delivered.clone().maybe_arrived(), delivered);
        for outcome in Outcome::ALL {
            let ended = Ended::of(outcome).maybe_arrived();
            assert_eq!(ended.outcome(), outcome);
            assert_eq!(ended.maybe_delivered(), outcome != Outcome::Delivered);
        }
    }
}
