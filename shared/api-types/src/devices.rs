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
