//! What a browser needs from the api: CORS for listed origins only, on the public port only,
//! and the client, service worker and demo page under `/web/` when they are turned on. The
//! browser itself runs them in tests/tests/browser.rs.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/server.rs"]
mod server;

use reqwest::Method;
use reqwest::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, CONTENT_SECURITY_POLICY, CONTENT_TYPE,
    ORIGIN, VARY,
};
use server::test_settings;
use tidings_api::Settings;
use tidings_api::cors::Origins;
use tidings_api_types::problem::Problem;
use tidings_testkit::harness::{TestDb, serve};
use tokio_util::sync::CancellationToken;

const SHOP: &str = "https://shop.example";

fn settings(web: bool) -> Settings {
    Settings {
        cors_origins: Origins::parse("https://shop.example, http://localhost:8000").unwrap(),
        web,
        ..test_settings()
    }
}

/// The public and operator routers on ports of their own, as `tidings-api serve` has them.
async fn served(settings: Settings) -> (String, String, TestDb) {
    let db = TestDb::new().await.unwrap();
    let (public, ops) = tidings_api::routers(db.pool.clone(), settings, CancellationToken::new());
    (serve(public).await, serve(ops).await, db)
}

fn header(r: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap_or_default().to_owned())
}

async fn preflight(base: &str, path: &str, origin: &str) -> reqwest::Response {
    reqwest::Client::new()
        .request(Method::OPTIONS, format!("{base}{path}"))
        .header(ORIGIN, origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type, idempotency-key",
        )
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn listed_origins_pass_the_preflight_and_read_the_answer_others_do_not() {
    let (public, ops, _db) = served(settings(false)).await;

    let ok = preflight(&public, "/v1/watches", SHOP).await;
    assert_eq!(ok.status(), 204);
    assert_eq!(
        header(&ok, ACCESS_CONTROL_ALLOW_ORIGIN).as_deref(),
        Some(SHOP)
    );
    let methods = header(&ok, ACCESS_CONTROL_ALLOW_METHODS).unwrap();
    for m in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
        assert!(methods.contains(m), "{methods}");
    }
    let headers = header(&ok, ACCESS_CONTROL_ALLOW_HEADERS).unwrap();
    for h in ["authorization", "content-type", "idempotency-key"] {
        assert!(headers.contains(h), "{headers}");
    }
    assert_eq!(header(&ok, ACCESS_CONTROL_MAX_AGE).as_deref(), Some("7200"));
    assert!(header(&ok, VARY).unwrap().contains("origin"));
    // Written as a browser does: the port is the origin's own.
    let local = preflight(&public, "/v1/devices", "http://localhost:8000").await;
    assert_eq!(local.status(), 204);

    for other in [
        "https://evil.example",
        "https://shop.example:8443",
        "http://shop.example",
        "null",
    ] {
        let refused = preflight(&public, "/v1/watches", other).await;
        assert_eq!(refused.status(), 403, "{other}");
        assert_eq!(
            header(&refused, ACCESS_CONTROL_ALLOW_ORIGIN),
            None,
            "{other}"
        );
        let problem: Problem = refused.json().await.unwrap();
        assert_eq!(problem.kind, "/problems/forbidden");
        assert!(problem.detail.contains("TIDINGS_API_CORS_ORIGINS"));
    }

    // An answer, an error too, is readable by a listed origin, with the headers a client reads.
    let r = reqwest::Client::new()
        .get(format!("{public}/v1/watches"))
        .header(ORIGIN, SHOP)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        header(&r, ACCESS_CONTROL_ALLOW_ORIGIN).as_deref(),
        Some(SHOP)
    );
    let exposed = header(&r, ACCESS_CONTROL_EXPOSE_HEADERS).unwrap();
    for h in ["idempotent-replayed", "retry-after", "location"] {
        assert!(exposed.contains(h), "{exposed}");
    }
    let r = reqwest::Client::new()
        .get(format!("{public}/v1/vapid-public-key"))
        .header(ORIGIN, "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, ACCESS_CONTROL_ALLOW_ORIGIN), None);

    // Without an Origin an OPTIONS is no preflight: the route's own answer.
    let plain = reqwest::Client::new()
        .request(Method::OPTIONS, format!("{public}/v1/watches"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 405);

    // The operator port is never called from a browser.
    let r = preflight(&ops, "/v1/admin/outbox", SHOP).await;
    assert_eq!(header(&r, ACCESS_CONTROL_ALLOW_ORIGIN), None);
    assert_ne!(r.status(), 204);
}

#[tokio::test]
async fn no_origin_is_let_in_unless_listed() {
    let (public, _, _db) = served(test_settings()).await;
    let r = preflight(&public, "/v1/watches", SHOP).await;
    assert_eq!(header(&r, ACCESS_CONTROL_ALLOW_ORIGIN), None);
    assert_ne!(r.status(), 204);
}

#[tokio::test]
async fn the_browser_files_are_served_only_when_turned_on() {
    let (off, _, _off_db) = served(settings(false)).await;
    for path in ["/web/", "/web/tidings.js", "/web/sw.js"] {
        let r = reqwest::get(format!("{off}{path}")).await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }

    let (on, ops, _db) = served(settings(true)).await;
    let page = reqwest::get(format!("{on}/web/")).await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(
        header(&page, CONTENT_TYPE).as_deref(),
        Some("text/html; charset=utf-8")
    );
    assert!(
        header(&page, CONTENT_SECURITY_POLICY)
            .unwrap()
            .contains("default-src 'self'")
    );
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"src="demo.js""#), "{html}");
    for (file, kind, marker) in [
        ("tidings.js", "text/javascript", "export class Tidings"),
        ("sw.js", "text/javascript", "pushsubscriptionchange"),
        ("demo.js", "text/javascript", "./tidings.js"),
        (
            "tidings.d.ts",
            "application/typescript",
            "export class Tidings",
        ),
        ("demo.css", "text/css", "body"),
        ("icon.svg", "image/svg+xml", "<svg"),
    ] {
        let r = reqwest::get(format!("{on}/web/{file}")).await.unwrap();
        assert_eq!(r.status(), 200, "{file}");
        assert!(
            header(&r, CONTENT_TYPE).unwrap().starts_with(kind),
            "{file}"
        );
        assert_eq!(
            header(&r, "x-content-type-options").as_deref(),
            Some("nosniff")
        );
        assert!(r.text().await.unwrap().contains(marker), "{file}");
    }
    let missing = reqwest::get(format!("{on}/web/secrets.txt")).await.unwrap();
    assert_eq!(missing.status(), 404);
    let up = reqwest::get(format!("{on}/web/..%2fCargo.toml"))
        .await
        .unwrap();
    assert_eq!(up.status(), 404);
    let r = reqwest::get(format!("{ops}/web/")).await.unwrap();
    assert_eq!(r.status(), 404, "not on the operator port");
}

#[test]
fn a_bad_origin_list_stops_the_api_at_start() {
    use clap::Parser;
    let cmd = tidings_api::Command::try_parse_from([
        "tidings-api",
        "serve",
        "--database-url",
        "postgres://x@127.0.0.1/x",
        "--cors-origins",
        "https://shop.example/path",
    ])
    .unwrap();
    let tidings_api::Command::Serve(config) = cmd else {
        panic!("serve")
    };
    let e = config.settings().unwrap_err().to_string();
    assert!(e.contains("TIDINGS_API_CORS_ORIGINS"), "{e}");
    assert!(e.contains("https://shop.example/path"), "{e}");
}

/// `tidings.d.ts` declares what `tidings.js` exports, no more and no less.
#[test]
fn the_client_types_name_every_export() {
    let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../web");
    let exports = |file: &str, kinds: &[&str]| -> std::collections::BTreeSet<String> {
        std::fs::read_to_string(web.join(file))
            .unwrap()
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("export ")?;
                let rest = kinds.iter().find_map(|k| rest.strip_prefix(k))?;
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                Some(name)
            })
            .collect()
    };
    let js = exports("tidings.js", &["function ", "class ", "async function "]);
    let ts = exports("tidings.d.ts", &["function ", "class "]);
    assert_eq!(js, ts);
    assert!(js.contains("Tidings") && js.contains("explain"), "{js:?}");
}
