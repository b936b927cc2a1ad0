//! Notifications that would go now but wait for their reader: inside quiet hours, or over a cap.
//! The re-check found them true, so they wait in the outbox (pending, due at their release, no
//! attempt spent, `held` saying why) and are re-checked at the release like any send: what is
//! released is still true, and what no longer is is dropped then with its reason (docs/design.md,
//! *Quiet hours and caps*). Which rows wait is decided here without I/O.

use crate::plan::Request;
use chrono::{DateTime, Duration, Utc};
use chrono_tz::Tz;
use std::collections::{HashMap, HashSet};
use tidings_domain::dedup::parse_time_zone;
use tidings_domain::holding::{self, Held, Preferences};
use tidings_domain::{DeviceId, OutboxId, WatchId};
use tidings_store::claim::{Claimed, Wait, WatchState};
use tidings_store::transition::Change;

use crate::plan::Plan;

/// The reader's rules for `w`'s notifications: none for an urgent watch, and none (logged) for
/// preferences the api would not have written.
fn rules_of(w: &WatchState, watch: WatchId) -> Option<(Preferences, Tz)> {
    if w.urgent {
        return None;
    }
    let rules = match w.preferences.rules() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(watch_id = %watch, error = %e, "stored preferences do not read; \
                           the notification goes without waiting");
            return None;
        }
    };
    if rules == Preferences::default() {
        return None;
    }
    let tz = parse_time_zone(&w.time_zone).unwrap_or(Tz::UTC);
    Some((rules, tz))
}

/// The devices whose caps the rows planned for sending must count against, and the longest of
/// their windows: whose earlier notifications [`wait`] needs.
pub fn capped(
    plan: &Plan,
    rows: &[Claimed],
    watches: &HashMap<WatchId, WatchState>,
) -> (Vec<DeviceId>, Duration) {
    let mut devices = Vec::new();
    let mut window = Duration::zero();
    for row in rows.iter().filter(|r| plan.requests.contains_key(&r.id)) {
        let cap = watches
            .get(&row.watch_id)
            .and_then(|w| rules_of(w, row.watch_id))
            .and_then(|(r, _)| r.cap);
        if let Some(cap) = cap {
            devices.push(row.device_id);
            window = window.max(cap.window);
        }
    }
    devices.sort();
    devices.dedup();
    (devices, window)
}

/// Takes out of `plan` the rows that must wait for their reader, in claim order (each row let go
/// counts against its device's cap for the ones after it), and returns them. Withdrawals never
/// wait: they correct what a screen already shows. `sent`: when each capped device's
/// notifications went, within its window.
pub fn wait(
    plan: &mut Plan,
    rows: &[Claimed],
    watches: &HashMap<WatchId, WatchState>,
    mut sent: HashMap<DeviceId, Vec<DateTime<Utc>>>,
    now: DateTime<Utc>,
) -> Vec<Wait> {
    let mut waits = Vec::new();
    for row in rows {
        if row.withdraws.is_some() || !plan.requests.contains_key(&row.id) {
            continue;
        }
        let Some((rules, tz)) = watches
            .get(&row.watch_id)
            .and_then(|w| rules_of(w, row.watch_id))
        else {
            continue;
        };
        let earlier = sent.entry(row.device_id).or_default();
        match holding::hold(&rules, false, now, tz, earlier) {
            None => earlier.push(now),
            Some((held, until)) => {
                plan.requests.remove(&row.id);
                waits.push(Wait {
                    id: row.id,
                    day: row.dedup_day,
                    until,
                    held,
                });
            }
        }
    }
    // Their `sending` changes go with their requests, in one pass over the batch's changes.
    let waiting: HashSet<OutboxId> = waits.iter().map(|w| w.id).collect();
    if !waiting.is_empty() {
        plan.changes.retain(|c| !waiting.contains(&c.id));
    }
    waits
}

/// What became of the claimed rows that had been held, now at their release: `sent` (planned
/// for sending, alone or in a digest), `held` (they wait again), or the state their change
/// moves them to.
pub fn released(
    requests: &HashMap<OutboxId, Request>,
    changes: &[Change],
    rows: &[Claimed],
    waits: &[Wait],
) -> Vec<(Held, &'static str)> {
    if rows.iter().all(|r| r.held.is_none()) {
        return Vec::new();
    }
    let waiting: HashSet<OutboxId> = waits.iter().map(|w| w.id).collect();
    let moved: HashMap<OutboxId, &'static str> = (changes.iter())
        .map(|c| (c.id, c.transition.to.as_str()))
        .collect();
    rows.iter()
        .filter_map(|row| {
            let held = row.held?;
            let outcome = match moved.get(&row.id) {
                _ if waiting.contains(&row.id) => "held",
                // A digest's members other than its leader have no request of their own.
                Some(&"sending") => "sent",
                _ if requests.contains_key(&row.id) => "sent",
                moved => *moved?,
            };
            Some((held, outcome))
        })
        .collect()
}
