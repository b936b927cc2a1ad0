//! API clients: who may register webhook endpoints, with a key the operator issues.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClientCreated {
    pub client_id: Uuid,
    pub name: String,
    /// The client's key (`Authorization: Bearer tck_…` on `POST /v1/endpoints`). Shown once;
    /// Tidings keeps only its hash.
    pub key: String,
    pub created_at: DateTime<Utc>,
}

/// A client as operators see it (never its key).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClientSummary {
    pub client_id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// Once revoked, its key registers nothing more; its endpoints keep receiving.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Endpoints it registered that are not removed.
    pub endpoints: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClientList {
    /// Newest first.
    pub items: Vec<ClientSummary>,
}
