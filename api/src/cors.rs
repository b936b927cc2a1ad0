//! CORS for the public routes, so a page on a shop's own origin can call the api from the
//! browser. Only origins an operator lists (`TIDINGS_API_CORS_ORIGINS`) are let in; there is no
//! wildcard. Devices authenticate with a bearer token, never a cookie, so credentials are not
//! allowed and a listed origin gains nothing a script elsewhere could not already do with the
//! same token.

use crate::problem::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The origins allowed to call the public routes from a browser, as browsers serialise them
/// (`https://shop.example`, `http://localhost:8000`): lower case, no path, no default port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origins(Vec<String>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OriginError {
    #[error("`{0}` is not an origin: expected http(s)://host[:port] with nothing after it")]
    Shape(String),
    #[error("`{0}`: the port must be a number from 1 to 65535")]
    Port(String),
}

impl Origins {
    /// A comma-separated list; empty (the default) allows none.
    pub fn parse(list: &str) -> Result<Origins, OriginError> {
        let mut out = Vec::new();
        for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let origin = normalise(raw)?;
            if !out.contains(&origin) {
                out.push(origin);
            }
        }
        Ok(Origins(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn allows(&self, origin: &str) -> bool {
        self.0.iter().any(|o| o == origin)
    }
}

fn normalise(raw: &str) -> Result<String, OriginError> {
    let shape = || OriginError::Shape(raw.to_owned());
    let lower = raw.to_ascii_lowercase();
    let (scheme, rest) = lower.split_once("://").ok_or_else(shape)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let default_port = match scheme {
        "https" => "443",
        "http" => "80",
        _ => return Err(shape()),
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ', '*']) {
        return Err(shape());
    }
    // An IPv6 host is bracketed; its colons are not a port.
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (rest, None),
    };
    if host.is_empty() {
        return Err(shape());
    }
    match port {
        None => Ok(format!("{scheme}://{host}")),
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(OriginError::Port(raw.to_owned())),
            Ok(_) if p == default_port => Ok(format!("{scheme}://{host}")),
            Ok(n) => Ok(format!("{scheme}://{host}:{n}")),
        },
    }
}

/// The methods and request headers the public routes use.
const ALLOW_METHODS: &str = "GET, POST, PUT, PATCH, DELETE";
const ALLOW_HEADERS: &str = "authorization, content-type, idempotency-key, traceparent";
/// What a client reads besides the CORS-safelisted headers: a replayed create, how long to back
/// off, and where a created resource is.
const EXPOSE_HEADERS: &str = "idempotent-replayed, retry-after, location";
/// How long a browser may cache a preflight (Chromium caps it at two hours).
const MAX_AGE_SECS: &str = "7200";

/// Answers preflights from listed origins, refuses those from others, and marks every other
/// answer to a listed origin readable by it.
pub async fn cors(State(origins): State<Arc<Origins>>, request: Request, next: Next) -> Response {
    let Some(origin) = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned)
    else {
        return next.run(request).await;
    };
    let allowed = origins.allows(&origin);
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        if !allowed {
            return with_vary(
                ApiError::Forbidden(format!(
                    "origin {origin} may not call this api from a browser \
                     (TIDINGS_API_CORS_ORIGINS lists those that may)"
                ))
                .into_response(),
            );
        }
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOW_METHODS),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE_SECS),
        );
        r
    } else {
        next.run(request).await
    };
    if allowed && let Ok(value) = HeaderValue::from_str(&origin) {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        if !preflight {
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(EXPOSE_HEADERS),
            );
        }
    }
    with_vary(response)
}

/// The answer depends on the request's origin (and a preflight's on what it asks for), so a
/// cache must not hand one origin's answer to another.
fn with_vary(mut response: Response) -> Response {
    let h: &mut HeaderMap = response.headers_mut();
    h.append(
        header::VARY,
        HeaderValue::from_static(
            "origin, access-control-request-method, access-control-request-headers",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_read_as_browsers_write_them() {
        let o = Origins::parse(" https://Shop.Example/ , http://localhost:8000,https://a.test:443")
            .unwrap();
        assert_eq!(
            o.0,
            [
                "https://shop.example",
                "http://localhost:8000",
                "https://a.test"
            ]
        );
        assert!(o.allows("https://shop.example"));
        assert!(!o.allows("https://shop.example:8443"));
        assert!(!o.allows("http://shop.example"));
        assert_eq!(
            Origins::parse("http://[::1]:8080").unwrap().0,
            ["http://[::1]:8080"]
        );
        assert!(Origins::parse("").unwrap().is_empty());
    }

    #[test]
    fn what_is_not_an_origin_is_refused() {
        for bad in [
            "shop.example",
            "ftp://shop.example",
            "https://",
            "https://shop.example/path",
            "https://user@shop.example",
            "https://shop.example?x",
            "*",
            "https://*.shop.example",
            "https://:443",
        ] {
            assert!(
                matches!(Origins::parse(bad), Err(OriginError::Shape(_))),
                "{bad}"
            );
        }
        for bad in [
            "https://shop.example:0",
            "https://shop.example:99999",
            "http://a:x",
        ] {
            assert!(
                matches!(Origins::parse(bad), Err(OriginError::Port(_))),
                "{bad}"
            );
        }
    }
}
