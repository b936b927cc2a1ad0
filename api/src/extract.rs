//! Request extractors whose failures are problem documents, not axum's plain-text rejections.

use crate::AppState;
use crate::problem::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
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
        let raw = Bytes::from_request(req, state)
            .await
            .map_err(|e: BytesRejection| match e.status().as_u16() {
                413 => ApiError::TooLarge(state.settings.max_body_bytes),
                _ => ApiError::BadRequest(format!("reading the request body: {}", e.body_text())),
            })?;
        let value = parse_json(&raw)?;
        Ok(JsonBody { value, raw })
    }
}

pub fn parse_json<T: DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(raw).map_err(|e| match e.classify() {
        // Well-formed JSON of the wrong shape: a missing or unknown field, a wrong type.
        serde_json::error::Category::Data => ApiError::invalid("", format!("request body: {e}")),
        _ => ApiError::BadRequest(format!("request body is not valid JSON: {e}")),
    })
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

/// A field that must be a JSON object when present (with `#[serde(default)]` for absent), for
/// the same reason as [`require_object`]; `null` is not an object either.
pub fn object_or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::Deserialize;
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        v @ serde_json::Value::Object(_) => serde_json::from_value(v).map_err(D::Error::custom),
        _ => Err(D::Error::custom("expected an object")),
    }
}

/// Whole numbers in JSON bodies: JSON Schema's `integer` includes `722.0`, which serde's integer
/// types refuse, so these accept a number with no fractional part, in range, however written.
pub mod whole {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error};

    fn from_number<T: TryFrom<u64>, E: Error>(n: serde_json::Number) -> Result<T, E> {
        let whole = n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        });
        whole
            .and_then(|w| T::try_from(w).ok())
            .ok_or_else(|| E::custom(format!("{n} is not a whole number in range")))
    }

    pub fn opt<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
        Option::<serde_json::Number>::deserialize(d)?
            .map(from_number)
            .transpose()
    }

    pub fn opt_vec<'de, D: Deserializer<'de>, T: TryFrom<u64>>(
        d: D,
    ) -> Result<Option<Vec<T>>, D::Error> {
        Option::<Vec<serde_json::Number>>::deserialize(d)?
            .map(|v| v.into_iter().map(from_number).collect())
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[derive(serde::Deserialize)]
    struct Sequences {
        #[serde(default, deserialize_with = "super::whole::opt_vec")]
        sequences: Option<Vec<u64>>,
    }

    #[test]
    fn whole_numbers_written_as_decimals_read_exactly() {
        // The contract fuzzer's draw: serde_json's fast float parsing read the second as
        // 4040217466168097.5 and the api answered 422 for a schema-valid integer.
        let body =
            r#"{"sequences": [72833365624.0, 4040217466168098.0, 3246576323802723328, 17.0]}"#;
        let s: Sequences = serde_json::from_str(body).unwrap();
        assert_eq!(
            s.sequences.unwrap(),
            [72833365624, 4040217466168098, 3246576323802723328, 17]
        );
        for refused in [r#"{"sequences": [1.5]}"#, r#"{"sequences": [-1.0]}"#] {
            assert!(
                serde_json::from_str::<Sequences>(refused).is_err(),
                "{refused}"
            );
        }
    }
}
