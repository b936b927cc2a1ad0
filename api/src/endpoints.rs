//! Webhook endpoints (docs/webhooks.md): API clients, holding a key the operator issued, register
//! the URLs Tidings posts signed webhooks to. An endpoint is a device whose channel is `webhook`:
//! registering one answers with its device token (for its watches, history and the routes below)
//! and its signing secret, both shown once.
//!
//! Only a client key registers an endpoint, so the public api is no relay that posts to whatever
//! URL anyone names; the URL also passes the same guard the pusher applies before each request.

use crate::AppState;
use crate::auth::{Device, Operator, new_token, token_hash};
use crate::extract::{JsonBody, resource_id};
use crate::problem::{ApiError, BodyRejected, Problem, Unauthorized};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use chrono::{SubsecRound, Utc};
use serde::Deserialize;
use tidings_api_types::clients::{ClientCreated, ClientList, ClientSummary};
use tidings_api_types::endpoints::{BreakerState, EndpointCreated, EndpointStatus, SecretRotated};
use tidings_domain::dedup::parse_time_zone;
use tidings_domain::receiver::{self, Circuit};
use tidings_domain::texts::check_locale;
use tidings_domain::{DeviceId, SubscriptionId};
use tidings_endpoint_guard::check;
use tidings_sealing as sealed;
use tidings_signatures::Secret;
use tidings_store::db;
use tidings_store::endpoints::{self, ClientId, NewEndpoint};
use utoipa::ToSchema;
use uuid::Uuid;

/// Longest webhook URL accepted.
pub const MAX_URL_LEN: usize = 2048;
/// What every client key starts with, so a leaked one is recognisable.
pub const CLIENT_KEY_PREFIX: &str = "tck_";

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateClient {
    /// Who the client is, for operators: 1–100 characters, not only spaces, no control
    /// characters.
    #[schema(
        min_length = 1,
        max_length = 100,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$"
    )]
    pub name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// Where webhooks are posted: https, no user name, password or fragment, a public address.
    #[schema(min_length = 9, max_length = 2048)]
    pub url: String,
    /// For the client's own reading: at most 500 characters, no control characters.
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\u0000-\u001f\u007f-\u009f]*$")]
    pub description: Option<String>,
    /// IANA time zone of the endpoint's "once a day" (default UTC).
    #[serde(default)]
    pub time_zone: Option<String>,
    /// BCP 47 language of the text each webhook carries (default English).
    #[serde(default)]
    #[schema(max_length = 35)]
    pub locale: Option<String>,
}

/// A request made with a client key.
pub struct Client {
    pub id: ClientId,
}

impl FromRequestParts<AppState> for Client {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let key = crate::auth::bearer(parts)?;
        if !key.starts_with(CLIENT_KEY_PREFIX) {
            return Err(ApiError::Unauthorized(
                "a client key (tck_…, issued by the operator) is needed",
            ));
        }
        let id = endpoints::authenticate_client(&app.pool, &token_hash(key))
            .await
            .map_err(db("authenticating an API client"))?;
        id.map(|id| Client { id })
            .ok_or(ApiError::Unauthorized("invalid client key"))
    }
}

#[utoipa::path(
    post, path = "/v1/admin/clients", tag = "operators",
    request_body = CreateClient,
    security(("admin_token" = [])),
    responses(
        (status = 201, description = "Client created; its key is shown only now", body = ClientCreated),
        BodyRejected,
        Unauthorized,
        (status = 422, description = "Invalid name", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_client(
    State(app): State<AppState>,
    _: Operator,
    body: JsonBody<CreateClient>,
) -> Result<(StatusCode, Json<ClientCreated>), ApiError> {
    let name = text(&body.value.name, "/name", 100)?;
    if name.is_empty() {
        return Err(ApiError::invalid("/name", "1 to 100 characters"));
    }
    let (token, _) = new_token()?;
    let key = format!("{CLIENT_KEY_PREFIX}{token}");
    let id = ClientId(Uuid::now_v7());
    let created_at = endpoints::create_client(&app.pool, id, &name, &token_hash(&key))
        .await
        .map_err(db("creating an API client"))?;
    tracing::info!(client_id = %id.0, name, "API client created");
    Ok((
        StatusCode::CREATED,
        Json(ClientCreated {
            client_id: id.0,
            name,
            key,
            created_at,
        }),
    ))
}

#[utoipa::path(
    get, path = "/v1/admin/clients", tag = "operators",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Every client, newest first, revoked ones too", body = ClientList),
        Unauthorized,
    )
)]
pub async fn list_clients(
    State(app): State<AppState>,
    _: Operator,
) -> Result<Json<ClientList>, ApiError> {
    let rows = endpoints::list_clients(&app.pool)
        .await
        .map_err(db("listing API clients"))?;
    let items = rows
        .into_iter()
        .map(|c| ClientSummary {
            client_id: c.id,
            name: c.name,
            created_at: c.created_at,
            revoked_at: c.revoked_at,
            endpoints: c.endpoints,
        })
        .collect();
    Ok(Json(ClientList { items }))
}

#[utoipa::path(
    delete, path = "/v1/admin/clients/{id}", tag = "operators",
    params(("id" = Uuid, Path, description = "The client")),
    security(("admin_token" = [])),
    responses(
        (status = 204, description = "Revoked: its key registers nothing more, and its endpoints are removed (their tokens stop working, their subscriptions end as client_revoked)"),
        Unauthorized,
        (status = 404, description = "No such unrevoked client", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn revoke_client(
    State(app): State<AppState>,
    _: Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    // An id that is not a UUID names no client: 404, as for every resource id.
    let id = resource_id(id, "client")?;
    let revoked = endpoints::revoke_client(&app.pool, ClientId(id))
        .await
        .map_err(db("revoking an API client"))?;
    if !revoked {
        return Err(ApiError::NotFound("client"));
    }
    tracing::info!(client_id = %id, "API client revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// A label for people (a name, a description): trimmed, at most `max` characters, and no control
/// characters (Postgres text cannot hold a NUL; the others only garble logs and tables).
fn text(value: &str, pointer: &str, max: usize) -> Result<String, ApiError> {
    // Counted as sent, not as kept: the schema's maxLength is the raw value's, and a client
    // whose 101 characters were accepted because one was a space would be told otherwise.
    if value.chars().count() > max {
        return Err(ApiError::invalid(
            pointer,
            format!("at most {max} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiError::invalid(pointer, "no control characters"));
    }
    Ok(value.trim().to_owned())
}

/// A new signing secret: as the client is given it (`whsec_…`), and as it is stored (sealed
/// when the api has keys, docs/security.md).
fn new_secret(app: &AppState, for_: SubscriptionId) -> Result<(String, String), ApiError> {
    let failed = |_| ApiError::Internal("the system random generator failed".into());
    let (_, text) = Secret::generate().map_err(failed)?;
    let keys = app.settings.webhook_secret_keys.as_deref();
    let stored = sealed::store(&text, keys, for_.0).map_err(failed)?;
    Ok((text, stored))
}

/// The URL as the pusher will check it.
async fn validate_url(url: &str, app: &AppState) -> Result<(), ApiError> {
    if url.len() > MAX_URL_LEN {
        return Err(ApiError::invalid(
            "/url",
            format!("longer than {MAX_URL_LEN} characters"),
        ));
    }
    check(url, &app.settings.webhook_policy)
        .await
        .map_err(|e| ApiError::invalid("/url", e))?;
    Ok(())
}

#[utoipa::path(
    post, path = "/v1/endpoints", tag = "webhooks",
    request_body = CreateEndpoint,
    security(("client_key" = [])),
    responses(
        (status = 201, description = "Endpoint registered; its token and secret are shown only now", body = EndpointCreated),
        BodyRejected,
        Unauthorized,
        (status = 409, description = "The client already has TIDINGS_API_ENDPOINTS_PER_CLIENT endpoints", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid URL, description, time zone or locale", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_endpoint(
    State(app): State<AppState>,
    client: Client,
    body: JsonBody<CreateEndpoint>,
) -> Result<(StatusCode, Json<EndpointCreated>), ApiError> {
    let req = body.value;
    let time_zone = req.time_zone.unwrap_or_else(|| "UTC".to_owned());
    parse_time_zone(&time_zone).map_err(|e| ApiError::invalid("/time_zone", e))?;
    if let Some(locale) = &req.locale {
        check_locale(locale).map_err(|e| ApiError::invalid("/locale", e))?;
    }
    let description = (req.description.as_deref())
        .map(|d| text(d, "/description", 500))
        .transpose()?;
    validate_url(&req.url, &app).await?;
    let (token, hash) = new_token()?;
    let device = DeviceId::new();
    let subscription = SubscriptionId::new();
    let (secret, stored) = new_secret(&app, subscription)?;
    let new = NewEndpoint {
        device,
        token_hash: &hash,
        client: client.id,
        time_zone: &time_zone,
        locale: req.locale.as_deref(),
        subscription,
        url: &req.url,
        description: description.as_deref(),
        secret: &stored,
    };
    let max = app.settings.max_endpoints_per_client;
    let registered = endpoints::register(&app.pool, new, i64::from(max))
        .await
        .map_err(db("registering a webhook endpoint"))?;
    if registered == endpoints::Registered::AtQuota {
        return Err(ApiError::Conflict {
            kind: "endpoint-limit",
            detail: format!(
                "this client already has the maximum of {max} endpoints; remove one first"
            ),
        });
    }
    tracing::info!(device_id = %device, client_id = %client.id.0, "webhook endpoint registered");
    Ok((
        StatusCode::CREATED,
        Json(EndpointCreated {
            device_id: device.0,
            token,
            subscription_id: subscription.0,
            url: req.url,
            secret,
        }),
    ))
}

#[utoipa::path(
    get, path = "/v1/endpoints/me", tag = "webhooks",
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The endpoint, and whether webhooks still go to it", body = EndpointStatus),
        Unauthorized,
        (status = 404, description = "The token is a browser's, not an endpoint's", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_endpoint(
    State(app): State<AppState>,
    device: Device,
) -> Result<Json<EndpointStatus>, ApiError> {
    let found = endpoints::view(&app.pool, device.id)
        .await
        .map_err(db("reading a webhook endpoint"))?;
    let e = found.ok_or(ApiError::NotFound("webhook endpoint"))?;
    let now = Utc::now();
    let circuit = Circuit {
        opens: e.circuit_opens,
        open_until: e.circuit_open_until,
        ..Circuit::default()
    };
    Ok(Json(EndpointStatus {
        subscription_id: e.subscription_id.0,
        url: e.url,
        description: e.description,
        active: e.active,
        deactivation_reason: e.deactivation_reason,
        deactivated_at: e.deactivated_at,
        previous_secret_until: e.previous_until.filter(|until| *until > now),
        consecutive_failures: e.consecutive_failures,
        breaker: match circuit.state(now) {
            receiver::State::Closed => BreakerState::Closed,
            receiver::State::Open { .. } => BreakerState::Open,
            receiver::State::HalfOpen => BreakerState::HalfOpen,
        },
        paused_until: e.circuit_open_until.filter(|until| *until > now),
        pace_per_second: e.pace_per_second,
        paced_until: e.paced_until.filter(|until| *until > now),
        created_at: e.created_at,
    }))
}

#[utoipa::path(
    post, path = "/v1/endpoints/me/secret", tag = "webhooks",
    security(("device_token" = [])),
    responses(
        (status = 200, description = "A new secret signs from now on; the previous one signs beside it until `previous_valid_until`", body = SecretRotated),
        Unauthorized,
        (status = 404, description = "No active webhook endpoint has this token", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn rotate_secret(
    State(app): State<AppState>,
    device: Device,
) -> Result<Json<SecretRotated>, ApiError> {
    // The new secret is sealed for the endpoint's subscription, and stored only on it.
    let found = endpoints::view(&app.pool, device.id)
        .await
        .map_err(db("reading a webhook endpoint"))?;
    let subscription = found
        .filter(|e| e.active)
        .ok_or(ApiError::NotFound("active webhook endpoint"))?
        .subscription_id;
    let (secret, stored) = new_secret(&app, subscription)?;
    let overlap = chrono::Duration::from_std(app.settings.webhook_secret_overlap)
        .unwrap_or(chrono::Duration::hours(24));
    // Microseconds, as Postgres keeps it: the answer and the status then say the same time.
    let until = (Utc::now() + overlap).trunc_subsecs(6);
    let rotated = endpoints::rotate_secret(&app.pool, subscription, &stored, until)
        .await
        .map_err(db("rotating a webhook secret"))?;
    rotated.ok_or(ApiError::NotFound("active webhook endpoint"))?;
    tracing::info!(device_id = %device.id, previous_valid_until = %until, "webhook secret rotated");
    Ok(Json(SecretRotated {
        secret,
        previous_valid_until: until,
    }))
}
