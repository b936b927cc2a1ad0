//! The dead-letter stream for operators: list and read what was dead-lettered, redrive it to
//! where it came from once its cause is fixed, or purge it — one message by sequence, or every
//! message a filter matches, in batches with a cursor and a dry run, like the outbox's bulk
//! operations (see `crate::bulk`).

use crate::AppState;
use crate::auth::Operator;
use crate::extract::{ApiQuery, JsonBody};
use crate::problem::{
    ApiError, BadListQuery, BodyRejected, BulkRejected, NatsUnavailable, Problem, Unauthorized,
};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tidings_api_types::dead_letters::{
    DeadLetterDetail, DeadLetterList, DeadLetterReport, DeadLetterSummary,
};
use tidings_bus::dead_letters::{DeadLetter, DeadLetterError, DeadLetterFilter, DeadLetters};
use tidings_bus::redrive::Answer;
use tidings_domain::subjects::StreamKind;
use utoipa::{IntoParams, ToSchema};

/// The dead letters of this deployment, or 503 when the api has no NATS.
fn dead_letters(app: &AppState) -> Result<DeadLetters, ApiError> {
    let client = app.settings.bus.clone().ok_or_else(|| {
        ApiError::Unavailable(
            "the api is not connected to NATS (set TIDINGS_API_NATS=true with its NATS user)"
                .into(),
        )
    })?;
    Ok(DeadLetters::new(
        async_nats::jetstream::new(client),
        app.settings.subjects.clone(),
    ))
}

fn bus_error(e: DeadLetterError) -> ApiError {
    match e {
        DeadLetterError::NotRedrivable { .. } => ApiError::Conflict {
            kind: "not-redrivable",
            detail: e.to_string(),
        },
        other => ApiError::Unavailable(other.to_string()),
    }
}

/// The stream a dead letter was consumed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Enqueue,
    Push,
    Result,
}

impl From<Source> for StreamKind {
    fn from(s: Source) -> StreamKind {
        match s {
            Source::Enqueue => StreamKind::Enqueue,
            Source::Push => StreamKind::Push,
            Source::Result => StreamKind::Result,
        }
    }
}

/// Dead letter `d` in a listing.
fn summary(d: &DeadLetter) -> DeadLetterSummary {
    DeadLetterSummary {
        sequence: d.sequence,
        from: d.from.map(|k| k.as_str().to_owned()),
        original_subject: d.original_subject.clone(),
        reason: d.reason.clone(),
        msg_id: d.msg_id.clone(),
        redrives: d.redrives,
        at: d.at,
        size: d.payload.len(),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListDeadLetters {
    pub from: Option<Source>,
    /// A part of the reason (case-insensitive).
    pub reason: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub cursor: Option<u64>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// The largest sequence a cursor may name (the schema's int64), far beyond any stream's.
const MAX_SEQUENCE: u64 = i64::MAX as u64;

fn sequence_bound(cursor: Option<u64>) -> Result<u64, ApiError> {
    match cursor.unwrap_or(0) {
        c @ 0..=MAX_SEQUENCE => Ok(c),
        c => Err(ApiError::BadRequest(format!(
            "cursor {c} is larger than {MAX_SEQUENCE}"
        ))),
    }
}

/// Dead letters read to fill one page or batch at most, so a rare reason cannot make one call
/// read the whole stream.
const EXAMINE: usize = 10_000;

#[utoipa::path(
    get, path = "/v1/admin/dlq", tag = "operators",
    params(ListDeadLetters),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Dead letters, oldest first", body = DeadLetterList),
        BadListQuery,
        Unauthorized,
        NatsUnavailable,
    )
)]
pub async fn list_dead_letters(
    State(app): State<AppState>,
    _: Operator,
    ApiQuery(q): ApiQuery<ListDeadLetters>,
) -> Result<Json<DeadLetterList>, ApiError> {
    let limit = crate::extract::limit(q.limit)?;
    let filter = DeadLetterFilter {
        from: q.from.map(StreamKind::from),
        reason: q.reason,
    };
    let page = dead_letters(&app)?
        .list(
            &filter,
            sequence_bound(q.cursor)?,
            // The limit was checked to be 1 to the page maximum, so it fits.
            usize::try_from(limit).unwrap_or(50),
            EXAMINE,
        )
        .await
        .map_err(bus_error)?;
    Ok(Json(DeadLetterList {
        items: page.items.iter().map(summary).collect(),
        next_cursor: page.last,
    }))
}

#[utoipa::path(
    get, path = "/v1/admin/dlq/{sequence}", tag = "operators",
    params(("sequence" = u64, Path, minimum = 1, description = "The dead letter's sequence")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The dead letter with its headers and payload", body = DeadLetterDetail),
        Unauthorized,
        (status = 404, description = "No such dead letter", body = Problem, content_type = "application/problem+json"),
        NatsUnavailable,
    )
)]
pub async fn get_dead_letter(
    State(app): State<AppState>,
    _: Operator,
    sequence: Result<Path<u64>, PathRejection>,
) -> Result<Json<DeadLetterDetail>, ApiError> {
    // Sequences start at 1: anything else names no dead letter.
    let Path(sequence) = sequence.map_err(|_| ApiError::NotFound("dead letter"))?;
    if sequence == 0 {
        return Err(ApiError::NotFound("dead letter"));
    }
    let letter = dead_letters(&app)?
        .get(sequence)
        .await
        .map_err(bus_error)?
        .ok_or(ApiError::NotFound("dead letter"))?;
    let (payload, payload_base64) = match String::from_utf8(letter.payload.clone()) {
        Ok(text) => (Some(text), None),
        Err(_) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(&letter.payload)),
        ),
    };
    Ok(Json(DeadLetterDetail {
        summary: summary(&letter),
        headers: letter.headers,
        payload,
        payload_base64,
    }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSelection {
    pub from: Option<Source>,
    /// A part of the reason (case-insensitive).
    pub reason: Option<String>,
    /// Only these sequences (with the filter above, if any).
    #[serde(default, deserialize_with = "crate::extract::whole::opt_vec")]
    pub sequences: Option<Vec<u64>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterBulk {
    #[serde(default, deserialize_with = "crate::extract::object_or_default")]
    pub filter: DeadLetterSelection,
    /// Count and sample what would be done; do nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// `next_cursor` of the previous batch.
    #[serde(default, deserialize_with = "crate::extract::whole::opt")]
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub cursor: Option<u64>,
    /// Dead letters handled per call (default 200, at most 1,000).
    #[serde(default, deserialize_with = "crate::extract::whole::opt")]
    #[schema(minimum = 1, maximum = 1000)]
    pub batch: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    Redrive,
    Purge,
}

/// The batch size asked for, after checking it and the sequences named.
fn checked_batch(req: &DeadLetterBulk) -> Result<usize, ApiError> {
    let batch = match req.batch.unwrap_or(200) {
        n @ 1..=1000 => n as usize,
        n => {
            return Err(ApiError::BadRequest(format!(
                "batch must be between 1 and 1000, got {n}"
            )));
        }
    };
    if let Some(big) = req
        .filter
        .sequences
        .iter()
        .flatten()
        .find(|s| **s > MAX_SEQUENCE)
    {
        return Err(ApiError::BadRequest(format!(
            "sequence {big} is larger than {MAX_SEQUENCE}"
        )));
    }
    Ok(batch)
}

/// How long a dispatcher has to redrive one dead letter.
const REDRIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Asks a dispatcher to redrive dead letter `sequence` (`tidings_bus::redrive`).
async fn ask_redrive(app: &AppState, sequence: u64) -> Result<Answer, ApiError> {
    let client = app
        .settings
        .bus
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("the api is not connected to NATS".into()))?;
    tidings_bus::redrive::ask(client, &app.settings.subjects, sequence, REDRIVE_WAIT)
        .await
        .map_err(|e| {
            tracing::warn!(sequence, error = %tidings_runtime::telemetry::with_causes(&e), "redrive not done");
            ApiError::Unavailable(tidings_runtime::telemetry::with_causes(&e))
        })
}

/// Redrives or purges one dead letter (or, in a dry run, counts what would be done).
async fn handle(
    app: &AppState,
    dlq: &DeadLetters,
    action: Action,
    letter: &DeadLetter,
    dry_run: bool,
    report: &mut DeadLetterReport,
) -> Result<(), ApiError> {
    match action {
        Action::Redrive => match dlq.target(letter) {
            Err(DeadLetterError::NotRedrivable { why, .. }) => {
                *report.skipped.entry(why).or_default() += 1;
            }
            Err(e) => return Err(bus_error(e)),
            Ok(subject) if dry_run => {
                report.done += 1;
                *report.redriven_to.entry(subject).or_default() += 1;
            }
            Ok(_) => match ask_redrive(app, letter.sequence).await? {
                Answer::Redriven { subject } => {
                    report.done += 1;
                    *report.redriven_to.entry(subject).or_default() += 1;
                }
                // Redriven or purged by someone else meanwhile.
                Answer::Gone => {
                    *report.skipped.entry("gone".to_owned()).or_default() += 1;
                }
                Answer::Refused { why } => *report.skipped.entry(why).or_default() += 1,
                Answer::Failed { detail } => {
                    return Err(ApiError::Unavailable(format!(
                        "redriving dead letter {}: {detail}",
                        letter.sequence
                    )));
                }
            },
        },
        Action::Purge => {
            if dry_run || dlq.purge(letter.sequence).await.map_err(bus_error)? {
                report.done += 1;
            }
        }
    }
    Ok(())
}

async fn bulk(
    app: &AppState,
    action: Action,
    req: DeadLetterBulk,
) -> Result<DeadLetterReport, ApiError> {
    let batch = checked_batch(&req)?;
    let filter = DeadLetterFilter {
        from: req.filter.from.map(StreamKind::from),
        reason: req.filter.reason.clone(),
    };
    let dlq = dead_letters(app)?;
    let page = dlq
        .list(&filter, sequence_bound(req.cursor)?, batch, EXAMINE)
        .await
        .map_err(bus_error)?;
    let mut report = DeadLetterReport {
        dry_run: req.dry_run,
        matched: 0,
        done: 0,
        skipped: BTreeMap::new(),
        sample: Vec::new(),
        redriven_to: BTreeMap::new(),
        next_cursor: page.last,
    };
    let wanted = |d: &DeadLetter| {
        req.filter
            .sequences
            .as_ref()
            .is_none_or(|s| s.contains(&d.sequence))
    };
    for letter in page.items.iter().filter(|d| wanted(d)) {
        report.matched += 1;
        if req.dry_run && report.sample.len() < 10 {
            report.sample.push(summary(letter));
        }
        handle(app, &dlq, action, letter, req.dry_run, &mut report).await?;
    }
    tracing::info!(
        action = if action == Action::Redrive {
            "redrive"
        } else {
            "purge"
        },
        dry_run = req.dry_run,
        matched = report.matched,
        done = report.done,
        "dead letters handled"
    );
    Ok(report)
}

#[utoipa::path(
    post, path = "/v1/admin/dlq/redrive", tag = "operators",
    request_body = DeadLetterBulk,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "One batch redriven (or, with `dry_run`, counted): a dispatcher publishes each message back to its original subject with a new message id and a `Tidings-Redriven-From` header, then deletes it from the dead-letter stream. Push requests are not redriven (the lease sweeper retries their rows). 503 when no dispatcher answers.", body = DeadLetterReport),
        BodyRejected,
        BulkRejected,
        Unauthorized,
        NatsUnavailable,
    )
)]
pub async fn redrive_dead_letters(
    State(app): State<AppState>,
    _: Operator,
    JsonBody { value: req, .. }: JsonBody<DeadLetterBulk>,
) -> Result<Json<DeadLetterReport>, ApiError> {
    bulk(&app, Action::Redrive, req).await.map(Json)
}

#[utoipa::path(
    post, path = "/v1/admin/dlq/purge", tag = "operators",
    request_body = DeadLetterBulk,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "One batch deleted from the dead-letter stream (or, with `dry_run`, counted)", body = DeadLetterReport),
        BodyRejected,
        BulkRejected,
        Unauthorized,
        NatsUnavailable,
    )
)]
pub async fn purge_dead_letters(
    State(app): State<AppState>,
    _: Operator,
    JsonBody { value: req, .. }: JsonBody<DeadLetterBulk>,
) -> Result<Json<DeadLetterReport>, ApiError> {
    bulk(&app, Action::Purge, req).await.map(Json)
}
