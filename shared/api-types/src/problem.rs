//! Errors as RFC 9457 problem details (`application/problem+json`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI reference naming the kind of problem, e.g. `/problems/validation`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// For validation problems: which part of the request is wrong (a JSON Pointer into the
    /// body, or a parameter name) and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    pub pointer: String,
    pub detail: String,
}
