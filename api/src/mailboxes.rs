//! Email devices (docs/email.md): registered with an address, mailed a confirmation link, and
//! mailed nothing else until its owner opens it, so the api cannot be made to mail strangers.
//! The link's token is random and single-use and expires; the mails it sends are limited per
//! address and per domain (counted in the database, so across replicas). Each notification
//! mail's unsubscribe link (and its one-click `List-Unsubscribe-Post`, RFC 8058) stops them.
//!
//! The links open small HTML pages ([`crate::pages`]): a GET never changes anything (mail
//! scanners follow links), a POST does.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::Utc;
use serde::Deserialize;
use std::time::Duration;
use tidings_api_types::devices::{BounceKind, BounceReport, BouncesTaken};
use tidings_domain::mail::MailText;
use tidings_domain::subscription::Deactivation;
use tidings_domain::texts::{Lang, confirmation_mail, page_lines};
use tidings_domain::{DeviceId, SubscriptionId};
use tidings_email::links::{LinkKey, MailLinks, Purpose, confirm_link};
use tidings_email::message::parse_address;
use tidings_email::relay::{Relay, Submitted};
use tidings_email::settings::{Letter, Sender};
use tidings_store::db;
use tidings_store::devices::{self, NewDevice};
use tidings_store::mailboxes::{self, Allowed, Confirmed, MailLimits, NewConfirmation, NewMailbox};
use utoipa::IntoParams;

use crate::AppState;
use crate::auth::{new_token, token_hash};
use crate::extract::{ClientAddr, RawBody, within};
use crate::pages::{Form, LinkQuery, link_key, not_a_token, page, said};
use crate::problem::{ApiError, BodyRejected, Problem};

/// What the api mails with.
pub struct Mailer {
    pub relay: Relay,
    pub sender: Sender,
    pub limits: MailLimits,
    /// How long a confirmation link works.
    pub confirm_within: Duration,
    /// What signs bounce reports.
    pub bounce_secrets: Vec<tidings_signatures::Secret>,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer")
            .field("sender", &self.sender)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// An email device to register: the address as typed, where its reader lives.
pub struct NewEmailDevice<'a> {
    pub email: &'a str,
    pub time_zone: &'a str,
    pub locale: Option<&'a str>,
    pub preferences: &'a tidings_domain::preferences::PreferencesSpec,
}

/// The registered device: its id, token, subscription, and until when its link works.
pub struct Registered {
    pub device: DeviceId,
    pub token: String,
    pub subscription: SubscriptionId,
    pub confirm_by: chrono::DateTime<Utc>,
}

/// Registers an email device and mails its confirmation link. Nothing is left behind when the
/// mail cannot go: the device is removed again (the confirmation still counts for the limits).
pub async fn register(app: &AppState, new: NewEmailDevice<'_>) -> Result<Registered, ApiError> {
    let mailer = (app.settings.mail.as_deref()).ok_or_else(|| {
        ApiError::invalid(
            "/email",
            "this service sends no email (its operator has not set it up)",
        )
    })?;
    let (address, domain) = parse_address(new.email).map_err(|e| ApiError::invalid("/email", e))?;
    let (token, hash) = new_token()?;
    let (confirm_token, confirm_hash) = new_token()?;
    let (key, key_text) = LinkKey::generate()
        .map_err(|_| ApiError::Internal("the system random generator failed".into()))?;
    let device = DeviceId::new();
    let subscription = SubscriptionId::new();
    let keys = app.settings.webhook_secret_keys.as_deref();
    let sealed = tidings_sealing::store(&key_text, keys, subscription.0)
        .map_err(|_| ApiError::Internal("sealing a link key failed".into()))?;
    let confirm_by = Utc::now()
        + chrono::Duration::from_std(mailer.confirm_within).unwrap_or(chrono::Duration::days(1));
    let mailbox = NewMailbox {
        device: NewDevice {
            id: device,
            token_hash: &hash,
            time_zone: new.time_zone,
            locale: new.locale,
            preferences: new.preferences,
        },
        subscription,
        address: &address,
        domain: &domain,
        link_key: &sealed,
        confirmation: NewConfirmation {
            token_hash: &confirm_hash,
            expires_at: confirm_by,
        },
    };
    let allowed = mailboxes::register(&app.pool, mailbox, mailer.limits)
        .await
        .map_err(db("registering an email device"))?;
    within_mail_limits(allowed)?;
    let confirmation = Confirmation {
        to: &address,
        token: &confirm_token,
        key: &key,
        subscription,
        lang: Lang::of(new.locale.unwrap_or_default()),
        until: confirm_by,
    };
    if let Err(e) = send_confirmation(mailer, &confirmation).await {
        tracing::warn!(device_id = %device, error = %e, "the confirmation mail did not go; the email device is removed again");
        devices::remove(&app.pool, device)
            .await
            .map_err(db("removing an email device whose confirmation did not go"))?;
        return Err(e);
    }
    tracing::info!(device_id = %device, subscription_id = %subscription, "email device registered; confirmation mailed");
    Ok(Registered {
        device,
        token,
        subscription,
        confirm_by,
    })
}

fn within_mail_limits(allowed: Allowed) -> Result<(), ApiError> {
    let (what, retry_after) = match allowed {
        Allowed::Yes => return Ok(()),
        Allowed::AddressLimited => ("confirmation mails to this address", 24 * 3600),
        Allowed::DomainLimited => ("confirmation mails to this domain", 3600),
    };
    crate::metrics::metrics()
        .rate_limited
        .get_or_create(&tidings_runtime::metrics::KindLabels {
            kind: "email_confirmation".to_owned(),
        })
        .inc();
    Err(ApiError::RateLimited {
        what,
        retry_after: Duration::from_secs(retry_after),
    })
}

struct Confirmation<'a> {
    to: &'a str,
    token: &'a str,
    key: &'a LinkKey,
    subscription: SubscriptionId,
    lang: Lang,
    until: chrono::DateTime<Utc>,
}

/// Mails the confirmation link; an address the relay refuses is the caller's error (422), a
/// relay that does not take the mail now is a 503.
async fn send_confirmation(mailer: &Mailer, c: &Confirmation<'_>) -> Result<(), ApiError> {
    let sender = &mailer.sender;
    let link = confirm_link(&sender.public_url, c.token);
    let until = c.until.format("%Y-%m-%d %H:%M UTC").to_string();
    let (subject, text) = confirmation_mail(c.lang, &link, &until);
    let sub = c.subscription.to_string();
    let links = MailLinks::new(&sender.public_url, c.key, &sub, &sub);
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head><body>{body}</body></html>",
        title = tidings_domain::mail::escape(subject),
        body = (text.split("\n\n"))
            .map(|p| format!("<p>{}</p>", linked(p, &link)))
            .collect::<String>(),
    );
    let id = format!("confirm.{}", uuid::Uuid::new_v4());
    let now = Utc::now();
    let text = MailText {
        subject: subject.to_owned(),
        text,
        html,
    };
    let letter = Letter {
        to: c.to,
        text: &text,
        id: &id,
        unsubscribe: &links.unsubscribe,
    };
    let message = (sender.write(letter, now))
        .map_err(|e| ApiError::Internal(format!("writing a confirmation mail: {e}")))?;
    let submitted = (mailer.relay.submit(&sender.envelope, c.to, &message))
        .await
        .map_err(|e| ApiError::invalid("/email", tidings_runtime::telemetry::with_causes(&e)))?;
    match submitted {
        Submitted::Accepted { .. } => Ok(()),
        Submitted::MailboxRefused { code, reply } => Err(ApiError::invalid(
            "/email",
            format!("the mail relay refused this address ({code} {reply})"),
        )),
        other => Err(ApiError::Unavailable(format!(
            "the confirmation mail could not be sent now ({}); try again shortly",
            other.error().unwrap_or_default()
        ))),
    }
}

/// Paragraph `p` as HTML, with `link` made a link.
fn linked(p: &str, link: &str) -> String {
    let escaped = tidings_domain::mail::escape(p).replace('\n', "<br>");
    let l = tidings_domain::mail::escape(link);
    escaped.replace(&l, &format!("<a href=\"{l}\">{l}</a>"))
}

/// A confirmation link's query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ConfirmQuery {
    /// The token the confirmation mail's link carries.
    #[param(max_length = 64, pattern = r"^[A-Za-z0-9_-]{1,64}$")]
    t: String,
}

#[utoipa::path(
    get, path = "/v1/email/confirm", tag = "email",
    params(ConfirmQuery),
    responses(
        (status = 200, description = "A page that asks its reader to confirm (a GET changes nothing: mail scanners follow links)", content_type = "text/html"),
        (status = 400, description = "No token, or not one (1 to 64 of A-Z, a-z, 0-9, `-`, `_`)", content_type = "text/html"),
    )
)]
pub async fn confirm_page(
    State(app): State<AppState>,
    LinkQuery(q): LinkQuery<ConfirmQuery>,
) -> Response {
    if let Some(refused) = not_a_token(&q.t) {
        return refused;
    }
    let lang = confirmation_lang(&app, &q.t).await;
    let lines = page_lines(lang, "");
    let form = Form {
        action: format!("{}?t={}", tidings_email::links::CONFIRM, q.t),
        button: lines.confirm_button,
    };
    page(StatusCode::OK, lang, lines.confirm_title, &[], Some(form))
}

/// The language of the reader confirmation token `t` was mailed to (English when it names no
/// one, or the lookup fails: the page must still answer).
async fn confirmation_lang(app: &AppState, t: &str) -> Lang {
    match mailboxes::confirmation_locale(&app.pool, &token_hash(t)).await {
        Ok(locale) => Lang::of(locale.as_deref().unwrap_or_default()),
        Err(e) => {
            tracing::warn!(error = %tidings_runtime::telemetry::with_causes(&e), "reading a confirmation link's language failed");
            Lang::En
        }
    }
}

#[utoipa::path(
    post, path = "/v1/email/confirm", tag = "email",
    params(ConfirmQuery),
    responses(
        (status = 200, description = "Confirmed (or confirmed before): the address receives notifications", content_type = "text/html"),
        (status = 400, description = "No token, or not one (1 to 64 of A-Z, a-z, 0-9, `-`, `_`)", content_type = "text/html"),
        (status = 404, description = "No such link, or its address was unsubscribed", content_type = "text/html"),
        (status = 410, description = "The link expired", content_type = "text/html"),
    )
)]
pub async fn confirm(
    State(app): State<AppState>,
    LinkQuery(q): LinkQuery<ConfirmQuery>,
) -> Response {
    if let Some(refused) = not_a_token(&q.t) {
        return refused;
    }
    // The link's reader's language comes with the link, in the same read.
    let (confirmed, lang) = match mailboxes::confirm(&app.pool, &token_hash(&q.t)).await {
        Ok((c, locale)) => (c, Lang::of(locale.as_deref().unwrap_or_default())),
        Err(e) => {
            tracing::error!(error = %tidings_runtime::telemetry::with_causes(&e), "confirming an email address failed");
            let lines = page_lines(Lang::En, "");
            return said(StatusCode::SERVICE_UNAVAILABLE, Lang::En, lines.unchecked);
        }
    };
    let lines = page_lines(lang, "");
    let said = |status, line| said(status, lang, line);
    match confirmed {
        Confirmed::Yes(sub) => {
            tracing::info!(subscription_id = %sub, "email address confirmed");
            said(StatusCode::OK, lines.confirmed)
        }
        Confirmed::AlreadyUsed => said(StatusCode::OK, lines.link_used),
        Confirmed::Expired => said(StatusCode::GONE, lines.link_expired),
        Confirmed::Unknown => said(StatusCode::NOT_FOUND, lines.link_unknown),
    }
}

/// An unsubscribe link's query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UnsubscribeQuery {
    /// The email subscription.
    s: uuid::Uuid,
    /// Its signed token.
    #[param(max_length = 64, pattern = r"^[A-Za-z0-9_-]{1,64}$")]
    t: String,
}

/// The subscription `q` names and its reader's language, if its token is its key's.
async fn signed_subscription(
    app: &AppState,
    q: &UnsubscribeQuery,
) -> Result<Option<(SubscriptionId, Lang)>, ApiError> {
    let id = SubscriptionId(q.s);
    let Some(keyed) = mailboxes::keyed(&app.pool, id)
        .await
        .map_err(db("reading an email subscription's key"))?
    else {
        return Ok(None);
    };
    let key = link_key(app, &keyed)
        .ok_or_else(|| ApiError::Unavailable("the link cannot be checked now".into()))?;
    let signed = key.verifies(Purpose::Unsubscribe, &id.to_string(), &q.t);
    let lang = Lang::of(keyed.locale.as_deref().unwrap_or_default());
    Ok(signed.then_some((id, lang)))
}

#[utoipa::path(
    get, path = "/v1/email/unsubscribe", tag = "email",
    params(UnsubscribeQuery),
    responses(
        (status = 200, description = "A page with the button that unsubscribes (a GET changes nothing)", content_type = "text/html"),
        (status = 400, description = "No subscription or token, or not a token (1 to 64 of A-Z, a-z, 0-9, `-`, `_`)", content_type = "text/html"),
        (status = 404, description = "Not a valid link", content_type = "text/html"),
    )
)]
pub async fn unsubscribe_page(
    State(app): State<AppState>,
    LinkQuery(q): LinkQuery<UnsubscribeQuery>,
) -> Response {
    let (_, lang) = match signed_link(&app, &q).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    let lines = page_lines(lang, "");
    let form = Form {
        action: format!("{}?s={}&t={}", tidings_email::links::UNSUBSCRIBE, q.s, q.t),
        button: lines.unsubscribe_button,
    };
    page(
        StatusCode::OK,
        lang,
        lines.unsubscribe_title,
        &[],
        Some(form),
    )
}

/// The subscription an unsubscribe link names and its reader's language; or the page that says
/// why the link cannot be followed (in English: whose link it is is not known).
async fn signed_link(
    app: &AppState,
    q: &UnsubscribeQuery,
) -> Result<(SubscriptionId, Lang), Response> {
    if let Some(refused) = not_a_token(&q.t) {
        return Err(refused);
    }
    let lines = page_lines(Lang::En, "");
    match signed_subscription(app, q).await {
        Ok(Some(signed)) => Ok(signed),
        Ok(None) => Err(said(StatusCode::NOT_FOUND, Lang::En, lines.link_unknown)),
        Err(_) => Err(said(
            StatusCode::SERVICE_UNAVAILABLE,
            Lang::En,
            lines.unchecked,
        )),
    }
}

#[utoipa::path(
    post, path = "/v1/email/unsubscribe", tag = "email",
    params(UnsubscribeQuery),
    responses(
        (status = 200, description = "Unsubscribed (or unsubscribed before): no more mail goes to the address. Takes RFC 8058's one-click POST (`List-Unsubscribe=One-Click`) and the page's button alike", content_type = "text/html"),
        (status = 400, description = "No subscription or token, or not a token (1 to 64 of A-Z, a-z, 0-9, `-`, `_`)", content_type = "text/html"),
        (status = 404, description = "Not a valid link", content_type = "text/html"),
    )
)]
pub async fn unsubscribe(
    State(app): State<AppState>,
    LinkQuery(q): LinkQuery<UnsubscribeQuery>,
) -> Response {
    let (id, lang) = match signed_link(&app, &q).await {
        Ok(signed) => signed,
        Err(response) => return response,
    };
    let lines = page_lines(lang, "");
    match mailboxes::deactivate(&app.pool, id, Deactivation::Unsubscribed).await {
        Ok(changed) => {
            if changed {
                tracing::info!(subscription_id = %id, "email subscription unsubscribed");
            }
            said(StatusCode::OK, lang, lines.unsubscribed)
        }
        Err(e) => {
            tracing::error!(subscription_id = %id, error = %tidings_runtime::telemetry::with_causes(&e), "unsubscribing failed");
            said(StatusCode::SERVICE_UNAVAILABLE, lang, lines.unchecked)
        }
    }
}

/// Addresses one report may name.
const MAX_BOUNCED: usize = 100;

#[utoipa::path(
    post, path = "/v1/email/bounces", tag = "email",
    request_body = BounceReport,
    responses(
        (status = 200, description = "Taken: each address of a permanent bounce or a complaint receives no more mail", body = BouncesTaken),
        BodyRejected,
        (status = 401, description = "Not signed by a secret of TIDINGS_EMAIL_BOUNCE_SECRETS_FILE (Standard Webhooks: webhook-id, webhook-timestamp within 5 minutes, webhook-signature)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a report: an unknown kind, more than 100 recipients", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests from this client address", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn bounces(
    State(app): State<AppState>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<BouncesTaken>, ApiError> {
    // Before any hashing: an unauthenticated sender is held to its address's rate.
    within(
        &app.limits.hints_per_address,
        &client,
        "bounces_per_address",
    )?;
    let secrets = (app.settings.mail.as_deref()).map_or(&[][..], |m| m.bounce_secrets.as_slice());
    let signed = crate::hints::signed_headers(&headers);
    let (_, id) = tidings_signatures::verify(&[secrets], signed, &body, Utc::now().timestamp())
        .map_err(|e| {
            tracing::info!(error = %e, "a bounce report was refused");
            ApiError::Unauthorized("no bounce secret signs this report (Standard Webhooks headers)")
        })?;
    let report: BounceReport = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid("", format!("not a bounce report: {e}")))?;
    if report.recipients.len() > MAX_BOUNCED {
        return Err(ApiError::invalid(
            "/recipients",
            format!("at most {MAX_BOUNCED} addresses"),
        ));
    }
    let why = match report.kind {
        BounceKind::Permanent => Deactivation::MailboxRejected,
        BounceKind::Complaint => Deactivation::Unsubscribed,
        BounceKind::Transient => {
            tracing::info!(
                webhook_id = id,
                recipients = report.recipients.len(),
                "a transient bounce: nothing to stop"
            );
            return Ok(Json(BouncesTaken { deactivated: 0 }));
        }
    };
    let mut deactivated = 0;
    for (index, recipient) in report.recipients.iter().enumerate() {
        let (address, _) = parse_address(recipient)
            .map_err(|e| ApiError::invalid(format!("/recipients/{index}"), e))?;
        deactivated += mailboxes::deactivate_address(&app.pool, &address, why)
            .await
            .map_err(db("stopping mail to a bounced address"))?;
    }
    tracing::info!(webhook_id = id, kind = ?report.kind, deactivated, "bounce report taken");
    Ok(Json(BouncesTaken { deactivated }))
}
