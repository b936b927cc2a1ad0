//! A digest as its reader gets it: the held notifications that still hold at the digest time,
//! re-checked, in one message ("3 of your watches: A now 9.99 EUR, …"). Pure; the dispatcher
//! decides which rows are members (each one re-checked) and sends the message once, for its
//! lowest-id member, the leader.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use crate::mail::{Links, MailText, compose};
use crate::messages::Payload;
use crate::money::{Separators, format};
use crate::shown::local_time;
use crate::texts::{self, DigestEntry, Lang, mail_lines};
use crate::trigger::Observation;
use crate::validity::hashed_topic;
use crate::webhook::{EventData, EventType};
use crate::{DeviceId, OutboxId};

/// Bytes of a digest's body: a Web Push message carries about 3 KB once encrypted, and the
/// payload states its text twice (the declarative form beside the service worker's).
pub const BODY_BUDGET: usize = 900;

/// A member as its line reads it: its item and the value re-checked for it.
#[derive(Clone, Copy, Debug)]
pub struct Line<'a> {
    pub id: OutboxId,
    pub item: &'a str,
    pub now: &'a Observation,
    /// Until when its value may be shown as current.
    pub valid_until: DateTime<Utc>,
}

/// The Web Push `Topic` of a reader's digests: a digest waiting for an offline device is
/// replaced by the next, not queued beside it.
pub fn topic(device: DeviceId) -> String {
    hashed_topic(&[b"digest", device.0.as_bytes()])
}

/// The notification of a digest of `lines` (in order; the first is the leader), for a reader
/// in `locale`. It states the earliest observation among its lines, and is current until the
/// first of them stops being. `data.digest` counts its members: the service worker shows a
/// digest "as of" its time, since the api's show-time check speaks for one row.
pub fn payload(lines: &[Line<'_>], device: DeviceId, locale: Option<&str>) -> Payload {
    let locale = locale.unwrap_or_default();
    let lang = Lang::of(locale);
    let sep = Separators::of(locale);
    let prices: Vec<String> = (lines.iter())
        .map(|l| format(l.now.price, &l.now.currency, sep))
        .collect();
    let entries: Vec<DigestEntry<'_>> = (lines.iter().zip(&prices))
        .map(|(l, price)| DigestEntry {
            item: l.item,
            price,
        })
        .collect();
    let (title, body) = texts::digest(lang, &entries, BODY_BUDGET);
    Payload {
        id: lines.first().map(|l| l.id),
        tag: Some(format!("digest/{}", device.0.simple())),
        observed_at: lines.iter().map(|l| l.now.observed_at).min(),
        valid_until: lines.iter().map(|l| l.valid_until).min(),
        // The count only: a Web Push message has room for a few dozen ids at most, and the
        // members are in the reader's history.
        data: serde_json::json!({ "digest": lines.len() }),
        ..Payload::new(title, body)
    }
}

/// The body of a digest's webhook: `watch.digest`, with every member's event as
/// `watch.triggered` would carry it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DigestEvent {
    /// Always `watch.digest`.
    #[serde(rename = "type")]
    pub kind: EventType,
    pub timestamp: DateTime<Utc>,
    pub data: DigestData,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DigestData {
    /// The leader: the same as the `webhook-id` header.
    pub id: OutboxId,
    pub title: String,
    pub text: String,
    pub members: Vec<EventData>,
}

impl DigestEvent {
    pub fn new(payload: &Payload, members: Vec<EventData>, now: DateTime<Utc>) -> Self {
        DigestEvent {
            kind: EventType::Digest,
            timestamp: now,
            data: DigestData {
                id: members
                    .first()
                    .map_or(OutboxId(uuid::Uuid::nil()), |m| m.id),
                title: payload.title.clone(),
                text: payload.body.clone(),
                members,
            },
        }
    }

    pub fn to_json(&self) -> String {
        // Plain structs with string keys: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A digest's mail: its title as the subject, its lines, when the values were observed and until
/// when they hold in the reader's time, the leader's "check now" link, and the way out.
pub fn mail(p: &Payload, lang: Lang, tz: Tz, links: &Links<'_>) -> MailText {
    let now = Utc::now();
    let as_of = local_time(p.observed_at.unwrap_or(now), tz);
    let until = local_time(p.valid_until.unwrap_or(now), tz);
    compose(lang, p, &mail_lines(lang, &as_of, &until), links, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(price: i64) -> Observation {
        Observation {
            price,
            currency: "EUR".into(),
            in_stock: true,
            paused: false,
            observed_at: "2026-12-05T08:00:00Z".parse().unwrap(),
            stock_stated: true,
        }
    }

    #[test]
    fn a_digest_lists_each_member_at_its_rechecked_value_in_the_readers_language() {
        let (a, b) = (seen(999), seen(1100));
        let until: DateTime<Utc> = "2026-12-05T09:00:00Z".parse().unwrap();
        let id = |n: u128| OutboxId(uuid::Uuid::from_u128(n));
        let lines = [
            Line {
                id: id(1),
                item: "A",
                now: &a,
                valid_until: until,
            },
            Line {
                id: id(2),
                item: "B",
                now: &b,
                valid_until: until - chrono::Duration::minutes(5),
            },
        ];
        let device = DeviceId(uuid::Uuid::from_u128(7));
        let p = payload(&lines, device, Some("de-DE"));
        assert_eq!(p.title, "2 of your watches");
        assert!(p.body.contains("A now 9,99"), "{}", p.body);
        assert!(p.body.contains("B now 11,00"), "{}", p.body);
        assert_eq!(p.id, Some(id(1)));
        assert_eq!(p.valid_until, Some(until - chrono::Duration::minutes(5)));
        assert_eq!(p.data["digest"], 2);
        let ja = payload(&lines, device, Some("ja-JP"));
        assert!(ja.title.contains("2件"), "{}", ja.title);
        assert_eq!(topic(device).len(), crate::validity::MAX_TOPIC_LEN);
        assert_ne!(topic(device), topic(DeviceId(uuid::Uuid::from_u128(8))));
    }
}
