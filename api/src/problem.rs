//! Errors as RFC 9457 problem details (`application/problem+json`). Every failure a client can
//! cause gets a stable `type`, a status and a `detail` that says what to fix; server faults are
//! logged with what failed and answered without internals.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use tidings_api_types::problem::{FieldError, Problem};
use tidings_store::DbError;
use utoipa::IntoResponses;

/// Declares a route's answer that is a problem document, with its status and description, for
/// routes to list by name. The status and text are `tt`s: utoipa skips a `literal` fragment
/// (macro_rules wraps it in an invisible group).
macro_rules! problem_answer {
    ($(#[$meta:meta])* $name:ident, $status:tt, $description:tt) => {
        $(#[$meta])*
        #[derive(IntoResponses)]
        #[response(
            status = $status,
            description = $description,
            content_type = "application/problem+json"
        )]
        pub struct $name(pub Problem);
    };
}

/// [`problem_answer!`] for a set of answers a route lists under one name.
macro_rules! problem_answers {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $status:tt, $description:tt;)+ }) => {
        $(#[$meta])*
        #[derive(IntoResponses)]
        pub enum $name {
            $(
                #[response(
                    status = $status,
                    description = $description,
                    content_type = "application/problem+json"
                )]
                $variant(Problem),
            )+
        }
    };
}

problem_answers!(
    /// The answers every route with a JSON body can give before its handler runs, for the OpenAPI
    /// document (a route lists them as `BodyRejected` instead of spelling each one out).
    BodyRejected {
        NotJson = 400, "Body is not JSON, or not the expected shape";
        TooLarge = 413, "Body too large";
        WrongType = 415, "Body is not application/json";
    }
);
problem_answers!(
    /// What an operator's bulk operation (replay, cancel, redrive, purge) answers besides
    /// [`BodyRejected`] to a body it cannot take: a route lists both, this one second, so its 400
    /// (which includes a body that is not JSON) replaces the generic one.
    BulkRejected {
        BadFilter = 400, "Body is not JSON, or a bad filter value or batch size";
        WrongShape = 422, "A body of the wrong shape (an unknown field, a wrong type)";
    }
);

problem_answer!(
    /// A route's answer to a missing or wrong bearer token (which token, the route's `security`
    /// says: a device's or the operator's).
    Unauthorized, 401, "Missing or invalid token"
);
problem_answer!(NoSuchRow, 404, "No such row");
problem_answer!(NoSuchDevice, 404, "No such device");
problem_answer!(NoSuchWatch, 404, "No such watch");
problem_answer!(
    NoWebhookEndpoint,
    404,
    "This token's device has no webhook endpoint"
);
problem_answer!(NoSuchDevicesWatch, 404, "No such watch for this device");
problem_answer!(
    NoSuchDevicesNotification,
    404,
    "No such notification for this device"
);
problem_answer!(BadListQuery, 400, "Bad filter, cursor or limit");
problem_answer!(
    /// The dead-letter routes without NATS.
    NatsUnavailable, 503, "The api has no NATS connection, or NATS did not answer"
);

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A well-formed request whose content breaks a rule (422).
    #[error("{pointer}: {detail}")]
    Invalid { pointer: String, detail: String },
    /// A request that cannot be read: bad JSON, bad query or header (400).
    #[error("{0}")]
    BadRequest(String),
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("request body must be application/json")]
    UnsupportedMediaType,
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Refused whoever asks (403): e.g. a browser preflight from an origin not listed.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The request conflicts with the resource's state (409); `kind` names the rule.
    #[error("{detail}")]
    Conflict { kind: &'static str, detail: String },
    #[error("{0}")]
    Unavailable(String),
    /// An abuse limit: try again after `retry_after`.
    #[error("too many requests ({what}); retry in {} s", retry_secs(*retry_after))]
    RateLimited {
        what: &'static str,
        retry_after: std::time::Duration,
    },
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Cancel(#[from] tidings_store::cancel::CancelError),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(pointer: impl Into<String>, detail: impl ToString) -> Self {
        ApiError::Invalid {
            pointer: pointer.into(),
            detail: detail.to_string(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Db(_) | ApiError::Cancel(_) | ApiError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::Invalid { .. } => "validation",
            ApiError::BadRequest(_) => "bad-request",
            ApiError::TooLarge(_) => "body-too-large",
            ApiError::UnsupportedMediaType => "unsupported-media-type",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not-found",
            ApiError::Conflict { kind, .. } => kind,
            ApiError::Unavailable(_) => "unavailable",
            ApiError::RateLimited { .. } => "rate-limited",
            ApiError::Db(_) | ApiError::Cancel(_) | ApiError::Internal(_) => "internal",
        }
    }

    pub fn problem(&self) -> Problem {
        let status = self.status();
        let detail = match self {
            // Internals stay in the log.
            ApiError::Db(_) | ApiError::Cancel(_) | ApiError::Internal(_) => {
                "the server could not complete the request; it was logged".to_owned()
            }
            other => other.to_string(),
        };
        let errors = match self {
            ApiError::Invalid { pointer, detail } => vec![FieldError {
                pointer: pointer.clone(),
                detail: detail.clone(),
            }],
            _ => Vec::new(),
        };
        Problem {
            kind: format!("/problems/{}", self.kind()),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail,
            errors,
        }
    }
}

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Whole seconds to wait, at least 1 (`Retry-After` has no fractions).
fn retry_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let problem = self.problem();
        let mut response = (self.status(), axum::Json(problem)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if matches!(self, ApiError::Unavailable(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        if let ApiError::RateLimited { retry_after, .. } = &self {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_secs(*retry_after)),
            );
        }
        if matches!(self, ApiError::Unauthorized(_)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The longest request target the api reads; longer ones answer 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Every failure is a problem document, including the answers the router gives on its own (405
/// for a method a route does not have, which keeps its `Allow` header) and the 414 for a
/// request target over [`MAX_URI_BYTES`].
pub async fn problems_everywhere(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // The target as the client sent it (origin form), measured without building a string.
    let uri = request.uri();
    let uri_len = uri.path().len() + uri.query().map_or(0, |q| q.len() + 1);
    if uri_len > MAX_URI_BYTES {
        let status = StatusCode::URI_TOO_LONG;
        let detail = format!("the request target is {uri_len} bytes; at most {MAX_URI_BYTES}");
        return bare(
            status,
            "uri-too-long",
            detail,
            Response::new(Default::default()),
        );
    }
    let response = next.run(request).await;
    let status = response.status();
    if status.is_success()
        || status.is_redirection()
        || response.headers().contains_key(header::CONTENT_TYPE)
    {
        return response;
    }
    let (kind, detail) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = response
                .headers()
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            ("method-not-allowed", format!("this route answers {allow}"))
        }
        other => (
            "http",
            other.canonical_reason().unwrap_or("error").to_owned(),
        ),
    };
    bare(status, kind, detail, response)
}

/// `response`'s status and headers with a problem body in place of its own.
fn bare(status: StatusCode, kind: &str, detail: String, response: Response) -> Response {
    let problem = Problem {
        kind: format!("/problems/{kind}"),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status: status.as_u16(),
        detail,
        errors: Vec::new(),
    };
    let (mut parts, _) = response.into_parts();
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut answer = (parts, axum::Json(problem)).into_response();
    answer
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    answer
}
