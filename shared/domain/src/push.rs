//! What a push service's answer means, in one place: the outcome the pusher reports for an HTTP
//! answer ([`classify`], with [`retry_after`]), and the outbox event a reported result stands for,
//! with its failure reason ([`event`]).

use crate::messages::{Ended, Outcome, PushResult};
use crate::outbox::{Event, FailReason};
use chrono::{DateTime, Utc};

/// The outcome of an HTTP answer from a push service at `host`.
pub fn classify(status: u16, host: &str) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        404 | 410 => Outcome::Gone,
        429 | 500..=599 => Outcome::Transient,
        // WNS answers 406 when it throttles a channel.
        406 if host.ends_with(".notify.windows.com") => Outcome::Transient,
        // 400, 401, 403, 413 and the rest: sending the same request again will not help.
        // Redirects are not followed, so a 3xx is a refusal too.
        _ => Outcome::Permanent,
    }
}

/// The outcome of a webhook endpoint's answer. Only 2xx is delivered; 410 says the endpoint is
/// gone for good (it is disabled); a timeout-like or overload answer is tried again later; any
/// other refusal would refuse the same request again.
pub fn classify_webhook(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        410 => Outcome::Gone,
        408 | 425 | 429 | 500..=599 => Outcome::Transient,
        // Redirects are not followed: a 3xx is a refusal too.
        _ => Outcome::Permanent,
    }
}

/// Whether an answer asks the sender to slow down rather than says the receiver is broken: a
/// `429`, or a `503` that says when to come back. Back-pressure paces an endpoint; it never
/// counts toward its circuit breaker.
pub fn back_pressure(http_status: Option<u16>, retry_after: Option<u64>) -> bool {
    match http_status {
        Some(429) => true,
        Some(503) => retry_after.is_some(),
        _ => false,
    }
}

/// Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date.
pub fn retry_after(value: &str, now: DateTime<Utc>) -> Option<u64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(secs);
    }
    let at = DateTime::parse_from_rfc2822(v).ok()?;
    // A date already past asks for no wait.
    Some(u64::try_from((at.with_timezone(&Utc) - now).num_seconds()).unwrap_or(0))
}

/// The state-machine event a result stands for.
pub fn event(result: &PushResult) -> Event {
    match result.ended {
        Ended::Delivered { .. } => Event::Delivered,
        Ended::Expired {
            outlived: true,
            maybe_delivered: false,
        } => Event::Outlived,
        Ended::Recalled { .. } => Event::Recalled,
        Ended::Transient {
            maybe_delivered: true,
            ..
        }
        | Ended::Expired {
            maybe_delivered: true,
            ..
        } => Event::Unknown,
        Ended::Transient { .. } | Ended::Expired { .. } => Event::Transient,
        Ended::Gone { .. } => Event::Gone,
        Ended::Permanent { refused, .. } => Event::Rejected(match (refused, result.http_status) {
            (Some(reason), _) => reason,
            (None, Some(401 | 403)) => FailReason::VapidRejected,
            (None, Some(413)) => FailReason::PayloadTooLarge,
            (None, Some(_)) => FailReason::PushRejected,
            // No HTTP exchange and no reason given: the endpoint was refused.
            (None, None) => FailReason::EndpointRefused,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn webhook_status_classes() {
        let classes: [(&[u16], Outcome); 4] = [
            (&[200, 202, 204], Outcome::Delivered),
            (&[410], Outcome::Gone),
            (&[408, 425, 429, 500, 502, 503], Outcome::Transient),
            (&[301, 400, 401, 403, 404, 413, 422], Outcome::Permanent),
        ];
        for (statuses, outcome) in classes {
            for &s in statuses {
                assert_eq!(classify_webhook(s), outcome, "{s}");
            }
        }
    }

    #[test]
    fn status_classes() {
        let h = "fcm.googleapis.com";
        let classes: [(&[u16], Outcome); 4] = [
            (&[200, 201], Outcome::Delivered),
            (&[404, 410], Outcome::Gone),
            (&[429, 500, 503], Outcome::Transient),
            (&[301, 400, 401, 403, 406, 413], Outcome::Permanent),
        ];
        for (statuses, outcome) in classes {
            for &s in statuses {
                assert_eq!(classify(s, h), outcome, "{s}");
            }
        }
        assert_eq!(
            classify(406, "wns2-by3p.notify.windows.com"),
            Outcome::Transient
        );
    }

    fn result(ended: Ended, http_status: Option<u16>) -> PushResult {
        PushResult {
            http_status,
            ..PushResult::new(crate::OutboxId::new(), 1, ended)
        }
    }

    fn of(outcome: Outcome, http_status: Option<u16>) -> PushResult {
        result(Ended::of(outcome), http_status)
    }

    #[test]
    fn each_reported_result_is_one_outbox_event() {
        let expired = |outlived, maybe_delivered| Ended::Expired {
            outlived,
            maybe_delivered,
        };
        let cases = [
            (of(Outcome::Delivered, Some(201)), Event::Delivered),
            (of(Outcome::Gone, Some(410)), Event::Gone),
            (of(Outcome::Transient, Some(503)), Event::Transient),
            (of(Outcome::Expired, None), Event::Transient),
            (
                result(
                    Ended::Transient {
                        retry_after: None,
                        maybe_delivered: true,
                    },
                    None,
                ),
                Event::Unknown,
            ),
            // Not sent because its validity ran out: withheld, not retried.
            (result(expired(true, false), None), Event::Outlived),
            // Unless an earlier holder of the same request may have sent it.
            (result(expired(true, true), None), Event::Unknown),
            // A redelivery past its deadline whose first delivery may have been accepted.
            (result(expired(false, true), None), Event::Unknown),
            (
                of(Outcome::Permanent, Some(401)),
                Event::Rejected(FailReason::VapidRejected),
            ),
            (
                of(Outcome::Permanent, Some(413)),
                Event::Rejected(FailReason::PayloadTooLarge),
            ),
            (
                of(Outcome::Permanent, Some(400)),
                Event::Rejected(FailReason::PushRejected),
            ),
            (
                of(Outcome::Permanent, None),
                Event::Rejected(FailReason::EndpointRefused),
            ),
            (
                result(
                    Ended::Permanent {
                        refused: Some(FailReason::PayloadTooLarge),
                        maybe_delivered: false,
                    },
                    None,
                ),
                Event::Rejected(FailReason::PayloadTooLarge),
            ),
        ];
        for (r, expected) in cases {
            assert_eq!(event(&r), expected, "{r:?}");
        }
    }

    #[test]
    fn back_pressure_is_a_429_or_a_503_that_says_when() {
        assert!(back_pressure(Some(429), None));
        assert!(back_pressure(Some(429), Some(2)));
        assert!(back_pressure(Some(503), Some(2)));
        assert!(!back_pressure(Some(503), None), "down, not pacing");
        for status in [None, Some(500), Some(502), Some(410), Some(200)] {
            assert!(!back_pressure(status, Some(2)), "{status:?}");
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        assert_eq!(retry_after("120", now), Some(120));
        assert_eq!(retry_after("Mon, 30 Nov 2026 12:02:00 GMT", now), Some(120));
        assert_eq!(retry_after("Mon, 30 Nov 2026 11:00:00 GMT", now), Some(0));
        assert_eq!(retry_after("soon", now), None);
    }
}
