//! The browser half, served by the api when `TIDINGS_API_WEB` is on: the client module
//! (`tidings.js` and its types), the service worker (`sw.js`) and a demo page that uses both,
//! under `/web/`. The files are compiled in, so the image needs nothing beside the binary; a
//! shop serves its own copies of `tidings.js` and `sw.js` from its own origin (a service
//! worker must be same-origin with the page) and lists that origin in `TIDINGS_API_CORS_ORIGINS`.

use crate::problem::ApiError;
use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

struct File {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";

/// A file of `web/`, compiled in.
macro_rules! web_file {
    ($name:literal, $content_type:expr) => {
        File {
            name: $name,
            content_type: $content_type,
            body: include_str!(concat!("../../web/", $name)),
        }
    };
}

const FILES: &[File] = &[
    web_file!("index.html", "text/html; charset=utf-8"),
    web_file!("demo.js", JS),
    web_file!("demo.css", "text/css; charset=utf-8"),
    web_file!("tidings.js", JS),
    web_file!("tidings.d.ts", "application/typescript; charset=utf-8"),
    web_file!("sw.js", JS),
    web_file!("icon.svg", "image/svg+xml"),
];

/// The demo page runs only its own scripts and talks only to this origin.
const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// `/web/` and its files.
pub fn router<S: Clone + Send + Sync + 'static>() -> axum::Router<S> {
    axum::Router::new()
        .route("/web", get(|| async { Redirect::permanent("/web/") }))
        .route("/web/", get(|| async { serve("index.html") }))
        .route(
            "/web/{file}",
            get(|Path(file): Path<String>| async move { serve(&file) }),
        )
}

fn serve(name: &str) -> Response {
    let Some(file) = FILES.iter().find(|f| f.name == name) else {
        return ApiError::NotFound("file").into_response();
    };
    let mut response = file.body.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(file.content_type),
    );
    // Revalidated on every load, so a new release's client and worker are picked up at once.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    response
}
