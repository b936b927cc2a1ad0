//! The small HTML pages a mail's links open: the notification beside the item's value now
//! (`/n/{id}?t=…`, checked when it is opened), and the confirmation and unsubscribe pages
//! ([`crate::mailboxes`]). Plain HTML that works without JavaScript, with the `/web/` pages'
//! security headers; no referrer leaves them, as their addresses carry tokens.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tidings_domain::OutboxId;
use tidings_domain::mail::escape;
use tidings_domain::shown::local_time;
use tidings_domain::texts::{Lang, page_lines};
use tidings_email::links::{LinkKey, Purpose};
use utoipa::IntoParams;

use crate::AppState;
use crate::problem::ApiError;
use tidings_store::mailboxes::Keyed;

/// Scripts, styles and frames: none. Forms post only to this origin.
const CSP: &str = "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A button that posts to `action` (a path of this origin).
pub struct Form {
    pub action: String,
    pub button: &'static str,
}

/// A page: `title` as its heading, `paragraphs` (text) beneath, then `form`'s button.
pub fn page(
    status: StatusCode,
    lang: Lang,
    title: &str,
    paragraphs: &[String],
    form: Option<Form>,
) -> Response {
    let body: String = (paragraphs.iter())
        .map(|p| format!("<p>{}</p>", escape(p)))
        .collect();
    let form = form.map_or(String::new(), |f| {
        format!(
            "<form method=\"post\" action=\"{}\"><button type=\"submit\">{}</button></form>",
            escape(&f.action),
            escape(f.button)
        )
    });
    let html = format!(
        "<!doctype html><html lang=\"{lang}\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{title}</title></head>\
         <body><h1>{title}</h1>{body}{form}</body></html>",
        lang = match lang {
            Lang::En => "en",
            Lang::Ja => "ja",
        },
        title = escape(title),
    );
    let mut response = (status, html).into_response();
    let h = response.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, name, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(h, header::CONTENT_TYPE, "text/html; charset=utf-8");
    set(h, header::CACHE_CONTROL, "no-store");
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::CONTENT_SECURITY_POLICY, CSP);
    set(h, header::REFERRER_POLICY, "no-referrer");
    response
}

/// A link's query (`?t=…`); a request without one is answered with the page that says it is
/// not a link (400), as a mail client or a reader typing an address sees it.
pub struct LinkQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for LinkQuery<T>
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Response> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(q)) => Ok(LinkQuery(q)),
            Err(_) => Err(said(
                StatusCode::BAD_REQUEST,
                Lang::En,
                page_lines(Lang::En, "").link_unknown,
            )),
        }
    }
}

/// Whether `t` can be a link's token: 1 to 64 base64url characters (what every token Tidings
/// mails is), so nothing else reaches a lookup or a page's form.
fn is_token(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The page that says `t` is not a link's token (400, in English: whose link it is is not
/// known), if it is not one; links are checked so before anything is looked up.
pub fn not_a_token(t: &str) -> Option<Response> {
    let lines = page_lines(Lang::En, "");
    (!is_token(t)).then(|| said(StatusCode::BAD_REQUEST, Lang::En, lines.link_unknown))
}

/// A page that says one thing, in `lang`.
pub fn said(status: StatusCode, lang: Lang, line: &str) -> Response {
    page(status, lang, line, &[], None)
}

/// The link key of `keyed`'s subscription, opened; `None` (logged, naming the subscription) if it
/// does not open with this api's sealing keys.
pub fn link_key(app: &AppState, keyed: &Keyed) -> Option<LinkKey> {
    let keys = app.settings.webhook_secret_keys.as_deref();
    let opened = tidings_sealing::open(&keyed.link_key, keys, keyed.subscription.0);
    match opened.ok().map(|k| LinkKey::parse(&k)) {
        Some(Ok(key)) => Some(key),
        _ => {
            tracing::error!(subscription_id = %keyed.subscription, "an email subscription's link key does not open: check TIDINGS_WEBHOOK_SECRET_KEYS");
            None
        }
    }
}

/// A notification link's query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NoticeQuery {
    /// The token the mail's link carries, signed for this notification.
    #[param(max_length = 64, pattern = r"^[A-Za-z0-9_-]{1,64}$")]
    t: String,
}

#[utoipa::path(
    get, path = "/n/{id}", tag = "email",
    params(("id" = uuid::Uuid, Path, description = "The notification (its outbox row)"), NoticeQuery),
    responses(
        (status = 200, description = "The notification beside the item's value now: still true, or ended", content_type = "text/html"),
        (status = 400, description = "No token, or not one (1 to 64 of A-Z, a-z, 0-9, `-`, `_`)", content_type = "text/html"),
        (status = 404, description = "No such notification, or a token not signed for it", content_type = "text/html"),
        (status = 503, description = "The catalog did not answer: try again", content_type = "text/html"),
    )
)]
pub async fn notice(
    State(app): State<AppState>,
    id: Result<Path<uuid::Uuid>, PathRejection>,
    LinkQuery(q): LinkQuery<NoticeQuery>,
) -> Response {
    let unknown = |lang| {
        let lines = page_lines(lang, "");
        page(StatusCode::NOT_FOUND, lang, lines.link_unknown, &[], None)
    };
    let Ok(Path(id)) = id else {
        return unknown(Lang::En);
    };
    if let Some(refused) = not_a_token(&q.t) {
        return refused;
    }
    let id = OutboxId(id);
    let keyed = match tidings_store::mailboxes::keyed_by_row(&app.pool, id).await {
        Ok(Some(keyed)) => keyed,
        Ok(None) => return unknown(Lang::En),
        Err(e) => {
            tracing::error!(outbox_id = %id, error = %tidings_runtime::telemetry::with_causes(&e), "reading a mailed notification failed");
            return unavailable(Lang::En);
        }
    };
    let Some(key) = link_key(&app, &keyed) else {
        return unavailable(Lang::En);
    };
    let signed = key.verifies(Purpose::Notification, &id.to_string(), &q.t);
    if !signed {
        return unknown(Lang::En);
    }
    match crate::shown::check(&app, keyed.device, id).await {
        Ok(checked) => {
            let lang = Lang::of(checked.locale.as_deref().unwrap_or_default());
            let at = local_time(checked.now.checked_at, checked.tz);
            let lines = page_lines(lang, &at);
            let verdict = if checked.now.holds {
                lines.holds
            } else {
                lines.ended
            };
            page(
                StatusCode::OK,
                lang,
                &checked.now.title,
                &[checked.now.body, verdict],
                None,
            )
        }
        Err(ApiError::Unavailable(_)) => unavailable(Lang::En),
        Err(_) => unknown(Lang::En),
    }
}

fn unavailable(lang: Lang) -> Response {
    let lines = page_lines(lang, "");
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        lang,
        lines.unchecked,
        &[],
        None,
    )
}
