//! Request extractors whose failures are problem documents, not axum's plain-text rejections.

use crate::AppState;
use crate::problem::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
pub use tidings_domain::strict::{object_or_default, whole};
use uuid::Uuid;

/// A JSON body, with the raw bytes kept (the idempotency record hashes them).
pub struct JsonBody<T> {
    pub value: T,
    pub raw: Bytes,
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|m| {
                let m = m.trim().to_ascii_lowercase();
                m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let RawBody(raw) = RawBody::from_request(req, state).await?;
        // Every body the api takes is an object; serde alone would also read a struct from an
        // array of its fields (regression: `[null, null]` was a PATCH of a watch that changed
        // nothing, answered 200, once every field of the change was optional).
        require_object(&raw)?;
        let value = parse_json(&raw)?;
        Ok(JsonBody { value, raw })
    }
}

/// A body as sent, for routes that verify a signature over its bytes before reading them;
/// over the size limit it is a problem document like every other refusal, not axum's plain
/// text (the contract fuzzer found the bounce route's).
pub struct RawBody(pub Bytes);

impl FromRequest<AppState> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(RawBody)
            .map_err(|e: BytesRejection| match e.status().as_u16() {
                413 => ApiError::TooLarge(state.settings.max_body_bytes),
                _ => ApiError::BadRequest(format!("reading the request body: {}", e.body_text())),
            })
    }
}

pub fn parse_json<T: DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    let mut json = serde_json::Deserializer::from_slice(raw);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let at = pointer(e.path());
        let e = e.into_inner();
        match e.classify() {
            // Well-formed JSON of the wrong shape: a missing or unknown field, a wrong type.
            serde_json::error::Category::Data => {
                ApiError::invalid(at, format!("request body: {e}"))
            }
            _ => ApiError::BadRequest(format!("request body is not valid JSON: {e}")),
        }
    })
}

/// The JSON Pointer (RFC 6901) of the field serde was reading.
fn pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut at = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => at.push_str(&format!("/{index}")),
            Segment::Map { key } => {
                at.push('/');
                at.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    at
}

/// Query parameters.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

/// A resource id from the path. Something that is not a UUID names no resource: 404, the same
/// answer as an id that exists but belongs to someone else.
pub fn resource_id(
    raw: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    what: &'static str,
) -> Result<Uuid, ApiError> {
    // A segment that is not even UTF-8 (`%ff`) names nothing either: 404 like any other.
    let axum::extract::Path(raw) = raw.map_err(|_| ApiError::NotFound(what))?;
    raw.parse().map_err(|_| ApiError::NotFound(what))
}

/// A cursor is the id of the last item of the previous page.
pub fn cursor(raw: Option<&str>) -> Result<Option<Uuid>, ApiError> {
    raw.map(|c| {
        c.parse()
            .map_err(|_| ApiError::BadRequest(format!("cursor `{c}` is not one this API returned")))
    })
    .transpose()
}

/// Page size: 50 unless asked, at most 200.
pub fn limit(raw: Option<u32>) -> Result<i64, ApiError> {
    match raw.unwrap_or(50) {
        n @ 1..=200 => Ok(i64::from(n)),
        n => Err(ApiError::BadRequest(format!(
            "limit must be between 1 and 200, got {n}"
        ))),
    }
}

/// Splits `limit + 1` fetched rows into a page, each row as the api shows it, and the cursor of
/// the next page (`cursor` of its last row).
pub fn page<T, U, C>(
    mut rows: Vec<T>,
    limit: i64,
    cursor: impl Fn(&T) -> C,
    show: impl Fn(T) -> U,
) -> (Vec<U>, Option<C>) {
    // A limit past `usize` is no limit: every item fits on the page.
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut next = None;
    if rows.len() > limit {
        rows.truncate(limit);
        next = rows.last().map(cursor);
    }
    (rows.into_iter().map(show).collect(), next)
}

/// The client's address as the abuse limits see it (`crate::limits::Limits::client`).
pub struct ClientAddr(pub std::net::IpAddr);

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0);
        Ok(ClientAddr(state.limits.client(peer, &parts.headers)))
    }
}

/// One token from `limit` for `key`, or 429 naming the limit (and counting it).
pub fn within<K: std::hash::Hash + Eq + Clone>(
    limit: &crate::limits::Limit<K>,
    key: &K,
    what: &'static str,
) -> Result<(), ApiError> {
    limit
        .take(key, std::time::Instant::now())
        .map_err(|retry_after| {
            crate::metrics::metrics()
                .rate_limited
                .get_or_create(&tidings_runtime::metrics::KindLabels {
                    kind: what.to_owned(),
                })
                .inc();
            ApiError::RateLimited { what, retry_after }
        })
}

/// A body that must be a JSON object: serde would also read a struct from an array of its
/// fields in order, which the documented schema does not allow.
pub fn require_object(raw: &[u8]) -> Result<(), ApiError> {
    match raw.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        _ => Err(ApiError::invalid(
            "",
            "request body: expected a JSON object",
        )),
    }
}
