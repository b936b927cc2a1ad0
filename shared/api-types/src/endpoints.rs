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

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EndpointCreated {
    /// The endpoint's device: its watches, history and these routes take its token.
    pub device_id: Uuid,
    /// Bearer token of the endpoint's device. Shown once.
    pub token: String,
    pub subscription_id: Uuid,
    pub url: String,
    /// `whsec_…`: verify each webhook's `webhook-signature` with it. Shown once.
    pub secret: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SecretRotated {
    /// The new signing secret. Shown once.
    pub secret: String,
    /// Until when webhooks carry a signature by the previous secret too.
    pub previous_valid_until: DateTime<Utc>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EndpointStatus {
    pub subscription_id: Uuid,
    pub url: String,
    pub description: Option<String>,
    /// False once the endpoint answered 410 Gone (or was removed): nothing is posted to it.
    pub active: bool,
    pub deactivation_reason: Option<tidings_domain::subscription::Deactivation>,
    pub deactivated_at: Option<DateTime<Utc>>,
    /// While a rotation's previous secret still signs: until when.
    pub previous_secret_until: Option<DateTime<Utc>>,
    /// Result batches in a row that failed (a delivery resets it).
    pub consecutive_failures: i32,
    /// The circuit breaker: `closed`; `open` while failures lasted (webhooks held back until
    /// `paused_until`, then re-checked and sent); `half_open` once that pause is over (one webhook
    /// goes as a probe and the others wait for its answer).
    pub breaker: BreakerState,
    pub paused_until: Option<DateTime<Utc>>,
    /// While the receiver asked to slow down (`429`, `503` with `Retry-After`): the webhooks a
    /// second it gets at most, none before `paced_until`. Absent: not paced.
    pub pace_per_second: Option<f64>,
    pub paced_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// Where an endpoint's circuit breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}
