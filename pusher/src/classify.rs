//! What a push service's answer means (docs/design.md: the state machine and the messages). Pure.

use chrono::{DateTime, Utc};
use tidings_domain::messages::Outcome;

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

/// Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date.
pub fn retry_after(value: &str, now: DateTime<Utc>) -> Option<u64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(secs);
    }
    let at = DateTime::parse_from_rfc2822(v).ok()?;
    Some(u64::try_from((at.with_timezone(&Utc) - now).num_seconds()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn status_classes() {
        let h = "fcm.googleapis.com";
        for (s, o) in [
            (201, Outcome::Delivered),
            (200, Outcome::Delivered),
            (404, Outcome::Gone),
            (410, Outcome::Gone),
            (429, Outcome::Transient),
            (500, Outcome::Transient),
            (503, Outcome::Transient),
            (400, Outcome::Permanent),
            (401, Outcome::Permanent),
            (403, Outcome::Permanent),
            (413, Outcome::Permanent),
            (406, Outcome::Permanent),
            (301, Outcome::Permanent),
        ] {
            assert_eq!(classify(s, h), o, "{s}");
        }
        assert_eq!(
            classify(406, "wns2-by3p.notify.windows.com"),
            Outcome::Transient
        );
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
