//! `GET /v1/admin/doctor`: every check the api can make of the deployment.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One check and what it found.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Check {
    /// e.g. `schema`, `stream enqueue`, `consumer pusher`, `vapid`.
    pub name: String,
    pub ok: bool,
    /// What was found; when not ok, what is wrong and what to do.
    pub detail: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Diagnosis {
    /// Every check passed.
    pub ok: bool,
    pub checks: Vec<Check>,
}
