//! Notifications and outbox rows: a device's history, the operators' view, counts, and what
//! replay and cancel answer.

use crate::attempts::AttemptSummary;
use crate::triggers::TriggerSpec;
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tidings_domain::Channel;
use tidings_domain::holding::Held;
use tidings_domain::outbox::{Delivery, Reason, Status};
use tidings_domain::shown::Shown;
use utoipa::ToSchema;
use uuid::Uuid;

/// What detection saw.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Detected {
    pub price: i64,
    pub currency: String,
    pub in_stock: bool,
    pub at: DateTime<Utc>,
}

/// One notification, from detection to its outcome.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Notification {
    pub id: Uuid,
    pub watch_id: Uuid,
    pub item_code: Option<String>,
    pub trigger: TriggerSpec,
    pub channel: Channel,
    pub status: Status,
    /// Why a row was dropped (withheld) or failed, e.g. `condition_lost`.
    pub reason: Option<Reason>,
    /// What it means for the device: `in_progress`, `delivered`, `withheld`, `not_delivered`, or
    /// `may_have_been_delivered` (no confirmed delivery, but an attempt timed out after it was
    /// sent, so the notification may have arrived).
    pub delivery: Delivery,
    pub detected: Detected,
    /// The value seen by the re-check right before sending (recorded when it withheld the row).
    #[schema(value_type = Option<Object>)]
    pub checked: Option<serde_json::Value>,
    /// The value that was sent, when one was.
    #[schema(value_type = Option<Object>)]
    pub sent: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Set on an operator replay: the row it replays.
    pub replay_of: Option<Uuid>,
    /// Set on a withdrawal: the sent notification of `trigger` that stopped holding before its
    /// validity ended, which this one replaced on the device ("was …, now …").
    #[serde(default)]
    pub withdraws: Option<Uuid>,
    /// Why it waited for its reader (`quiet_hours`, `cap`), if it did: re-checked at its
    /// release, then sent or dropped like any notification.
    #[serde(default)]
    pub held: Option<Held>,
    /// While it waits for its reader: when it is released.
    #[serde(default)]
    pub release_at: Option<DateTime<Utc>>,
    /// The day its dedup key counts (one notification per watch, trigger and day; a withdrawal
    /// counts on its notification's day).
    pub dedup_day: NaiveDate,
    /// Its delivery attempts, first to last.
    #[serde(default)]
    pub attempts: Vec<AttemptSummary>,
    /// What the device reported it showed, when it did (best effort).
    #[serde(default)]
    pub shown: Option<ShownReport>,
}

/// What a device showed for a notification, and when it said so.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShownReport {
    pub shown: Shown,
    pub at: DateTime<Utc>,
}

/// A notification checked again as its device is about to show it: what to show.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotificationNow {
    pub id: Uuid,
    /// Whether what it said still holds at the item's current value.
    pub holds: bool,
    /// What the device should show: `as_sent`, `updated` (still true at another value) or
    /// `corrected` (what changed since).
    pub shown: Shown,
    pub title: String,
    pub body: String,
    /// When the current value was read (at most `TIDINGS_API_CHECK_CACHE` before the answer).
    pub checked_at: DateTime<Utc>,
}

/// A device's report of what it showed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShownIn {
    pub shown: Shown,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotificationList {
    pub items: Vec<Notification>,
    pub next_cursor: Option<String>,
    /// How far back history reaches: notifications detected before this day have left with
    /// the retention (TIDINGS_RETENTION, at least 8 days).
    pub kept_from: Option<NaiveDate>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxList {
    pub items: Vec<OutboxRow>,
    pub next_cursor: Option<String>,
    /// How far back the outbox reaches: rows of earlier dedup days have been dropped with
    /// their week (TIDINGS_RETENTION).
    pub kept_from: Option<NaiveDate>,
}

/// An outbox row as operators see it: the notification plus its delivery record.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxRow {
    #[serde(flatten)]
    pub notification: Notification,
    pub device_id: Uuid,
    /// Push attempts made (each one a PushRequest).
    pub attempt: i32,
    /// Times the row went back to `retry`.
    pub retry_count: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub lease_until: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    /// The last error: source failure, push-service answer, or lease expiry.
    pub last_error: Option<String>,
    /// The push service's last HTTP status.
    pub http_status: Option<i32>,
    /// The push service's message id (its `Location`) once delivered.
    pub push_message_id: Option<String>,
    pub subscription_id: Option<Uuid>,
    pub traceparent: Option<String>,
    /// Replays of this row (at most one).
    pub replays: Vec<Uuid>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StateCount {
    pub status: Status,
    pub reason: Option<Reason>,
    pub count: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutboxStats {
    /// Rows by state and reason.
    pub states: Vec<StateCount>,
    /// Rows due for the dispatcher now (pending, or retry whose time has come).
    pub due: i64,
    /// How long the oldest due row has been waiting, in seconds (0 when none is due).
    pub oldest_due_age_seconds: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Replayed {
    /// The new row.
    pub id: Uuid,
    pub replay_of: Uuid,
}

/// A matching row, as a dry run samples it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Sampled {
    pub id: Uuid,
    pub status: Status,
    pub reason: Option<Reason>,
    pub item_code: Option<String>,
    pub device_id: Uuid,
    pub detected_at: DateTime<Utc>,
    pub http_status: Option<i32>,
    pub replay_of: Option<Uuid>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BulkReport {
    pub dry_run: bool,
    /// Dry run: every row the filter matches, and how many of them the operation would change.
    pub matched: Option<i64>,
    pub would_change: Option<i64>,
    /// Dry run: up to 10 of the rows it would change.
    pub sample: Vec<Sampled>,
    /// Rows examined by this call.
    pub examined: u64,
    /// Rows this call changed (replayed or cancelled).
    pub changed: u64,
    /// Rows this call left alone, by why: `is_a_replay`, `already_replayed`, `not_replayable`,
    /// `not_cancellable`.
    pub skipped: BTreeMap<String, u64>,
    /// Pass it back as `cursor` to take the next batch; absent when the operation is done.
    pub next_cursor: Option<Uuid>,
    /// The operation's end of the id range; pass it back with every later call.
    pub up_to: Uuid,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Cancelled {
    pub id: Uuid,
    pub status: Status,
    pub reason: Reason,
}
