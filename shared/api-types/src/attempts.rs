//! Delivery attempts: in full for operators, summarised in a device's own history.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidings_domain::messages::AttemptOutcome;
use utoipa::ToSchema;
use uuid::Uuid;

/// One delivery attempt, as operators see it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptRecord {
    pub attempt: i32,
    /// When the pusher started it; absent when no result came (`lease_expired`).
    pub started_at: Option<DateTime<Utc>>,
    /// When its outcome was recorded.
    pub recorded_at: DateTime<Utc>,
    pub subscription_id: Option<Uuid>,
    /// The push service's host.
    pub push_host: Option<String>,
    /// `delivered`, `transient`, `gone`, `permanent`, `expired`, or `lease_expired` (no result
    /// before the lease ran out).
    pub outcome: AttemptOutcome,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    /// The push service's message id (its `Location`).
    pub push_message_id: Option<String>,
    /// The notification's trace.
    pub trace_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptList {
    pub outbox_id: Uuid,
    /// First to last.
    pub items: Vec<AttemptRecord>,
}

/// One delivery attempt, as the device sees it: when and how it ended, nothing internal.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptSummary {
    pub attempt: i32,
    pub at: DateTime<Utc>,
    /// `delivered`, `transient` (the push service was unavailable; tried again), `gone` (the
    /// subscription has expired), `permanent`, `expired` (too late to send), or `lease_expired`.
    pub outcome: AttemptOutcome,
}
