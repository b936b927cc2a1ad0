//! Digests. At a reader's digest time the rows held for it are claimed together
//! (`tidings_store::claim::claim_digests`) and re-checked in one batch like any send; those still
//! true go out as one message, sent for the lowest-id member (the leader). Each member row is
//! marked `sending` with its own attempt and names the leader (`digest_of`). The leader's
//! PushRequest carries the others, the pusher hands them back in its result, and the result is
//! applied to every member in one transaction (`results`); the sweeper decides a digest's rows
//! together too (`sweeper`). So a digest is idempotent exactly as a single send is: one message
//! id, one delivery-log entry, one result. Decided here without I/O.

use chrono::{DateTime, Duration, Utc};
use chrono_tz::Tz;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use tidings_domain::dedup::parse_time_zone;
use tidings_domain::digest::{self, DigestEvent, Line};
use tidings_domain::holding::Digest;
use tidings_domain::messages::{
    Member, Payload, PushRequest, RawPayload, Target, Urgency, WebhookCall,
};
use tidings_domain::outbox::{Event, Status};
use tidings_domain::texts::Lang;
use tidings_domain::trigger::Observation;
use tidings_domain::webhook;
use tidings_domain::{DeviceId, OutboxId, WatchId, validity};
use tidings_runtime::telemetry;
use tidings_store::claim::{Destination, WatchState};
use tidings_store::transition::Change;

use crate::config::Settings;
use crate::plan::{self, Guarded, Plan, Request, Unsigned};

/// The digest schedule `w`'s notifications follow, in its reader's time zone; none for an urgent
/// watch (which a change of preferences released into the digest claim: it goes alone).
fn schedule(w: &WatchState) -> Option<(Digest, Tz)> {
    if w.urgent {
        return None;
    }
    let digest = w.preferences.rules().ok()?.digest?;
    Some((digest, parse_time_zone(&w.time_zone).unwrap_or(Tz::UTC)))
}

/// Folds each reader's rows planned for sending into one digest request, sent for the leader;
/// returns each digest's size. Rows of an urgent watch, of one whose reader no longer has a
/// digest, and withdrawals go alone, as planned. A reader whose rows all ended gets nothing:
/// each row was dropped with its reason by the re-check.
pub fn fold(
    plan: &mut Plan,
    guarded: &[Guarded<'_>],
    watches: &HashMap<WatchId, WatchState>,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Vec<usize> {
    // Every digested row's reader, also of those the re-check could not decide (retried).
    let reader_of: HashMap<OutboxId, DeviceId> = (guarded.iter())
        .filter(|g| g.row.withdraws.is_none())
        .filter(|g| watches.get(&g.row.watch_id).and_then(schedule).is_some())
        .map(|g| (g.row.id, g.row.device_id))
        .collect();
    // Those still to send, by reader.
    let mut readers: BTreeMap<DeviceId, Vec<&Guarded<'_>>> = BTreeMap::new();
    for g in guarded {
        if let Some(reader) = reader_of.get(&g.row.id)
            && plan.requests.contains_key(&g.row.id)
        {
            readers.entry(*reader).or_default().push(g);
        }
    }
    let mut sizes = Vec::new();
    // Each member's leader, written on the members' changes in one pass at the end.
    let mut led: HashMap<OutboxId, OutboxId> = HashMap::new();
    for (device, mut members) in readers {
        members.sort_by_key(|g| g.row.id);
        match request(plan, device, &members, watches, settings, now) {
            Ok(request) => {
                let leader = request.outbox_id;
                for g in &members {
                    plan.requests.remove(&g.row.id);
                    led.insert(g.row.id, leader);
                }
                sizes.push(members.len());
                plan.requests.insert(leader, request);
            }
            Err(unsigned) => unsent(plan, &members, unsigned, settings, now),
        }
    }
    for c in plan.changes.iter_mut() {
        if let Some(leader) = led.get(&c.id) {
            c.digest_of = Some(*leader);
        }
    }
    retry_together(&mut plan.changes, |id| reader_of.get(&id));
    sizes
}

/// Each row of the digests `(leader, other rows)`, with its leader (itself for the leader).
pub fn leaders<M: IntoIterator<Item = OutboxId>>(
    digests: impl IntoIterator<Item = (OutboxId, M)>,
) -> HashMap<OutboxId, OutboxId> {
    (digests.into_iter())
        .flat_map(|(leader, members)| {
            (members.into_iter().chain([leader])).map(move |id| (id, leader))
        })
        .collect()
}

/// Rows of one digest sent back to `retry` together come back together: each group's retry time
/// becomes the latest of its rows', so none returns before its own backoff and the digest claim
/// takes them again as one message. Jittered one by one, they came due over seconds, and the
/// claim (every second) sent the reader one digest in several.
pub fn retry_together<K: Eq + Hash>(changes: &mut [Change], group: impl Fn(OutboxId) -> Option<K>) {
    let retried = |c: &Change| c.transition.to == Status::Retry && c.next_attempt_at.is_some();
    let mut latest: HashMap<K, DateTime<Utc>> = HashMap::new();
    for c in changes.iter().filter(|c| retried(c)) {
        if let (Some(key), Some(at)) = (group(c.id), c.next_attempt_at) {
            let at_latest = latest.entry(key).or_insert(at);
            *at_latest = (*at_latest).max(at);
        }
    }
    for c in changes.iter_mut().filter(|c| retried(c)) {
        if let Some(at) = group(c.id).and_then(|key| latest.get(&key)) {
            c.next_attempt_at = Some(*at);
        }
    }
}

/// A digest that cannot be signed or written is not sent: its rows wait (retried) as a single
/// row would, and say why.
fn unsent(
    plan: &mut Plan,
    members: &[&Guarded<'_>],
    unsigned: Unsigned,
    settings: &Settings,
    now: DateTime<Utc>,
) {
    let error = telemetry::with_causes(&unsigned);
    tracing::error!(outbox_id = %members[0].row.id, members = members.len(), error, "a digest is held: it cannot be signed or written");
    plan.unsigned.push(unsigned.key().to_owned());
    let ids: HashSet<OutboxId> = members.iter().map(|g| g.row.id).collect();
    plan.changes.retain(|c| !ids.contains(&c.id));
    for g in members {
        plan.requests.remove(&g.row.id);
        let c = plan::change(g.row, Event::Transient, Some(error.clone()), settings, now);
        plan.changes.push(c);
    }
}

/// The one request for `members` (by id; the first leads): the digest's notification, to the
/// reader's channel, replaced by the next digest (its Topic) and kept no longer than until then.
fn request(
    plan: &Plan,
    device: DeviceId,
    members: &[&Guarded<'_>],
    watches: &HashMap<WatchId, WatchState>,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Result<Request, Unsigned> {
    let leader = members[0];
    let ids: HashSet<OutboxId> = members.iter().map(|g| g.row.id).collect();
    let changes: HashMap<OutboxId, &tidings_store::transition::Change> = (plan.changes.iter())
        .filter(|c| ids.contains(&c.id))
        .map(|c| (c.id, c))
        .collect();
    let requests: Vec<&Request> = (members.iter())
        .filter_map(|g| plan.requests.get(&g.row.id))
        .collect();
    // What the re-check found, as the change that sends each row records it.
    let seen: Vec<Option<&Observation>> = (members.iter())
        .map(|g| changes.get(&g.row.id)?.sent_value.as_ref())
        .collect();
    let lines: Vec<Line<'_>> = (members.iter().zip(&seen).zip(&requests))
        .filter_map(|((g, now_seen), r)| {
            Some(Line {
                id: g.row.id,
                item: watches.get(&g.row.watch_id)?.item_code.as_str(),
                now: (*now_seen)?,
                valid_until: r.payload.valid_until().unwrap_or(r.deadline),
            })
        })
        .collect();
    let payload = digest::payload(&lines, device, leader.locale);
    let base = requests[0];
    let target = target(leader, &requests, &payload, settings, now)?;
    // Kept for an offline device until the next digest replaces it, and never past the first
    // member's validity.
    let next = (watches.get(&leader.row.watch_id).and_then(schedule))
        .map_or(now + Duration::hours(1), |(d, tz)| d.next(now, tz));
    let until = payload.valid_until.map_or(next, |v| v.min(next));
    let others = (members.iter().skip(1))
        .filter_map(|g| {
            Some(Member {
                id: g.row.id,
                attempt: changes.get(&g.row.id)?.transition.attempt,
                day: g.row.dedup_day,
            })
        })
        .collect();
    Ok(PushRequest {
        deadline: requests
            .iter()
            .map(|r| r.deadline)
            .min()
            .unwrap_or(base.deadline),
        ttl: validity::ttl(until, now, settings.push_ttl).unwrap_or(0),
        urgency: Urgency::Low,
        topic: digest::topic(device),
        payload: RawPayload::from(&payload),
        target,
        members: others,
        ..base.clone()
    })
}

/// Where the digest goes: the reader's browser, as each member would; its endpoint with one
/// `watch.digest` event carrying every member's data, signed as a single event is; or its
/// mailbox, one mail.
fn target(
    leader: &Guarded<'_>,
    requests: &[&Request],
    payload: &Payload,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Result<Target, Unsigned> {
    Ok(match leader.subscription {
        Destination::WebPush(_) => requests[0].target.clone(),
        Destination::Webhook(endpoint) => {
            let events: Vec<webhook::EventData> = (requests.iter())
                .filter_map(|r| match &r.target {
                    Target::Webhook(call) => serde_json::from_str::<webhook::Event>(&call.body)
                        .ok()
                        .map(|e| e.data),
                    _ => None,
                })
                .collect();
            let body = DigestEvent::new(payload, events, now).to_json();
            let (id, timestamp) = (leader.row.id.to_string(), now.timestamp());
            let keys = settings.webhook_secret_keys.as_deref();
            let signature = plan::signature(endpoint, keys, leader.row.id, |secret| {
                secret.sign(&id, timestamp, body.as_bytes())
            })?;
            Target::Webhook(WebhookCall {
                url: endpoint.url.clone(),
                timestamp,
                signature,
                body,
            })
        }
        Destination::Email(mailbox) => {
            let lang = Lang::of(leader.locale.unwrap_or_default());
            let mail = plan::mail(leader, mailbox, settings, now, |tz, links| {
                digest::mail(payload, lang, tz, links)
            })?;
            Target::Email(mail)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_domain::outbox::{self, Row};

    /// Row `n` of a batch: sent back to retry `at_secs` from now, or (`None`) sent.
    fn change(n: u128, at_secs: Option<i64>, now: DateTime<Utc>) -> Change {
        let row = Row {
            status: Status::Sending,
            retry_count: 0,
            attempt: 1,
        };
        let event = if at_secs.is_some() {
            Event::Transient
        } else {
            Event::Delivered
        };
        let t = outbox::apply(row, event, 5).expect("legal from sending");
        let mut c = Change::new(OutboxId(uuid::Uuid::from_u128(n)), now.date_naive(), row, t);
        c.next_attempt_at = at_secs.map(|s| now + Duration::seconds(s));
        c
    }

    #[test]
    fn a_digests_retried_rows_come_back_together_at_the_latest_of_their_times() {
        let now = Utc::now();
        let mut changes = vec![
            change(1, Some(28), now),
            change(2, Some(33), now),
            change(3, Some(30), now),
            change(4, None, now),
            change(5, Some(27), now),
            change(6, Some(31), now),
            change(7, Some(29), now),
        ];
        // Rows 1–4 are one digest, 5 and 6 another; 7 is alone.
        let group = |id: OutboxId| match id.0.as_u128() {
            1..=4 => Some('a'),
            5 | 6 => Some('b'),
            _ => None,
        };
        retry_together(&mut changes, group);
        let at: Vec<Option<i64>> = (changes.iter())
            .map(|c| c.next_attempt_at.map(|t| (t - now).num_seconds()))
            .collect();
        assert_eq!(
            at,
            [
                Some(33),
                Some(33),
                Some(33),
                None,
                Some(31),
                Some(31),
                Some(29)
            ],
            "each digest's rows at the latest of its times; a sent row and a lone row as they were"
        );
    }
}
