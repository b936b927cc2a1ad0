//! The operators' audit trail: every request that changes something on the operator routes is
//! recorded (who, when, which route, what it named) before it runs, and completed with its
//! status and how many rows or messages it acted on. An action that cannot be recorded is not
//! done (503). Read with `GET /v1/admin/audit` and `tidings audit`.

use crate::AppState;
use crate::auth::Operator;
use crate::extract::ApiQuery;
use crate::problem::{ApiError, BadListQuery, Unauthorized};
use axum::Json;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use tidings_api_types::audit::{AuditEntry, AuditList};
use tidings_store::audit::{self, Started};
use tidings_store::db;
use utoipa::IntoParams;

/// Answers larger than this are passed on unread: their row count is then unknown.
const READ_ANSWER: usize = 1 << 20;

/// Whether a request is an operator action: anything but a read on the operator routes.
fn is_action(request: &Request) -> bool {
    request.uri().path().starts_with("/v1/admin/")
        && !matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        )
}

/// What a bulk report calls the rows or messages it changed (or, dry, would change).
const COUNTED: [&str; 3] = ["changed", "would_change", "done"];

/// How many rows or messages an answer says it acted on: a bulk report's count; else one for a
/// success on one row, none for a refusal.
fn rows_of(status: u16, body: &[u8]) -> Option<i64> {
    let done = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            COUNTED
                .iter()
                .find_map(|k| v.get(*k).and_then(serde_json::Value::as_i64))
        });
    match done {
        Some(n) => Some(n),
        None if (200..300).contains(&status) => Some(1),
        None => Some(0),
    }
}

/// A request body as the trail keeps it: its JSON, or its text when it is no JSON, with every
/// NUL replaced (Postgres' `jsonb` refuses `\u0000`, and a body the handler refuses anyway must
/// not make the action unrecordable).
fn recordable(body: &[u8]) -> serde_json::Value {
    fn clean(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        let text = |s: String| s.replace('\0', "\u{FFFD}");
        match v {
            Value::String(s) => Value::String(text(s)),
            Value::Array(items) => Value::Array(items.into_iter().map(clean).collect()),
            Value::Object(fields) => Value::Object(
                fields
                    .into_iter()
                    .map(|(k, v)| (text(k), clean(v)))
                    .collect(),
            ),
            other => other,
        }
    }
    if body.is_empty() {
        return serde_json::Value::Null;
    }
    match serde_json::from_slice(body) {
        Ok(v) => clean(v),
        Err(_) => serde_json::json!({
            "unreadable": clean(String::from_utf8_lossy(body).into_owned().into())
        }),
    }
}

/// The middleware: records an operator action around its handler.
pub async fn record(State(app): State<AppState>, request: Request, next: Next) -> Response {
    if !is_action(&request) {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    // Unauthenticated requests are the handler's to refuse (401); nothing to record.
    let Ok(operator) = crate::auth::operator_of(&parts, &app.settings.operators) else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let name = operator.name.clone();
    // The handler's `Operator` takes it from here rather than hashing the token again.
    parts.extensions.insert(operator);
    let bytes = match axum::body::to_bytes(body, app.settings.max_body_bytes).await {
        Ok(b) => b,
        Err(_) => return ApiError::TooLarge(app.settings.max_body_bytes).into_response(),
    };
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let sent = recordable(&bytes);
    let started = Started {
        operator: name.clone(),
        action: format!("{} {route}", parts.method),
        dry_run: sent.get("dry_run").and_then(serde_json::Value::as_bool) == Some(true),
        target: serde_json::json!({
            "path": parts.uri.path(),
            "query": parts.uri.query(),
            "body": sent,
        }),
    };
    let id = match audit::start(&app.pool, &started).await {
        Ok(id) => id,
        Err(e) => {
            tracing::error!(operator = %name, action = %started.action, error = %e, "an operator action was refused: it could not be recorded in the audit trail");
            return ApiError::Unavailable(
                "the action was not done: it could not be recorded in the audit trail".into(),
            )
            .into_response();
        }
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = response.status().as_u16();
    // Only an answer known to be small is read for its count; any other passes on untouched.
    let small = axum::body::HttpBody::size_hint(response.body())
        .upper()
        .is_some_and(|n| n <= READ_ANSWER as u64);
    let (response, rows) = if small {
        let (parts, body) = response.into_parts();
        match axum::body::to_bytes(body, READ_ANSWER).await {
            Ok(b) => {
                let rows = rows_of(status, &b);
                (Response::from_parts(parts, Body::from(b)), rows)
            }
            Err(e) => {
                tracing::warn!(audit_id = id, error = %e, "an operator answer could not be read");
                (
                    ApiError::Internal("the answer could not be read".into()).into_response(),
                    None,
                )
            }
        }
    } else {
        (response, None)
    };
    if let Err(e) = audit::finish(&app.pool, id, status, rows).await {
        tracing::error!(audit_id = id, operator = %name, error = %e, "an operator action's outcome could not be added to its audit record");
    }
    response
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListAudit {
    /// Only this operator's actions (no NUL: Postgres text cannot hold one).
    #[param(pattern = r"^[^\u0000]*$")]
    pub operator: Option<String>,
    /// Only actions since then (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// `next_cursor` of the previous page.
    #[param(minimum = 1)]
    pub cursor: Option<i64>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

#[utoipa::path(
    get, path = "/v1/admin/audit", tag = "operators",
    params(ListAudit),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Operator actions, newest first: who, when, which route, what it named, its status and how many rows it acted on", body = AuditList),
        BadListQuery,
        Unauthorized,
    )
)]
pub async fn list_audit(
    State(app): State<AppState>,
    _: Operator,
    ApiQuery(q): ApiQuery<ListAudit>,
) -> Result<Json<AuditList>, ApiError> {
    let limit = crate::extract::limit(q.limit)?;
    // Postgres text cannot hold a NUL: no operator is named with one, and the query would fail.
    if q.operator.as_deref().is_some_and(|o| o.contains('\0')) {
        return Err(ApiError::BadRequest("operator must not contain NUL".into()));
    }
    if let Some(c) = q.cursor.filter(|c| *c < 1) {
        return Err(ApiError::BadRequest(format!(
            "cursor is an action's id, at least 1, got {c}"
        )));
    }
    let rows = audit::list(
        &app.pool,
        &audit::Filter {
            operator: q.operator,
            since: q.since,
            before: q.cursor,
            limit: limit + 1,
        },
    )
    .await
    .map_err(db("reading the audit trail"))?;
    let (items, next_cursor) = crate::extract::page(
        rows,
        limit,
        |a| a.id,
        |a| AuditEntry {
            id: a.id,
            at: a.at,
            operator: a.operator,
            action: a.action,
            target: a.target,
            dry_run: a.dry_run,
            status: a.status,
            rows: a.rows,
        },
    );
    Ok(Json(AuditList { items, next_cursor }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_body_is_recorded_without_what_postgres_refuses() {
        assert_eq!(
            recordable(br#"{"name": "a\u0000b", "k\u0000": ["\u0000"]}"#),
            serde_json::json!({"name": "a\u{FFFD}b", "k\u{FFFD}": ["\u{FFFD}"]})
        );
        assert_eq!(
            recordable(b"not json \0 \xff"),
            serde_json::json!({"unreadable": "not json \u{FFFD} \u{FFFD}"})
        );
        assert_eq!(recordable(b""), serde_json::Value::Null);
    }

    #[test]
    fn the_rows_an_answer_acted_on() {
        assert_eq!(rows_of(200, br#"{"changed": 7, "examined": 9}"#), Some(7));
        assert_eq!(
            rows_of(200, br#"{"would_change": 4, "changed": null}"#),
            Some(4)
        );
        assert_eq!(rows_of(200, br#"{"done": 3}"#), Some(3));
        assert_eq!(rows_of(204, b""), Some(1));
        assert_eq!(rows_of(404, br#"{"type": "/problems/not-found"}"#), Some(0));
    }
}
