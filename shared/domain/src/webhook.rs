//! What a webhook says: the JSON body an API client's endpoint receives, built by the dispatcher
//! from the value it re-checked right before sending (docs/webhooks.md shows one).
//!
//! The envelope is the one Standard Webhooks recommends (`type`, `timestamp`, `data`). `data`
//! holds both the value detection saw and the value re-checked at send time, with `observed_at`
//! and `valid_until`, so a receiver can tell how fresh the statement is and until when it may
//! show it as current, and the text a person would read.

use crate::messages::Payload;
use crate::names::names;
use crate::trigger::{Observation, Trigger};
use crate::{OutboxId, WatchId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

names! {
    /// What happened, as the webhook's `type`.
    pub enum EventType("webhook event type") {
        /// A watch's trigger holds at the re-checked value.
        Triggered = "watch.triggered",
        /// A notification sent earlier stopped being true; this one corrects it.
        Withdrawn = "watch.withdrawn",
        /// A reader's digest: every member's `watch.triggered` data in one event
        /// ([`crate::digest::DigestEvent`]).
        Digest = "watch.digest",
    }
}

/// The body of one webhook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When the event was made (the dispatch).
    pub timestamp: DateTime<Utc>,
    pub data: EventData,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventData {
    /// The outbox row: the same as the `webhook-id` header, stable across retries.
    pub id: OutboxId,
    pub watch_id: WatchId,
    pub item: String,
    pub trigger: Trigger,
    /// The value the detector saw when the trigger first held.
    pub detected: Observation,
    /// The value re-checked right before this webhook was sent: what it states.
    pub checked: Observation,
    /// When `checked` was observed.
    pub observed_at: DateTime<Utc>,
    /// Until when the statement may be shown as current.
    pub valid_until: DateTime<Utc>,
    /// The notification a person would read, in the endpoint's locale.
    pub title: String,
    pub text: String,
    /// For `watch.withdrawn`: the earlier notification this one corrects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraws: Option<OutboxId>,
}

/// What [`Event::new`] is made from.
pub struct Facts<'a> {
    pub id: OutboxId,
    pub watch_id: WatchId,
    pub item: &'a str,
    pub trigger: &'a Trigger,
    pub detected: Observation,
    pub checked: &'a Observation,
    pub valid_until: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

impl Event {
    /// The event for a row about to be sent, carrying the text its `payload` renders.
    pub fn new(facts: Facts<'_>, payload: &Payload) -> Self {
        Event {
            kind: match payload.withdraws {
                Some(_) => EventType::Withdrawn,
                None => EventType::Triggered,
            },
            timestamp: facts.now,
            data: EventData {
                id: facts.id,
                watch_id: facts.watch_id,
                item: facts.item.to_owned(),
                trigger: facts.trigger.clone(),
                detected: facts.detected,
                checked: facts.checked.clone(),
                observed_at: facts.checked.observed_at,
                valid_until: facts.valid_until,
                title: payload.title.clone(),
                text: payload.body.clone(),
                withdraws: payload.withdraws,
            },
        }
    }

    /// The body as sent and signed.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(trigger: &'a Trigger, checked: &'a Observation) -> Facts<'a> {
        let now = checked.observed_at;
        Facts {
            id: OutboxId::new(),
            watch_id: WatchId::new(),
            item: "SKU-1",
            trigger,
            detected: Observation::on_sale(1500, "EUR", now - chrono::Duration::seconds(30)),
            checked,
            valid_until: now + chrono::Duration::minutes(30),
            now,
        }
    }

    #[test]
    fn the_body_states_the_rechecked_value_and_until_when_it_is_current() {
        let checked = Observation::on_sale(1190, "EUR", Utc::now());
        let trigger = Trigger::PriceBelow { threshold: 1200 };
        let f = facts(&trigger, &checked);
        let (id, valid_until) = (f.id, f.valid_until);
        let event = Event::new(f, &Payload::new("Below 12.00", "Now 11.90"));
        let json: serde_json::Value = serde_json::from_str(&event.to_json()).unwrap();
        assert_eq!(json["type"], "watch.triggered");
        assert_eq!(json["data"]["id"], id.to_string());
        assert_eq!(json["data"]["checked"]["price"], 1190);
        assert_eq!(json["data"]["detected"]["price"], 1500);
        assert_eq!(json["data"]["trigger"]["kind"], "price_below");
        assert_eq!(json["data"]["text"], "Now 11.90");
        assert_eq!(
            json["data"]["valid_until"],
            serde_json::to_value(valid_until).unwrap()
        );
        assert!(json["data"].get("withdraws").is_none());
        let back: Event = serde_json::from_str(&event.to_json()).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn a_withdrawal_is_its_own_event_type_naming_what_it_corrects() {
        let checked = Observation::on_sale(1300, "EUR", Utc::now());
        let trigger = Trigger::PriceBelow { threshold: 1200 };
        let earlier = OutboxId::new();
        let mut payload = Payload::new("No longer below 12.00", "Now 13.00");
        payload.withdraws = Some(earlier);
        let event = Event::new(facts(&trigger, &checked), &payload);
        assert_eq!(event.kind, EventType::Withdrawn);
        assert_eq!(event.data.withdraws, Some(earlier));
    }
}
