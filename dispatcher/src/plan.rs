//! What a dispatch batch will do, decided without I/O.
//!
//! [`guard`] withholds the rows whose watch or subscription says no; [`items`] names what the
//! rest need re-fetched; once the source has answered, [`decide`] re-checks each row against its
//! re-fetched value and returns the state changes to write and the PushRequests to publish for
//! the rows that become `sending`. `dispatch` does the reading, fetching, writing and publishing
//! around these.

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use tidings_domain::dedup::parse_time_zone;
use tidings_domain::mail::MailText;
use tidings_domain::messages::{
    MailCall, Payload, PushRequest, RawPayload, Target, Urgency, VERSION, WebhookCall,
};
use tidings_domain::notification::{Notice, render, withdrawal};
use tidings_domain::outbox::{self, Event, Status};
use tidings_domain::receiver::{Pacing, Release, State};
use tidings_domain::trigger::{Baseline, LastSent, Observation, SourceErrorKind, Trigger};
use tidings_domain::validity;
use tidings_domain::webhook::{self, Facts};
use tidings_domain::withdrawal::Announces;
use tidings_domain::{ItemCode, OutboxId, SubscriptionId, WatchId};
use tidings_runtime::telemetry;
use tidings_sealing::{self as sealed, SecretKeys};
use tidings_signatures::Secret;
use tidings_source::{Fetched, SourceError};

use crate::config::Settings;
use crate::recheck::{self, Decision};
use tidings_email::links::{LinkKey, MailLinks};
use tidings_email::settings::Letter;
use tidings_store::claim::Claimed;
use tidings_store::claim::{Destination, Endpoint, Mailbox, WatchState};
use tidings_store::transition::Change;

/// A row the pre-guards let through, with the subscription it would go to.
pub struct Guarded<'r> {
    pub row: &'r Claimed,
    pub subscription_id: SubscriptionId,
    pub subscription: &'r Destination,
    /// The device's locale, which the notification is written for.
    pub locale: Option<&'r str>,
    /// The device's time zone, which times in the notification are in.
    pub time_zone: &'r str,
}

/// A request as the dispatcher publishes it: its notification rendered to JSON text once. A row
/// sent alone stores that text; a digest's request carries the digest's, rendered for it.
pub use tidings_domain::messages::RawPushRequest as Request;

/// The outcome of [`decide`].
#[derive(Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// For each row planned `sending`, its PushRequest (published only if the write wins).
    pub requests: HashMap<OutboxId, Request>,
    /// For each webhook held because it could not be signed, [`Unsigned::key`].
    pub unsigned: Vec<String>,
}

/// A row held back until its webhook endpoint's circuit or pace lets it go: (row, dedup day,
/// until).
pub type Held = (OutboxId, chrono::NaiveDate, DateTime<Utc>);

/// What [`guard`] decided: rows to re-check, rows withheld, rows held back, the half-open
/// endpoints a probe goes to now (with how long their other rows wait for its answer), and the
/// paced endpoints that let rows go now (with when their next may).
#[derive(Default)]
pub struct Guards<'r> {
    pub guarded: Vec<Guarded<'r>>,
    pub withheld: Vec<Change>,
    pub held: Vec<Held>,
    pub probes: Vec<(SubscriptionId, DateTime<Utc>)>,
    pub paced: Vec<(SubscriptionId, DateTime<Utc>)>,
}

/// Whether a webhook row goes now.
enum Gate {
    Go,
    /// It goes as its half-open endpoint's probe.
    Probe,
    Hold(DateTime<Utc>),
}

/// The webhook endpoints' gates through one batch: the circuit first (open: hold; half-open: one
/// probe, the rest wait for its answer), then the pace (what its next slot lets go).
struct Gates {
    now: DateTime<Utc>,
    probe_wait: DateTime<Utc>,
    pacing: Pacing,
    probes: Vec<(SubscriptionId, DateTime<Utc>)>,
    /// Per paced endpoint: its rows in this batch, then what its slot lets go.
    paced: HashMap<SubscriptionId, (usize, Option<Release>)>,
}

impl Gates {
    fn gate(&mut self, sub: SubscriptionId, endpoint: &Endpoint) -> Gate {
        match endpoint.health.circuit.state(self.now) {
            State::Open { until } => return Gate::Hold(until),
            State::HalfOpen if self.probes.iter().any(|(s, _)| *s == sub) => {
                return Gate::Hold(self.probe_wait);
            }
            State::HalfOpen => {
                self.probes.push((sub, self.probe_wait));
                return Gate::Probe;
            }
            State::Closed => {}
        }
        let pace = endpoint.health.pace;
        let Some((waiting, release)) = self.paced.get_mut(&sub) else {
            return Gate::Go;
        };
        let r = release.get_or_insert_with(|| self.pacing.release(pace, *waiting, self.now));
        match (r.go, r.next) {
            (0, Some(next)) => Gate::Hold(next),
            (_, None) => Gate::Go,
            (_, Some(_)) => {
                r.go -= 1;
                Gate::Go
            }
        }
    }
}

/// Pre-guards first, so the source is asked only about rows that could still be sent. Rows of a
/// webhook endpoint whose circuit is open are held back, neither fetched nor changed. Once its
/// pause is over the circuit is half-open: one row goes as a probe and the endpoint's other rows
/// wait (a row's lease) for its answer, which closes the circuit or opens it for twice as long.
/// A paced endpoint's rows go as its pace allows; the rest wait for its next slot.
pub fn guard<'r>(
    rows: &'r [Claimed],
    watches: &'r HashMap<WatchId, WatchState>,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Guards<'r> {
    let mut g = Guards::default();
    let mut gates = Gates {
        now,
        probe_wait: now + settings.sending_lease,
        pacing: settings.webhook_pacing,
        probes: Vec::new(),
        paced: HashMap::new(),
    };
    let checked: Vec<_> = (rows.iter())
        .map(|row| (row, recheck::pre_guard(watches.get(&row.watch_id))))
        .collect();
    for (_, pre) in &checked {
        if let Ok((sub, Destination::Webhook(e))) = pre
            && e.health.pace.per_second.is_some()
        {
            gates.paced.entry(*sub).or_default().0 += 1;
        }
    }
    for (row, pre) in checked {
        let watch = watches.get(&row.watch_id);
        let (subscription_id, subscription) = match pre {
            Ok(found) => found,
            Err(reason) => {
                g.withheld
                    .push(change(row, Event::Withheld(reason), None, settings, now));
                continue;
            }
        };
        if let Destination::Webhook(endpoint) = subscription
            && let Gate::Hold(until) = gates.gate(subscription_id, endpoint)
        {
            g.held.push((row.id, row.dedup_day, until));
            continue;
        }
        // Nothing is mailed to an address before its owner confirms it: its rows wait, pending.
        if let Destination::Email(mailbox) = subscription
            && mailbox.unconfirmed
        {
            let wait = chrono::Duration::from_std(settings.unconfirmed_wait).unwrap_or_default();
            g.held.push((row.id, row.dedup_day, now + wait));
            continue;
        }
        g.guarded.push(Guarded {
            row,
            subscription_id,
            subscription,
            locale: watch.and_then(|w| w.locale.as_deref()),
            time_zone: watch.map_or("", |w| w.time_zone.as_str()),
        });
    }
    g.probes = gates.probes;
    g.paced = (gates.paced.into_iter())
        .filter_map(|(sub, (_, r))| Some((sub, r?.next?)))
        .collect();
    g
}

/// Holds the probe rows of endpoints whose probe another dispatcher (or worker) won meanwhile
/// (`won`: those this one won): they wait for that probe's answer like the endpoint's other rows.
pub fn probes_lost(g: &mut Guards<'_>, won: &[SubscriptionId]) {
    let lost: Vec<(SubscriptionId, DateTime<Utc>)> = (g.probes.iter())
        .filter(|(sub, _)| !won.contains(sub))
        .copied()
        .collect();
    if lost.is_empty() {
        return;
    }
    let mut held = Vec::new();
    g.guarded.retain(
        |r| match lost.iter().find(|(s, _)| *s == r.subscription_id) {
            Some((_, until)) => {
                held.push((r.row.id, r.row.dedup_day, *until));
                false
            }
            None => true,
        },
    );
    g.held.extend(held);
    g.probes.retain(|(sub, _)| won.contains(sub));
}

/// The item a guarded row needs re-fetched (none when its code does not parse: `decide`
/// withholds it as not found).
pub fn item_of(g: &Guarded<'_>, watches: &HashMap<WatchId, WatchState>) -> Option<ItemCode> {
    ItemCode::parse(&watches.get(&g.row.watch_id)?.item_code).ok()
}

/// The items the guarded rows need re-fetched.
pub fn items(guarded: &[Guarded<'_>], watches: &HashMap<WatchId, WatchState>) -> Vec<ItemCode> {
    guarded.iter().filter_map(|g| item_of(g, watches)).collect()
}

/// Re-checks each guarded row against its re-fetched value (`now`: when the source answered,
/// the start of the freshness bound).
pub fn decide(
    guarded: &[Guarded<'_>],
    watches: &HashMap<WatchId, WatchState>,
    last_sent: &HashMap<(WatchId, String), LastSent>,
    fetched: &HashMap<ItemCode, Fetched>,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Plan {
    let mut plan = Plan::default();
    for g in guarded {
        let row = g.row;
        // Keys are written by ingest from a valid trigger; one this build cannot read is kept
        // for an operator (retried, then failed with the key in last_error), never guessed at.
        let Some(announces) = row.trigger.announces.clone() else {
            let error = format!("unknown trigger key {:?}", row.trigger.key);
            plan.changes
                .push(change(row, Event::Transient, Some(error), settings, now));
            continue;
        };
        let (item, answer) = answer_for(row, watches, fetched);
        let last = last_sent.get(&(row.watch_id, row.trigger_key().to_owned()));
        let decision = recheck_row(row, &announces, last, &answer);
        let (trigger, withdrawn) = match &announces {
            Announces::Holds(t) => (t, None),
            Announces::Ended(t) => (t, last.zip(row.withdraws)),
        };
        match (decision, item) {
            (Decision::Withhold { reason, checked }, _) => {
                let mut c = change(row, Event::Withheld(reason), None, settings, now);
                c.checked = checked;
                plan.changes.push(c);
            }
            (Decision::Transient { error }, _) => {
                plan.changes
                    .push(change(row, Event::Transient, Some(error), settings, now));
            }
            (
                Decision::Send {
                    observation,
                    baseline,
                },
                Ok(code),
            ) => {
                let checked = Checked {
                    trigger,
                    code: &code,
                    observation: &observation,
                    baseline: &baseline,
                    withdrawn,
                };
                send(&mut plan, g, checked, settings, now);
            }
            // An unparsable item code was classified not_found above, so it never holds.
            (Decision::Send { .. }, Err(_)) => {}
        }
    }
    plan
}

/// Names, in each withdrawal's PushRequest, the push service's message of the row it withdraws
/// (`recalls`, by that row's id), which the pusher asks the push service to delete first.
pub fn recall(plan: &mut Plan, rows: &[Claimed], recalls: &HashMap<OutboxId, String>) {
    for row in rows {
        let location = row.withdraws.and_then(|id| recalls.get(&id));
        if let (Some(location), Some(request)) = (location, plan.requests.get_mut(&row.id)) {
            request.recall = Some(location.clone());
        }
    }
}

/// The re-check of `row`, which `announces` a trigger that holds or (a withdrawal) one that
/// ended, against the last send of its watch and trigger and the source's answer.
fn recheck_row(
    row: &Claimed,
    announces: &Announces,
    last: Option<&LastSent>,
    answer: &Fetched,
) -> Decision {
    match announces {
        Announces::Holds(t) => recheck::recheck(t, &row.baseline(), row.detected_at, last, answer),
        Announces::Ended(t) => {
            recheck::recheck_withdrawal(t, &row.baseline(), row.withdraws, last, answer)
        }
    }
}

/// The row's item and the source's answer for it: an unparsable code is `not_found`, an item
/// the fetch has no answer for `unavailable`.
fn answer_for(
    row: &Claimed,
    watches: &HashMap<WatchId, WatchState>,
    fetched: &HashMap<ItemCode, Fetched>,
) -> (
    Result<ItemCode, tidings_domain::item::InvalidItemCode>,
    Fetched,
) {
    let item_code = watches
        .get(&row.watch_id)
        .map(|w| w.item_code.as_str())
        .unwrap_or_default();
    let item = ItemCode::parse(item_code);
    let answer: Fetched = match &item {
        Ok(code) => fetched.get(code).cloned().unwrap_or_else(|| {
            Err(SourceError {
                kind: SourceErrorKind::Unavailable,
                detail: "no answer for item".into(),
            })
        }),
        Err(e) => Err(SourceError {
            kind: SourceErrorKind::NotFound,
            detail: e.to_string(),
        }),
    };
    (item, answer)
}

/// What the re-check found still holds.
struct Checked<'a> {
    trigger: &'a Trigger,
    code: &'a ItemCode,
    observation: &'a Observation,
    baseline: &'a Baseline,
    /// For a withdrawal: what the withdrawn row sent, and its id.
    withdrawn: Option<(&'a LastSent, OutboxId)>,
}

/// Moves the row to `sending` with the notification rendered from the re-fetched value, and
/// plans its PushRequest.
fn send(
    plan: &mut Plan,
    g: &Guarded<'_>,
    checked: Checked<'_>,
    settings: &Settings,
    now: DateTime<Utc>,
) {
    let row = g.row;
    let valid_until = settings
        .validity
        .until(checked.trigger, checked.observation.observed_at);
    // A push that cannot go out while it is still true is not sent at all (the pusher reports
    // it outlived): the deadline never lets it wait past its validity.
    let deadline = (now + settings.push_deadline).min(valid_until);
    let payload = payload_for(g, &checked, valid_until, settings);
    let target = match target(g, &checked, &payload, valid_until, settings, now) {
        Ok(target) => target,
        Err(unsigned) => {
            // Never sent unsigned: the row waits (retried, as for a source that does not
            // answer) until its secret opens again, and says why in its last error.
            let error = telemetry::with_causes(&unsigned);
            tracing::error!(outbox_id = %row.id, error, "a webhook is held: its secret does not open");
            plan.unsigned.push(unsigned.key().to_owned());
            plan.changes
                .push(change(row, Event::Transient, Some(error), settings, now));
            return;
        }
    };
    let mut c = change(row, Event::Dispatched, None, settings, now);
    c.sent_value = Some(checked.observation.clone());
    // Rendered once: the row stores the text the request carries.
    let payload = RawPayload::from(&payload);
    c.payload = Some(payload.raw().to_owned());
    c.subscription_id = Some(g.subscription_id);
    c.deadline = Some(deadline);
    c.lease_until = Some(now + settings.sending_lease);
    plan.requests.insert(
        row.id,
        PushRequest {
            v: VERSION,
            outbox_id: row.id,
            attempt: c.transition.attempt,
            deadline,
            target,
            payload,
            ttl: validity::ttl(valid_until, now, settings.push_ttl).unwrap_or(0),
            urgency: urgency(checked.trigger),
            topic: validity::topic(row.watch_id, checked.trigger),
            dedup_day: Some(row.dedup_day),
            recall: None,
            traceparent: None,
            members: Vec::new(),
        },
    );
    plan.changes.push(c);
}

/// Why a webhook or a mail cannot be signed (or written), so is not sent.
#[derive(Debug, thiserror::Error)]
pub enum Unsigned {
    #[error("subscription {0} has no signing secret")]
    NoSecret(SubscriptionId),
    #[error("the signing secret of subscription {subscription} does not open")]
    Unopened {
        subscription: SubscriptionId,
        #[source]
        source: sealed::Unopened,
    },
    #[error("the signing secret of subscription {subscription} is malformed")]
    Malformed {
        subscription: SubscriptionId,
        #[source]
        source: tidings_signatures::BadSecret,
    },
    #[error(
        "email is off on this dispatcher (set TIDINGS_EMAIL_FROM, TIDINGS_DKIM_KEY_FILE and TIDINGS_PUBLIC_URL)"
    )]
    NoSender,
    #[error("the link key of subscription {subscription} is malformed")]
    LinkKey {
        subscription: SubscriptionId,
        #[source]
        source: tidings_email::links::BadLinkKey,
    },
    #[error("the mail to subscription {subscription} could not be written")]
    Unwritable {
        subscription: SubscriptionId,
        #[source]
        source: tidings_email::settings::WriteError,
    },
}

impl Unsigned {
    /// The `key` label of `tidings_webhook_secrets_unopened_total`: the id of the sealing key
    /// that is missing, or what else is wrong (`none` given, `unsealed`, `corrupt`,
    /// `malformed`, `missing`).
    pub fn key(&self) -> &str {
        match self {
            Unsigned::NoSecret(_) => "missing",
            Unsigned::Malformed { .. } | Unsigned::LinkKey { .. } => "malformed",
            Unsigned::NoSender => "no_sender",
            Unsigned::Unwritable { .. } => "unwritable",
            Unsigned::Unopened { source, .. } => match source {
                sealed::Unopened::UnknownKey(id) => id,
                sealed::Unopened::NoKeys => "none",
                sealed::Unopened::Unsealed => "unsealed",
                sealed::Unopened::Corrupt => "corrupt",
            },
        }
    }
}

/// The secret `stored` holds, opened if it is sealed; why not, naming the subscription, if it
/// cannot be (a key dropped too early or not given to this dispatcher, a secret stored unsealed
/// although keys are given).
fn signing_secret(
    stored: &str,
    keys: Option<&SecretKeys>,
    endpoint: &Endpoint,
) -> Result<Secret, Unsigned> {
    let subscription = endpoint.subscription;
    let opened =
        sealed::open(stored, keys, subscription.0).map_err(|source| Unsigned::Unopened {
            subscription,
            source,
        })?;
    Secret::parse(&opened).map_err(|source| Unsigned::Malformed {
        subscription,
        source,
    })
}

/// The signature of `body`: by the current secret, which must open (else the webhook is not
/// sent), and by a rotated-out one beside it if that opens (else it is left out, logged).
pub(crate) fn signature(
    endpoint: &Endpoint,
    keys: Option<&SecretKeys>,
    row: OutboxId,
    sign: impl Fn(&Secret) -> String,
) -> Result<String, Unsigned> {
    let (current, previous) =
        (endpoint.secrets.split_first()).ok_or(Unsigned::NoSecret(endpoint.subscription))?;
    let mut signed = vec![sign(&signing_secret(current, keys, endpoint)?)];
    for stored in previous {
        match signing_secret(stored, keys, endpoint) {
            Ok(secret) => signed.push(sign(&secret)),
            Err(e) => {
                let error = telemetry::with_causes(&e);
                tracing::warn!(outbox_id = %row, error, "a rotated-out webhook secret does not open; the current one signs alone")
            }
        }
    }
    Ok(signed.join(" "))
}

/// Where `g` goes: its browser's subscription; its endpoint with the event signed by every
/// secret that signs for it now; or its mailbox with the mail written and DKIM-signed. (The
/// signatures are the dispatcher's, so the pusher, the service that talks to the outside, holds
/// no secret.)
fn target(
    g: &Guarded<'_>,
    checked: &Checked<'_>,
    payload: &Payload,
    valid_until: DateTime<Utc>,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Result<Target, Unsigned> {
    let keys = settings.webhook_secret_keys.as_deref();
    match g.subscription {
        Destination::WebPush(sub) => Ok(Target::WebPush(sub.clone())),
        Destination::Email(mailbox) => {
            let notice = notice_for(g, checked, valid_until, settings);
            mail(g, mailbox, settings, now, |tz, links| {
                tidings_domain::mail::render(&notice, tz, links)
            })
            .map(Target::Email)
        }
        Destination::Webhook(endpoint) => {
            let facts = Facts {
                id: g.row.id,
                watch_id: g.row.watch_id,
                item: checked.code.as_str(),
                trigger: checked.trigger,
                detected: g.row.detected(),
                checked: checked.observation,
                valid_until,
                now,
            };
            let body = webhook::Event::new(facts, payload).to_json();
            let id = g.row.id.to_string();
            let timestamp = now.timestamp();
            let signature = signature(endpoint, keys, g.row.id, |secret| {
                secret.sign(&id, timestamp, body.as_bytes())
            })?;
            Ok(Target::Webhook(WebhookCall {
                url: endpoint.url.clone(),
                timestamp,
                signature,
                body,
            }))
        }
    }
}

/// The mail to `mailbox` for row `g`: its words (`render`) in the reader's time zone, its links
/// signed with the subscription's key, DKIM-signed by the sender.
pub(crate) fn mail(
    g: &Guarded<'_>,
    mailbox: &Mailbox,
    settings: &Settings,
    now: DateTime<Utc>,
    render: impl FnOnce(chrono_tz::Tz, &tidings_domain::mail::Links<'_>) -> MailText,
) -> Result<MailCall, Unsigned> {
    let sender = settings.email.as_deref().ok_or(Unsigned::NoSender)?;
    let subscription = mailbox.subscription;
    let keys = settings.webhook_secret_keys.as_deref();
    let opened = sealed::open(&mailbox.link_key, keys, subscription.0).map_err(|source| {
        Unsigned::Unopened {
            subscription,
            source,
        }
    })?;
    let key = LinkKey::parse(&opened).map_err(|source| Unsigned::LinkKey {
        subscription,
        source,
    })?;
    let id = g.row.id.to_string();
    let links = MailLinks::new(&sender.public_url, &key, &id, &subscription.to_string());
    let tz = parse_time_zone(g.time_zone).unwrap_or(chrono_tz::Tz::UTC);
    let text = render(tz, &links.as_links());
    let letter = Letter {
        to: &mailbox.address,
        text: &text,
        id: &id,
        unsubscribe: &links.unsubscribe,
    };
    let message = sender
        .write(letter, now)
        .map_err(|source| Unsigned::Unwritable {
            subscription,
            source,
        })?;
    Ok(MailCall {
        from: sender.envelope.clone(),
        to: mailbox.address.clone(),
        // Composed as 7-bit text: every header encoded (RFC 2047), the bodies quoted-printable.
        message: String::from_utf8_lossy(&message).into_owned(),
    })
}

/// The notice `g` is written from: its trigger at the re-checked value, in its reader's locale.
fn notice_for<'a>(
    g: &'a Guarded<'_>,
    checked: &'a Checked<'_>,
    valid_until: DateTime<Utc>,
    settings: &'a Settings,
) -> Notice<'a> {
    Notice {
        id: g.row.id,
        watch: g.row.watch_id,
        trigger: checked.trigger,
        item: checked.code,
        now: checked.observation,
        baseline: checked.baseline,
        valid_until,
        item_url: settings.item_page_url.as_deref(),
        locale: g.locale,
    }
}

/// The notification `g` goes out with: what its trigger says at the re-checked value, or for a
/// withdrawal what changed since the row it withdraws.
fn payload_for(
    g: &Guarded<'_>,
    checked: &Checked<'_>,
    valid_until: DateTime<Utc>,
    settings: &Settings,
) -> Payload {
    let notice = notice_for(g, checked, valid_until, settings);
    match checked.withdrawn {
        None => render(&notice),
        Some((last, id)) => {
            let sent = Observation {
                price: last.price,
                in_stock: last.in_stock,
                observed_at: last.promise.map_or(last.sent_at, |p| p.observed_at),
                ..checked.observation.clone()
            };
            let tz = parse_time_zone(g.time_zone).unwrap_or(chrono_tz::Tz::UTC);
            withdrawal(&notice, id, &sent, tz)
        }
    }
}

/// The change `event` makes to a claimed row.
pub fn change(
    row: &Claimed,
    event: Event,
    error: Option<String>,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Change {
    let r = row.row();
    let t = match outbox::apply(r, event, settings.retry.max_retries) {
        Ok(t) => t,
        // The claim selects pending and retry rows only, from which every event used here is
        // legal; keeping the row unchanged is the safe answer if that ever stops being true.
        Err(e) => {
            tracing::error!(outbox_id = %row.id, error = %e, "illegal transition planned");
            outbox::Transition {
                to: r.status,
                reason: None,
                retry_count: r.retry_count,
                attempt: r.attempt,
                advances_baseline: false,
                maybe_delivered: false,
            }
        }
    };
    let mut c = Change::new(row.id, row.dedup_day, r, t);
    if t.to == Status::Retry {
        c.next_attempt_at = Some(now + settings.retry.delay(r.retry_count, None));
    }
    if let Some(error) = error {
        tracing::info!(outbox_id = %row.id, watch_id = %row.watch_id, to = %t.to, %error, "transient failure");
        c.last_error = Some(error);
    }
    c
}

fn urgency(trigger: &Trigger) -> Urgency {
    match trigger {
        // Stock comes and goes fast; a price alert can wait for a device's next wake-up.
        Trigger::BackInStock => Urgency::High,
        Trigger::PriceBelow { .. } | Trigger::PriceDrop { .. } => Urgency::Normal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_domain::receiver::{Circuit, Pace};
    use tidings_domain::subjects::Subjects;
    use tidings_domain::trigger::Observation;
    use tidings_domain::withdrawal::TriggerColumn;
    use tidings_domain::{DeviceId, OutboxId};
    use tidings_source::SourceConfig;
    use tidings_store::subscriptions::Health;

    fn settings() -> Settings {
        let subjects = Subjects::new("t").unwrap_or_else(|e| unreachable!("{e}"));
        Settings::new(subjects, SourceConfig::new("http://catalog/{item}"))
    }

    fn row(watch_id: WatchId) -> Claimed {
        let at = Utc::now();
        Claimed {
            id: OutboxId::new(),
            dedup_day: at.date_naive(),
            watch_id,
            device_id: DeviceId::new(),
            channel: tidings_domain::Channel::WebPush,
            status: Status::Pending,
            trigger: TriggerColumn::parse(&Trigger::PriceBelow { threshold: 1200 }.key()),
            detected_at: at,
            detected_price: 1100,
            detected_currency: "EUR".into(),
            detected_in_stock: true,
            detected_paused: false,
            detected_observed_at: at,
            baseline_price: None,
            baseline_reference: None,
            baseline_in_stock: None,
            attempt: 0,
            retry_count: 0,
            traceparent: None,
            next_attempt_at: at,
            withdraws: None,
            held: None,
        }
    }

    fn watch(paused: bool) -> WatchState {
        WatchState {
            item_code: "SKU-1".into(),
            paused,
            device_paused: false,
            removed: false,
            subscription: Some((
                SubscriptionId::new(),
                Destination::WebPush(tidings_domain::messages::Subscription {
                    endpoint: "https://push.example/s".into(),
                    p256dh: "k".into(),
                    auth: "a".into(),
                }),
            )),
            locale: None,
            time_zone: "UTC".into(),
            urgent: false,
            preferences: Default::default(),
        }
    }

    fn priced(price: i64) -> HashMap<ItemCode, Fetched> {
        let code = ItemCode::parse("SKU-1").unwrap_or_else(|e| unreachable!("{e}"));
        let observation = Observation::on_sale(price, "EUR", Utc::now());
        HashMap::from([(code, Ok(observation))])
    }

    /// Guards, then decides against `fetched`, as one dispatch batch of one row does.
    fn plan_one(watch: WatchState, fetched: &HashMap<ItemCode, Fetched>) -> (Vec<Change>, Plan) {
        plan_with(&settings(), watch, fetched)
    }

    fn plan_with(
        s: &Settings,
        watch: WatchState,
        fetched: &HashMap<ItemCode, Fetched>,
    ) -> (Vec<Change>, Plan) {
        let w = WatchId::new();
        let rows = vec![row(w)];
        let watches = HashMap::from([(w, watch)]);
        let now = Utc::now();
        let Guards {
            guarded, withheld, ..
        } = guard(&rows, &watches, s, now);
        let plan = decide(&guarded, &watches, &HashMap::new(), fetched, s, now);
        (withheld, plan)
    }

    #[test]
    fn a_price_back_above_the_limit_is_withheld_with_the_value_seen() {
        let (withheld, plan) = plan_one(watch(false), &priced(1300));
        assert!(withheld.is_empty());
        assert_eq!(plan.changes.len(), 1);
        let c = &plan.changes[0];
        assert_eq!(c.transition.to, Status::Dropped);
        assert_eq!(
            c.transition.reason.map(|r| r.as_str()),
            Some("condition_lost")
        );
        assert_eq!(c.checked.as_ref().map(|o| o.price), Some(1300));
        assert!(plan.requests.is_empty(), "nothing to publish");
    }

    /// The notification a request carries, read back from its rendered text.
    fn sent(request: &Request) -> Payload {
        serde_json::from_slice(request.payload.json()).unwrap_or_else(|e| unreachable!("{e}"))
    }

    #[test]
    fn a_holding_row_goes_out_with_the_refetched_value_and_the_freshness_deadline() {
        let now = Utc::now();
        let (_, plan) = plan_one(watch(false), &priced(1050));
        let c = &plan.changes[0];
        assert_eq!(
            (c.transition.to, c.transition.attempt),
            (Status::Sending, 1)
        );
        assert_eq!(c.sent_value.as_ref().map(|o| o.price), Some(1050));
        let request = &plan.requests[&c.id];
        assert_eq!(sent(request).body, "Now 10.50 EUR (your limit: 12.00 EUR).");
        assert_eq!(
            c.payload.as_ref().map(|p| p.get()),
            Some(request.payload.raw().get()),
            "the row stores the text the request carries"
        );
        assert_eq!(c.deadline, Some(request.deadline));
        let bound = settings().push_deadline;
        assert!(request.deadline >= now + bound);
        assert!(request.deadline <= Utc::now() + bound);
        assert!(
            c.lease_until > c.deadline,
            "the lease outlives the deadline"
        );
    }

    #[test]
    fn a_webhook_carries_the_rechecked_event_signed_by_every_current_secret() {
        use tidings_signatures::{Headers, verify};
        let (old, old_text) = Secret::generate().unwrap_or_else(|e| unreachable!("{e}"));
        let (new, new_text) = Secret::generate().unwrap_or_else(|e| unreachable!("{e}"));
        let mut w = watch(false);
        let sub = SubscriptionId::new();
        w.subscription = Some((
            sub,
            Destination::Webhook(Endpoint {
                subscription: sub,
                url: "https://hooks.example/in".into(),
                secrets: vec![new_text, old_text],
                health: Health::default(),
            }),
        ));
        let (_, plan) = plan_one(w, &priced(1050));
        let c = &plan.changes[0];
        let request = &plan.requests[&c.id];
        let Target::Webhook(call) = &request.target else {
            panic!("a webhook endpoint's row goes out as a webhook: {request:?}");
        };
        assert_eq!(call.url, "https://hooks.example/in");
        let (id, timestamp) = (c.id.to_string(), call.timestamp.to_string());
        let headers = |sig| Headers {
            id: Some(&id),
            timestamp: Some(&timestamp),
            signature: Some(sig),
        };
        let now = Utc::now().timestamp();
        // Either secret verifies it: a receiver mid-rotation holds one or the other.
        for secret in [&new, &old] {
            let found = verify(
                &[std::slice::from_ref(secret)],
                headers(&call.signature),
                call.body.as_bytes(),
                now,
            );
            assert!(found.is_ok(), "{found:?}");
        }
        let event: webhook::Event =
            serde_json::from_str(&call.body).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(event.data.id, c.id);
        assert_eq!(event.data.checked.price, 1050, "the re-checked value");
        assert_eq!(event.data.detected.price, 1100, "the detected value");
        assert_eq!(event.data.text, sent(request).body);
        assert_eq!(Some(event.data.valid_until), request.payload.valid_until());
        let mut tampered = call.body.clone();
        tampered.push(' ');
        assert!(
            verify(
                &[&[new]],
                headers(&call.signature),
                tampered.as_bytes(),
                now
            )
            .is_err()
        );
    }

    /// A secret the api stored sealed signs once opened with the dispatcher's keys. Without
    /// them, or with a secret stored unsealed while keys are given, the webhook is not sent
    /// unsigned: the row waits (retry) and its last error says why. Regression: it was sent
    /// with an empty signature.
    #[test]
    fn a_sealed_secret_signs_once_opened_and_nothing_goes_unsigned() {
        use tidings_signatures::{Headers, verify};
        let keys = SecretKeys::parse("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
            .unwrap_or_else(|e| unreachable!("{e}"));
        let (secret, text) = Secret::generate().unwrap_or_else(|e| unreachable!("{e}"));
        let sub = SubscriptionId::new();
        let stored = keys
            .seal(&text, sub.0)
            .unwrap_or_else(|e| unreachable!("{e}"));
        let mut w = watch(false);
        w.subscription = Some((
            sub,
            Destination::Webhook(Endpoint {
                subscription: sub,
                url: "https://hooks.example/in".into(),
                secrets: vec![stored],
                health: Health::default(),
            }),
        ));
        let call = |s: &Settings| {
            let (_, plan) = plan_with(s, w.clone(), &priced(1050));
            let c = &plan.changes[0];
            match &plan.requests[&c.id].target {
                Target::Webhook(call) => (c.id.to_string(), call.clone()),
                other => panic!("{other:?}"),
            }
        };
        let mut with_keys = settings();
        with_keys.webhook_secret_keys = Some(std::sync::Arc::new(keys));
        let (id, signed) = call(&with_keys);
        let timestamp = signed.timestamp.to_string();
        let headers = Headers {
            id: Some(&id),
            timestamp: Some(&timestamp),
            signature: Some(&signed.signature),
        };
        let now = Utc::now().timestamp();
        let found = verify(&[&[secret]], headers, signed.body.as_bytes(), now);
        assert!(found.is_ok(), "{found:?}");
        let held = |s: &Settings, w: WatchState| {
            let (_, plan) = plan_with(s, w, &priced(1050));
            assert!(plan.requests.is_empty(), "nothing is sent unsigned");
            let c = &plan.changes[0];
            assert_eq!(c.transition.to, Status::Retry);
            c.last_error.clone().unwrap_or_default()
        };
        let no_keys = held(&settings(), w.clone());
        assert!(no_keys.contains("no keys are given"), "{no_keys}");
        let mut plain = w;
        if let Some((_, Destination::Webhook(endpoint))) = &mut plain.subscription {
            endpoint.secrets = vec![text];
        }
        let unsealed = held(&with_keys, plain);
        assert!(unsealed.contains("tidings-api reseal"), "{unsealed}");
    }

    /// `n` rows of one webhook endpoint whose health is `health`.
    fn on_endpoint(
        sub: SubscriptionId,
        health: Health,
        n: usize,
    ) -> (Vec<Claimed>, HashMap<WatchId, WatchState>) {
        let ws: Vec<WatchId> = (0..n).map(|_| WatchId::new()).collect();
        let rows: Vec<Claimed> = ws.iter().map(|w| row(*w)).collect();
        let endpoint = Endpoint {
            subscription: sub,
            url: "https://hooks.example/in".into(),
            secrets: Vec::new(),
            health,
        };
        let watches = (ws.iter())
            .map(|w| {
                let mut state = watch(false);
                state.subscription = Some((sub, Destination::Webhook(endpoint.clone())));
                (*w, state)
            })
            .collect();
        (rows, watches)
    }

    /// A circuit past its pause is half-open: one row goes as the probe and the endpoint's other
    /// rows wait a lease for its answer (regression: every held row went at once, so a receiver
    /// still down got a burst per pause); a closed one lets every row go, an open one none.
    #[test]
    fn a_half_open_endpoint_gets_one_probe_and_its_other_rows_wait() {
        let s = settings();
        let now = Utc::now();
        let sub = SubscriptionId::new();
        let circuit = |opens, open_until| Health {
            circuit: Circuit {
                opens,
                open_until: Some(open_until),
                ..Circuit::default()
            },
            ..Health::default()
        };
        let (rows, watches) = on_endpoint(sub, circuit(1, now - chrono::Duration::seconds(1)), 3);
        let g = guard(&rows, &watches, &s, now);
        let wait = now + s.sending_lease;
        assert_eq!((g.guarded.len(), g.held.len()), (1, 2));
        assert_eq!(g.probes, [(sub, wait)]);
        assert!(g.held.iter().all(|(_, _, until)| *until == wait));
        let (rows, watches) = on_endpoint(sub, circuit(0, now - chrono::Duration::seconds(1)), 3);
        let g = guard(&rows, &watches, &s, now);
        assert_eq!((g.guarded.len(), g.held.len(), g.probes.len()), (3, 0, 0));
        let later = now + chrono::Duration::seconds(20);
        let (rows, watches) = on_endpoint(sub, circuit(2, later), 3);
        let g = guard(&rows, &watches, &s, now);
        assert_eq!((g.guarded.len(), g.probes.len()), (0, 0));
        assert!(g.held.iter().all(|(_, _, until)| *until == later));
    }

    /// Two dispatch workers that both found an endpoint half-open: the one that lost the probe
    /// (the database marked it for the other) holds its row too (regression: two probes 4 ms
    /// apart in one pause, seen in the 2-minute outage test under CI's load).
    #[test]
    fn a_probe_another_worker_won_is_held_not_sent() {
        let s = settings();
        let now = Utc::now();
        let sub = SubscriptionId::new();
        let half_open = Health {
            circuit: Circuit {
                opens: 1,
                open_until: Some(now - chrono::Duration::seconds(1)),
                ..Circuit::default()
            },
            ..Health::default()
        };
        let (rows, watches) = on_endpoint(sub, half_open, 2);
        let mut won = guard(&rows, &watches, &s, now);
        probes_lost(&mut won, &[sub]);
        assert_eq!(
            (won.guarded.len(), won.held.len(), won.probes.len()),
            (1, 1, 1)
        );
        let mut lost = guard(&rows, &watches, &s, now);
        probes_lost(&mut lost, &[]);
        assert_eq!(
            (lost.guarded.len(), lost.held.len(), lost.probes.len()),
            (0, 2, 0)
        );
        let wait = now + s.sending_lease;
        assert!(lost.held.iter().all(|(_, _, until)| *until == wait));
    }

    /// A paced endpoint's rows wait for its `Retry-After`, then go a second's worth at a time,
    /// the rest held until the slot those used ends.
    #[test]
    fn a_paced_endpoint_lets_go_what_its_pace_allows() {
        let s = settings();
        let now = Utc::now();
        let sub = SubscriptionId::new();
        let paced = |until| Health {
            pace: Pace {
                per_second: Some(2.0),
                until: Some(until),
            },
            ..Health::default()
        };
        let later = now + chrono::Duration::seconds(2);
        let (rows, watches) = on_endpoint(sub, paced(later), 5);
        let g = guard(&rows, &watches, &s, now);
        assert_eq!((g.guarded.len(), g.held.len()), (0, 5));
        assert!(g.held.iter().all(|(_, _, until)| *until == later));
        let (rows, watches) = on_endpoint(sub, paced(now), 5);
        let g = guard(&rows, &watches, &s, now);
        let next = now + chrono::Duration::seconds(1);
        assert_eq!((g.guarded.len(), g.held.len()), (2, 3));
        assert!(g.held.iter().all(|(_, _, until)| *until == next));
        assert_eq!(g.paced, [(sub, next)]);
        let (rows, watches) = on_endpoint(sub, Health::default(), 5);
        let g = guard(&rows, &watches, &s, now);
        assert_eq!((g.guarded.len(), g.held.len(), g.paced.len()), (5, 0, 0));
    }

    #[test]
    fn a_paused_watch_is_withheld_before_its_item_is_fetched() {
        let s = settings();
        let w = WatchId::new();
        let rows = vec![row(w)];
        let watches = HashMap::from([(w, watch(true))]);
        let Guards {
            guarded, withheld, ..
        } = guard(&rows, &watches, &s, Utc::now());
        assert!(guarded.is_empty());
        assert!(items(&guarded, &watches).is_empty(), "nothing to fetch");
        assert_eq!(
            withheld[0].transition.reason.map(|r| r.as_str()),
            Some("watch_paused")
        );
    }

    #[test]
    fn a_source_that_does_not_answer_means_a_retry_after_the_backoff() {
        let now = Utc::now();
        let (_, plan) = plan_one(watch(false), &HashMap::new());
        let c = &plan.changes[0];
        assert_eq!(
            (c.transition.to, c.transition.retry_count),
            (Status::Retry, 1)
        );
        let wait = c.next_attempt_at.map(|at| (at - now).num_seconds());
        assert!(
            matches!(wait, Some(26..=34)),
            "first backoff 30 s ± 10 %: {wait:?}"
        );
        assert!(
            c.last_error
                .as_deref()
                .is_some_and(|e| e.contains("no answer"))
        );
    }

    /// Rows of one device's watch `w`, guarded and decided as one batch against `price`.
    fn plan_rows(
        n: usize,
        watch: WatchState,
        price: i64,
    ) -> (Vec<Claimed>, HashMap<WatchId, WatchState>, Plan) {
        let w = WatchId::new();
        let device = DeviceId::new();
        let rows: Vec<Claimed> = (0..n)
            .map(|_| Claimed {
                device_id: device,
                ..row(w)
            })
            .collect();
        let watches = HashMap::from([(w, watch)]);
        let now = Utc::now();
        let s = settings();
        let guards = guard(&rows, &watches, &s, now);
        let plan = decide(
            &guards.guarded,
            &watches,
            &HashMap::new(),
            &priced(price),
            &s,
            now,
        );
        (rows, watches, plan)
    }

    fn preferring(json: serde_json::Value) -> WatchState {
        WatchState {
            preferences: serde_json::from_value(json).unwrap_or_else(|e| unreachable!("{e}")),
            ..watch(false)
        }
    }

    #[test]
    fn a_notification_inside_quiet_hours_waits_for_their_end_unless_urgent_or_a_withdrawal() {
        let now = Utc::now();
        let clock = |t: DateTime<Utc>| t.format("%H:%M:%S").to_string();
        let end = now + chrono::Duration::hours(1);
        let quiet = serde_json::json!({"quiet_hours": {"start": clock(now - chrono::Duration::hours(1)), "end": clock(end)}});
        let (rows, watches, mut plan) = plan_rows(1, preferring(quiet.clone()), 1050);
        let waits = crate::holding::wait(&mut plan, &rows, &watches, HashMap::new(), now);
        assert_eq!(waits.len(), 1);
        assert_eq!(waits[0].held, tidings_domain::holding::Held::QuietHours);
        assert_eq!(
            waits[0].until.timestamp(),
            end.timestamp(),
            "at their end, to the second"
        );
        assert!(
            plan.requests.is_empty() && plan.changes.is_empty(),
            "nothing sent or written as a send"
        );

        let urgent = WatchState {
            urgent: true,
            ..preferring(quiet.clone())
        };
        let (rows, watches, mut plan) = plan_rows(1, urgent, 1050);
        assert!(crate::holding::wait(&mut plan, &rows, &watches, HashMap::new(), now).is_empty());
        assert_eq!(plan.requests.len(), 1);

        // A price that no longer holds is dropped now, not held.
        let (rows, watches, mut plan) = plan_rows(1, preferring(quiet), 1300);
        assert!(crate::holding::wait(&mut plan, &rows, &watches, HashMap::new(), now).is_empty());
        assert_eq!(plan.changes[0].transition.to, Status::Dropped);
    }

    /// The dispatcher's decision at instants around Berlin's 2026 DST changes (its clock is
    /// the `now` it is given): a Berlin reader quiet 01:00–04:00 gets the notification at 04:00
    /// on the clock of that night, one hour fewer or more after the change.
    #[test]
    fn quiet_hours_across_a_dst_change_end_at_the_readers_wall_clock() {
        let quiet = serde_json::json!({"quiet_hours": {"start": "01:00", "end": "04:00"}});
        let berlin = WatchState {
            time_zone: "Europe/Berlin".into(),
            ..preferring(quiet)
        };
        let utc = |s: &str| {
            s.parse::<DateTime<Utc>>()
                .unwrap_or_else(|e| unreachable!("{e}"))
        };
        for (now, until) in [
            // 01:30 CET; 02:00 becomes 03:00 CEST: 04:00 CEST is 02:00 UTC (1 h 30 min later).
            ("2026-03-29T00:30:00Z", "2026-03-29T02:00:00Z"),
            // 01:30 CEST; 03:00 becomes 02:00 CET: 04:00 CET is 03:00 UTC (3 h 30 min later).
            ("2026-10-24T23:30:00Z", "2026-10-25T03:00:00Z"),
            // The repeated hour's second 02:30 (CET) is still quiet.
            ("2026-10-25T01:30:00Z", "2026-10-25T03:00:00Z"),
        ] {
            let (rows, watches, mut plan) = plan_rows(1, berlin.clone(), 1050);
            let waits = crate::holding::wait(&mut plan, &rows, &watches, HashMap::new(), utc(now));
            assert_eq!(waits.len(), 1, "{now}");
            assert_eq!(waits[0].until, utc(until), "{now}");
        }
        // 04:30 CET after the autumn change is not quiet.
        let (rows, watches, mut plan) = plan_rows(1, berlin, 1050);
        let after = utc("2026-10-25T03:30:00Z");
        assert!(crate::holding::wait(&mut plan, &rows, &watches, HashMap::new(), after).is_empty());
    }

    #[test]
    fn a_cap_lets_go_what_its_window_has_room_for_and_holds_the_rest_until_room_comes() {
        let now = Utc::now();
        let cap = serde_json::json!({"cap": {"max": 2, "window_seconds": 3600}});
        let (rows, watches, mut plan) = plan_rows(3, preferring(cap), 1050);
        assert_eq!(plan.requests.len(), 3);
        let earlier = now - chrono::Duration::minutes(10);
        let sent = HashMap::from([(rows[0].device_id, vec![earlier])]);
        let (capped, window) = crate::holding::capped(&plan, &rows, &watches);
        assert_eq!(
            (capped, window),
            (vec![rows[0].device_id], chrono::Duration::minutes(60))
        );
        let waits = crate::holding::wait(&mut plan, &rows, &watches, sent, now);
        // One goes (two in the hour), two wait until the earlier one leaves the window.
        assert!(plan.requests.contains_key(&rows[0].id));
        assert_eq!(
            waits.iter().map(|w| w.id).collect::<Vec<_>>(),
            [rows[1].id, rows[2].id]
        );
        for w in &waits {
            assert_eq!(
                (w.held, w.until),
                (
                    tidings_domain::holding::Held::Cap,
                    earlier + chrono::Duration::minutes(60)
                )
            );
        }
        // At the release, what became of each held row is counted by why it was held.
        let held: Vec<Claimed> = rows
            .into_iter()
            .map(|r| Claimed {
                held: Some(tidings_domain::holding::Held::Cap),
                ..r
            })
            .collect();
        let outcomes = crate::holding::released(&plan.requests, &plan.changes, &held, &waits);
        assert_eq!(
            outcomes.iter().map(|o| o.1).collect::<Vec<_>>(),
            ["sent", "held", "held"]
        );
    }
}
