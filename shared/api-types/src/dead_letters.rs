//! The dead-letter stream as operators see it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A dead letter in a listing.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterSummary {
    /// Its sequence in the dead-letter stream: its id here.
    pub sequence: u64,
    /// The stream it was consumed from: `enqueue`, `push` or `result`.
    pub from: Option<String>,
    pub original_subject: Option<String>,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    pub msg_id: Option<String>,
    /// How often it had been redriven before it came back.
    pub redrives: u32,
    pub at: DateTime<Utc>,
    pub size: usize,
}

/// One dead letter, whole.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterDetail {
    #[serde(flatten)]
    pub summary: DeadLetterSummary,
    /// Every header, the dead-letter reason and original subject included.
    pub headers: Vec<(String, String)>,
    /// The payload as text when it is UTF-8.
    pub payload: Option<String>,
    /// The payload in base64 when it is not.
    pub payload_base64: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterList {
    pub items: Vec<DeadLetterSummary>,
    pub next_cursor: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterReport {
    pub dry_run: bool,
    /// Dead letters in this batch that the filter matched.
    pub matched: u64,
    /// Redriven or purged (a dry run: would be).
    pub done: u64,
    /// Left alone, by why (a dry run: would be).
    pub skipped: BTreeMap<String, u64>,
    /// Dry run: up to 10 of the matched ones.
    pub sample: Vec<DeadLetterSummary>,
    /// Where each redriven message went (subject → count).
    pub redriven_to: BTreeMap<String, u64>,
    /// Pass it back as `cursor` for the next batch; absent when done.
    pub next_cursor: Option<u64>,
}
