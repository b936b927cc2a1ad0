//! Devices and watches as operators inspect them.

use crate::triggers::TriggerSpec;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tidings_domain::Channel;
use tidings_domain::outbox::Status;
use tidings_domain::preferences::PreferencesSpec;
use utoipa::ToSchema;
use uuid::Uuid;

/// A push subscription as operators see it (no keys).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubscriptionView {
    pub id: Uuid,
    pub push_host: Option<String>,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    pub deactivated_at: Option<DateTime<Utc>>,
    pub deactivation_reason: Option<tidings_domain::subscription::Deactivation>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeviceView {
    pub id: Uuid,
    /// How its notifications are delivered: `web_push` to a browser, or `webhook` (an API
    /// client's endpoint, whose one subscription is its URL).
    pub channel: Channel,
    pub time_zone: String,
    /// The BCP 47 locale its notifications are written for; none reads English.
    pub locale: Option<String>,
    /// When its notifications wait (quiet hours, a cap, a digest).
    #[serde(default)]
    pub preferences: PreferencesSpec,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
    /// Set while an operator has the device paused.
    pub paused_at: Option<DateTime<Utc>>,
    pub watch_count: i32,
    /// Newest first.
    pub subscriptions: Vec<SubscriptionView>,
    /// Its outbox rows by status.
    pub outbox: BTreeMap<Status, i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WatchView {
    #[serde(flatten)]
    pub watch: Watch,
    pub device_id: Uuid,
    pub removed_at: Option<DateTime<Utc>>,
    /// Its outbox rows by status.
    pub outbox: BTreeMap<Status, i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Watch {
    pub id: Uuid,
    pub item_code: String,
    pub triggers: Vec<TriggerSpec>,
    pub channel: Channel,
    pub paused: bool,
    /// The first price seen for the item: `price_drop`'s reference until a notification is sent.
    pub reference_price: Option<i64>,
    /// Whether a sent notification that stops holding before its validity ends is followed by
    /// one that says what changed (a withdrawal), in its place on the screen.
    #[serde(default = "withdraw_by_default")]
    pub withdraw: bool,
    /// Its notifications go at once, whatever the preferences.
    #[serde(default)]
    pub urgent: bool,
    /// Its own preferences, in place of its device's; null: the device's.
    #[serde(default)]
    pub preferences: Option<PreferencesSpec>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn withdraw_by_default() -> bool {
    true
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WatchList {
    pub items: Vec<Watch>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}
