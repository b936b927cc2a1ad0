//! A payload as the pusher reads it. The pusher encrypts a payload's JSON and acts on one of its
//! fields, `valid_until`. Decoding the whole [`Payload`] and serialising it again to encrypt it
//! made reading a request nearly twice as slow as keeping the bytes the dispatcher wrote and
//! reading that one field from them (5.6 against 3.1 µs a request whose payload has a
//! Declarative envelope), and it could only lose what the dispatcher wrote.
//!
//! The dispatcher renders a notification into one too, once: its outbox row stores the text the
//! request carries (serialising the `Payload` for each cost 1 µs more a request).

use chrono::{DateTime, Utc};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use std::borrow::Cow;

use super::Payload;

/// A [`Payload`]'s JSON exactly as the dispatcher wrote it, and its `valid_until`. Reading one
/// checks what a notification needs: an object with a text `title` and `body`, and a
/// `valid_until`, if it has one, that is an instant. Keys the pusher does not know go to the
/// device as written.
#[derive(Clone, Debug)]
pub struct RawPayload {
    json: Box<RawValue>,
    valid_until: Option<DateTime<Utc>>,
}

impl RawPayload {
    /// The JSON to encrypt.
    pub fn json(&self) -> &[u8] {
        self.json.get().as_bytes()
    }

    /// The JSON as one value, for the dispatcher's outbox row (which stores what it publishes).
    pub fn raw(&self) -> &RawValue {
        &self.json
    }

    /// Until when the text may be shown as current.
    pub fn valid_until(&self) -> Option<DateTime<Utc>> {
        self.valid_until
    }
}

/// A notification rendered once: the dispatcher writes the same text to its outbox row and to
/// the request it publishes.
impl From<&Payload> for RawPayload {
    fn from(payload: &Payload) -> Self {
        RawPayload {
            // Serialising a `Payload` cannot fail (its maps have string keys, no serializer of
            // its errors); were it to, the pusher dead-letters the request a `null` makes.
            json: serde_json::value::to_raw_value(payload)
                .unwrap_or_else(|_| RawValue::NULL.to_owned()),
            valid_until: payload.valid_until,
        }
    }
}

/// The keys a payload is checked for.
#[derive(Deserialize)]
#[expect(
    dead_code,
    reason = "`title` and `body` are read only to check they are text"
)]
struct Checked<'a> {
    #[serde(borrow)]
    title: Cow<'a, str>,
    #[serde(borrow)]
    body: Cow<'a, str>,
    #[serde(default)]
    valid_until: Option<DateTime<Utc>>,
}

impl<'de> Deserialize<'de> for RawPayload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let json = Box::<RawValue>::deserialize(d)?;
        let checked: Checked = serde_json::from_str(json.get())
            .map_err(|e| D::Error::custom(format_args!("payload: {e}")))?;
        Ok(RawPayload {
            valid_until: checked.valid_until,
            json,
        })
    }
}

impl Serialize for RawPayload {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::super::flat::tests::{declarative, request};
    use super::super::{Payload, PushRequest, Subscription, Target, decode, encode};
    use super::*;
    use chrono::TimeZone;

    fn push<P>(payload: P) -> PushRequest<P> {
        let sub = Subscription {
            endpoint: "https://push.example/send/1".into(),
            p256dh: "key".into(),
            auth: "auth".into(),
        };
        request(Target::WebPush(sub), payload)
    }

    /// The envelope, and text that serialises with escapes and non-ASCII.
    fn full_payload() -> Payload {
        Payload {
            title: "Below \"10\"".into(),
            body: "now 9.99 € \u{1F4B0}".into(),
            tag: Some("w:1".into()),
            valid_until: Some(Utc.with_ymd_and_hms(2026, 12, 6, 12, 5, 0).unwrap()),
            data: serde_json::json!({"price": "9.99", "quote": "say \"now\"\n"}),
            ..declarative()
        }
    }

    #[test]
    fn the_pusher_encrypts_the_payload_the_dispatcher_wrote_byte_for_byte() {
        for payload in [full_payload(), Payload::new("t", "b")] {
            let sent = push(payload.clone());
            let read: PushRequest<RawPayload> = decode(&encode(&sent)).unwrap();
            assert_eq!(read.payload.json(), serde_json::to_vec(&payload).unwrap());
            assert_eq!(read.payload.valid_until(), payload.valid_until);
            assert_eq!(read.outbox_id, sent.outbox_id);
            // Written again (a test's or a bench's relay), it is the same request.
            assert_eq!(decode::<PushRequest>(&encode(&read)).unwrap(), sent);
        }
    }

    #[test]
    fn a_request_the_dispatcher_renders_once_is_the_request_it_rendered_twice() {
        for payload in [full_payload(), Payload::new("t", "b")] {
            let sent = push(payload.clone());
            // The same request (its ids are the only fields `push` makes anew) rendered once.
            let mut rendered = push(RawPayload::from(&payload));
            rendered.outbox_id = sent.outbox_id;
            rendered.members.clone_from(&sent.members);
            assert_eq!(
                rendered.payload.raw().get(),
                serde_json::to_string(&payload).unwrap()
            );
            assert_eq!(rendered.payload.valid_until(), payload.valid_until);
            assert_eq!(encode(&rendered), encode(&sent));
        }
    }

    #[test]
    fn a_payload_that_is_not_a_notification_is_refused() {
        let json = serde_json::to_value(push(full_payload())).unwrap();
        let with = |payload: serde_json::Value| {
            let mut j = json.clone();
            j["payload"] = payload;
            decode::<PushRequest<RawPayload>>(j.to_string().as_bytes())
        };
        assert!(with(serde_json::json!({"title": "t", "body": "b"})).is_ok());
        assert!(with(serde_json::json!({"title": "t", "body": "b", "new_key": [1]})).is_ok());
        for bad in [
            serde_json::json!("a string"),
            serde_json::json!(42),
            serde_json::json!({"title": "t"}),
            serde_json::json!({"title": 42, "body": "b"}),
            serde_json::json!({"title": "t", "body": "b", "valid_until": "soon"}),
        ] {
            let err = with(bad.clone()).expect_err(&bad.to_string());
            assert!(err.to_string().contains("payload"), "{bad}: {err}");
        }
    }
}
