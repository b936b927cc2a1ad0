//! The operators' audit trail (`GET /v1/admin/audit`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One operator action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    /// When it started.
    pub at: DateTime<Utc>,
    /// The operator token's name.
    pub operator: String,
    /// Method and route, e.g. `POST /v1/admin/outbox/replay`.
    pub action: String,
    /// What it named: `path`, `query` and `body` as sent.
    pub target: serde_json::Value,
    pub dry_run: bool,
    /// The answer's HTTP status; absent while it runs, or if it never ended.
    pub status: Option<i16>,
    /// Rows or messages it acted on (or, in a dry run, would have), when the answer says.
    pub rows: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// Newest first.
    pub items: Vec<AuditEntry>,
    /// Pass as `cursor` for the next (older) page; absent on the last.
    pub next_cursor: Option<i64>,
}
