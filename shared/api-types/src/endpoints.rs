//! A webhook endpoint's own view of its deliveries, and its recovery after an outage on its
//! side (`/v1/endpoints/me/…`, with the endpoint's token).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidings_domain::messages::AttemptOutcome;
use tidings_domain::outbox::Status;
use utoipa::ToSchema;
use uuid::Uuid;

/// One request Tidings made to the endpoint, or tried to.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EndpointAttempt {
    /// The outbox row: the webhook's `webhook-id`.
    pub outbox_id: Uuid,
    /// The row's state now.
    pub status: Status,
    pub attempt: i32,
    /// When it was made; absent when no result came (`lease_expired`).
    pub started_at: Option<DateTime<Utc>>,
    /// When its outcome was recorded.
    pub at: DateTime<Utc>,
    pub outcome: AttemptOutcome,
    /// Your answer's status.
    pub http_status: Option<i32>,
    pub duration_ms: Option<i64>,
    /// What went wrong: your answer's first bytes, or the transport's error.
    pub answer: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EndpointAttemptList {
    /// Newest webhook first; each webhook's attempts last to first.
    pub items: Vec<EndpointAttempt>,
    /// Pass as `cursor` for older webhooks; absent on the last page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/endpoints/me/recover`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Recover {
    /// Webhooks that ended failed, or expired, at or after this instant (an earlier one is read
    /// as 30 days ago: how far back a recovery reaches).
    pub since: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Recovered {
    /// Webhooks replayed: each re-checked first, sent only if it still holds.
    pub replayed: u64,
    /// More remain: call again.
    pub more: bool,
    /// From when it recovered: `since`, or 30 days ago if that was earlier.
    pub since: DateTime<Utc>,
}
