//! A browser's device as it registers (`/v1/devices`, `/v1/vapid-public-key`).

use serde::{Deserialize, Serialize};
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
    /// An email device: the link mailed to its address works until then, and the device
    /// receives nothing until it is opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_by: Option<chrono::DateTime<chrono::Utc>>,
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
