//! A browser's device as it registers (`/v1/devices`, `/v1/vapid-public-key`).

use serde::{Deserialize, Serialize};
use tidings_domain::Channel;
use tidings_domain::preferences::PreferencesSpec;
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeviceCreated {
    pub device_id: Uuid,
    /// The device's bearer token. Shown once; Tidings keeps only its hash.
    pub token: String,
    pub subscription_id: Uuid,
    pub time_zone: String,
    pub locale: Option<String>,
    /// When its notifications wait (quiet hours, a cap, a digest).
    #[serde(default)]
    pub preferences: PreferencesSpec,
    /// An email device: the link mailed to its address works until then, and the device
    /// receives nothing until it is opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_by: Option<chrono::DateTime<chrono::Utc>>,
}

/// A device as it sees itself (`GET /v1/devices/me`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MyDevice {
    pub device_id: Uuid,
    /// How its notifications are delivered.
    pub channel: Channel,
    pub time_zone: String,
    /// BCP 47; none reads English.
    pub locale: Option<String>,
    /// When its notifications wait (quiet hours, a cap, a digest); a watch's own replace them.
    pub preferences: PreferencesSpec,
    pub watch_count: i32,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubscriptionReplaced {
    pub subscription_id: Uuid,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VapidPublicKey {
    /// Base64url uncompressed P-256 public key: `applicationServerKey` for `pushManager.subscribe`.
    pub public_key: String,
}

/// What a relay or mail provider reports about addresses (`POST /v1/email/bounces`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BounceReport {
    /// `permanent` (a hard bounce: the mailbox does not take mail) and `complaint` (marked as
    /// spam) stop the mail to each address; `transient` is only logged.
    pub kind: BounceKind,
    /// At most 100 addresses.
    #[schema(max_items = 100)]
    pub recipients: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BounceKind {
    Permanent,
    Complaint,
    Transient,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BouncesTaken {
    /// Email subscriptions stopped by this report.
    pub deactivated: u64,
}
