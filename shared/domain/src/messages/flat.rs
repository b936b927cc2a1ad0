//! Reading the two messages whose wire shape is flat: a [`PushRequest`] carries its target as
//! one of the keys `subscription`, `webhook` or `mail` beside its own fields, and a [`Payload`]
//! carries its Declarative Web Push envelope (`web_push`, `notification`, `mutable`) beside its
//! own. serde's `flatten` writes these shapes well but reads them slowly: it first copies every
//! key and value it does not recognise into a buffer of its own, with an allocation per string,
//! and then reads the target or envelope out of that buffer. The pusher decodes every request it
//! delivers, so these structs name every key and are read in one pass. The conversions build
//! each type with every field named, so a field added to either fails to compile here until it
//! is read too.

use super::{
    Declarative, DeclarativeNotification, MailCall, Member, Payload, PushRequest, Subscription,
    Target, Urgency, WebhookCall,
};
use crate::OutboxId;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;

/// A [`PushRequest`] as it is read: exactly one of `subscription`, `webhook` and `mail`.
#[derive(Deserialize)]
pub(super) struct FlatPushRequest<P> {
    v: u32,
    outbox_id: OutboxId,
    attempt: u32,
    deadline: DateTime<Utc>,
    #[serde(default)]
    subscription: Option<Subscription>,
    #[serde(default)]
    webhook: Option<WebhookCall>,
    #[serde(default)]
    mail: Option<MailCall>,
    payload: P,
    ttl: u32,
    urgency: Urgency,
    topic: String,
    #[serde(default)]
    dedup_day: Option<NaiveDate>,
    #[serde(default)]
    recall: Option<String>,
    #[serde(default)]
    traceparent: Option<String>,
    #[serde(default)]
    members: Vec<Member>,
}

/// A request whose target keys are missing or more than one.
#[derive(Debug, thiserror::Error)]
#[error("a push request names {0} of its targets (subscription, webhook, mail); it names one")]
pub(super) struct TargetCount(usize);

impl<P> TryFrom<FlatPushRequest<P>> for PushRequest<P> {
    type Error = TargetCount;

    fn try_from(f: FlatPushRequest<P>) -> Result<Self, TargetCount> {
        let target = match (f.subscription, f.webhook, f.mail) {
            (Some(s), None, None) => Target::WebPush(s),
            (None, Some(w), None) => Target::Webhook(w),
            (None, None, Some(m)) => Target::Email(m),
            (s, w, m) => {
                let named = usize::from(s.is_some()) + usize::from(w.is_some());
                return Err(TargetCount(named + usize::from(m.is_some())));
            }
        };
        Ok(PushRequest {
            v: f.v,
            outbox_id: f.outbox_id,
            attempt: f.attempt,
            deadline: f.deadline,
            target,
            payload: f.payload,
            ttl: f.ttl,
            urgency: f.urgency,
            topic: f.topic,
            dedup_day: f.dedup_day,
            recall: f.recall,
            traceparent: f.traceparent,
            members: f.members,
        })
    }
}

/// A [`Payload`] as it is read. Its envelope is kept only when all three of its keys are there,
/// as before: a payload without one is shown by the service worker alone.
#[derive(Deserialize)]
pub(super) struct FlatPayload {
    title: String,
    body: String,
    #[serde(default)]
    id: Option<OutboxId>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    observed_at: Option<DateTime<Utc>>,
    #[serde(default)]
    valid_until: Option<DateTime<Utc>>,
    #[serde(default)]
    withdraws: Option<OutboxId>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    data: serde_json::Value,
    #[serde(default)]
    web_push: Option<u16>,
    #[serde(default)]
    notification: Option<DeclarativeNotification>,
    #[serde(default)]
    mutable: Option<bool>,
}

impl From<FlatPayload> for Payload {
    fn from(f: FlatPayload) -> Self {
        let declarative = match (f.web_push, f.notification, f.mutable) {
            (Some(web_push), Some(notification), Some(mutable)) => Some(Declarative {
                web_push,
                notification,
                mutable,
            }),
            _ => None,
        };
        Payload {
            title: f.title,
            body: f.body,
            id: f.id,
            tag: f.tag,
            observed_at: f.observed_at,
            valid_until: f.valid_until,
            withdraws: f.withdraws,
            url: f.url,
            data: f.data,
            declarative,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{decode, encode};
    use super::*;
    use serde_json::{Value, json};

    pub(in crate::messages) fn request<P>(target: Target, payload: P) -> PushRequest<P> {
        PushRequest {
            v: super::super::VERSION,
            outbox_id: OutboxId::new(),
            attempt: 2,
            deadline: DateTime::UNIX_EPOCH,
            target,
            payload,
            ttl: 60,
            urgency: Urgency::Low,
            topic: "t".into(),
            dedup_day: None,
            recall: Some("https://push.example/m/1".into()),
            traceparent: None,
            members: vec![Member {
                id: OutboxId::new(),
                attempt: 1,
                day: NaiveDate::MIN,
            }],
        }
    }

    pub(in crate::messages) fn declarative() -> Payload {
        let notification = DeclarativeNotification {
            title: "SKU-1".into(),
            body: "Now 10.50".into(),
            navigate: "https://shop.example/i/1".into(),
            tag: Some("w/price_below:1100".into()),
            lang: None,
            timestamp: Some(1_700_000_000_000),
        };
        Payload {
            url: Some("https://shop.example/i/1".into()),
            data: json!({"item": "SKU-1"}),
            declarative: Some(Declarative {
                web_push: Declarative::WEB_PUSH,
                notification,
                mutable: true,
            }),
            ..Payload::new("SKU-1", "Now 10.50")
        }
    }

    #[test]
    fn every_target_and_the_envelope_read_back_as_written() {
        let targets = [
            Target::WebPush(Subscription {
                endpoint: "https://push.example/s/1".into(),
                p256dh: "BK".into(),
                auth: "AA".into(),
            }),
            Target::Webhook(WebhookCall {
                url: "https://hooks.example/in".into(),
                timestamp: 1,
                signature: "v1,abc=".into(),
                body: "{}".into(),
            }),
            Target::Email(MailCall {
                from: "bounce@tidings.invalid".into(),
                to: "a@b.example".into(),
                message: "Subject: x\r\n\r\ny\r\n".into(),
            }),
        ];
        for target in targets {
            let req = request(target, declarative());
            let json: Value = serde_json::from_slice(&encode(&req)).unwrap();
            assert_eq!(json["payload"]["web_push"], 8030, "the envelope is flat");
            assert_eq!(decode::<PushRequest>(&encode(&req)).unwrap(), req);
        }
    }

    #[test]
    fn a_request_with_two_targets_or_none_is_refused() {
        let req = request(
            Target::WebPush(Subscription {
                endpoint: "https://push.example/s/1".into(),
                p256dh: "BK".into(),
                auth: "AA".into(),
            }),
            Payload::new("a", "b"),
        );
        let mut json: Value = serde_json::from_slice(&encode(&req)).unwrap();
        json["mail"] = json!({"from": "f@x.example", "to": "t@x.example", "message": "m"});
        let two = serde_json::from_value::<PushRequest>(json.clone()).unwrap_err();
        assert!(two.to_string().contains("names 2 of its targets"), "{two}");
        let map = json.as_object_mut().unwrap();
        map.remove("mail");
        map.remove("subscription");
        let none = serde_json::from_value::<PushRequest>(json).unwrap_err();
        assert!(
            none.to_string().contains("names 0 of its targets"),
            "{none}"
        );
    }

    #[test]
    fn an_incomplete_envelope_is_no_envelope_and_unknown_keys_are_ignored() {
        let mut json = serde_json::to_value(declarative()).unwrap();
        json["future_field"] = json!([1, 2]);
        let whole: Payload = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(whole, declarative());
        json.as_object_mut().unwrap().remove("mutable");
        let partial: Payload = serde_json::from_value(json).unwrap();
        assert_eq!(partial.declarative, None);
        assert_eq!(partial.url.as_deref(), Some("https://shop.example/i/1"));
    }
}
