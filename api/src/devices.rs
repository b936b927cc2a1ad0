//! Devices: anonymous, login-less identities that own one active push subscription and any
//! number of watches (up to the configured limit).

use crate::AppState;
use crate::auth::{Device, new_token};
use crate::extract::{ClientAddr, JsonBody, within};
use crate::mailboxes::NewEmailDevice;
use crate::problem::{ApiError, BodyRejected, Problem, Unauthorized};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tidings_api_types::devices::{DeviceCreated, MyDevice, SubscriptionReplaced, VapidPublicKey};
use tidings_domain::dedup::parse_time_zone;
use tidings_domain::holding::Preferences;
use tidings_domain::preferences::PreferencesSpec;
use tidings_domain::texts::check_locale;
use tidings_domain::{DeviceId, SubscriptionId};
use tidings_endpoint_guard::{EndpointPolicy, check};
use tidings_store::db;
use tidings_store::devices::{self, NewDevice, NewSubscription};
use tidings_webpush::encryption::{KeyError, UaKeys};
use utoipa::ToSchema;

/// Longest endpoint accepted; real push services use a few hundred characters.
pub const MAX_ENDPOINT_LEN: usize = 2048;

/// A push subscription exactly as the browser's `PushSubscription.toJSON()` gives it.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SubscriptionIn {
    /// The push service URL: https, an allowed push-service host on port 443, no user name,
    /// password or fragment.
    #[schema(min_length = 9, max_length = 2048, pattern = r"^https://[^@#\s]+$")]
    pub endpoint: String,
    /// Ignored: push services expire subscriptions by answering 404/410, which Tidings handles.
    /// Accepted (and documented) because `PushSubscription.toJSON()` sends it.
    #[allow(dead_code)]
    #[serde(rename = "expirationTime", default)]
    /// Milliseconds since the epoch, or null: a string, object or boolean is refused.
    pub expiration_time: Option<f64>,
    pub keys: KeysIn,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct KeysIn {
    /// Base64url uncompressed P-256 public key (65 bytes, a point on the curve).
    #[schema(pattern = r"^[A-Za-z0-9_-]{87}=?$")]
    pub p256dh: String,
    /// Base64url authentication secret (16 bytes).
    #[schema(pattern = r"^[A-Za-z0-9_-]{22}(==)?$")]
    pub auth: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDevice {
    /// A browser's push subscription; or give `email`.
    #[serde(default)]
    pub subscription: Option<SubscriptionIn>,
    /// An email address instead of a subscription: Tidings mails it a confirmation link, and
    /// nothing else until the link is opened (docs/email.md).
    #[serde(default)]
    #[schema(max_length = 254)]
    pub email: Option<String>,
    /// IANA time zone; a notification's "once a day" is the calendar day there. Default UTC.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// BCP 47 language tag (`navigator.language`, e.g. `ja-JP`): notifications are written in
    /// its language (English and Japanese so far; others read English) with its number format.
    #[serde(default)]
    #[schema(max_length = 35, pattern = r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*$")]
    pub locale: Option<String>,
    /// When notifications wait: quiet hours, a cap, a digest (docs/api.md). Default: none.
    #[serde(default, deserialize_with = "tidings_domain::strict::object_or_null")]
    pub preferences: Option<PreferencesSpec>,
}

/// What a device may change of itself; each field left out stays as it is.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateDevice {
    /// BCP 47 language tag; null: back to English.
    #[serde(default, deserialize_with = "locale_change")]
    #[schema(value_type = Option<String>, max_length = 35, pattern = r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*$")]
    pub locale: Option<Option<String>>,
    /// When notifications wait; `{}`: never. Held notifications are judged again by the new
    /// preferences at their release.
    #[serde(
        default,
        deserialize_with = "tidings_domain::strict::object_or_default"
    )]
    #[schema(value_type = PreferencesSpec)]
    pub preferences: Option<PreferencesSpec>,
}

fn locale_change<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// Makes the device's held rows (of `watch` only, if given) due at once, to be judged by the
/// preferences just changed rather than wait for the release the old ones gave.
pub async fn release_held(
    app: &AppState,
    device: DeviceId,
    watch: Option<tidings_domain::WatchId>,
) -> Result<(), ApiError> {
    let n = tidings_store::claim::release_held(&app.pool, device, watch)
        .await
        .map_err(db("releasing held notifications"))?;
    if n > 0 {
        tracing::info!(device_id = %device, released = n, "held notifications judged again");
    }
    Ok(())
}

/// `p`'s rules checked, a problem naming the field below `at` otherwise.
pub fn checked(p: &PreferencesSpec, at: &str) -> Result<Preferences, ApiError> {
    p.rules()
        .map_err(|e| ApiError::invalid(format!("{at}{}", e.at), e.what))
}

/// Checks a subscription the way the pusher will: the same endpoint guard, and keys that can be
/// encrypted to. `at` is the JSON Pointer of the subscription in the request body.
pub async fn validate_subscription(
    sub: &SubscriptionIn,
    policy: &EndpointPolicy,
    at: &str,
) -> Result<(), ApiError> {
    if sub.endpoint.len() > MAX_ENDPOINT_LEN {
        return Err(ApiError::invalid(
            format!("{at}/endpoint"),
            format!("endpoint is longer than {MAX_ENDPOINT_LEN} characters"),
        ));
    }
    // Keys first: they cost nothing, the endpoint check may ask DNS.
    UaKeys::parse(&sub.keys.p256dh, &sub.keys.auth)
        .and_then(|k| k.check_curve())
        .map_err(|e| {
            let field = match e {
                KeyError::AuthEncoding | KeyError::AuthLength(_) => "auth",
                KeyError::P256dhEncoding
                | KeyError::P256dhShape(_)
                | KeyError::P256dhNotOnCurve => "p256dh",
            };
            ApiError::invalid(format!("{at}/keys/{field}"), e)
        })?;
    check(&sub.endpoint, policy)
        .await
        .map_err(|e| ApiError::invalid(format!("{at}/endpoint"), e))?;
    Ok(())
}

/// A validated subscription as the store takes it.
fn new_subscription(id: SubscriptionId, sub: &SubscriptionIn) -> NewSubscription<'_> {
    NewSubscription {
        id,
        endpoint: &sub.endpoint,
        p256dh: &sub.keys.p256dh,
        auth: &sub.keys.auth,
    }
}

#[utoipa::path(
    post, path = "/v1/devices", tag = "devices",
    request_body = CreateDevice,
    responses(
        (status = 201, description = "Device registered; the token is shown only now. An email device has been mailed its confirmation link", body = DeviceCreated),
        BodyRejected,
        (status = 422, description = "Invalid subscription, address, time zone or locale; both or neither of subscription and email; an address the mail relay refuses; email not set up here", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many registrations from this client address, or confirmation mails to this email address or domain (`Retry-After` says when to try again)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The confirmation mail could not be sent now (nothing was registered): try again", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_device(
    State(app): State<AppState>,
    ClientAddr(client): ClientAddr,
    body: JsonBody<CreateDevice>,
) -> Result<(StatusCode, Json<DeviceCreated>), ApiError> {
    within(&app.limits.register, &client, "register")?;
    let req = body.value;
    let time_zone = req.time_zone.unwrap_or_else(|| "UTC".to_owned());
    parse_time_zone(&time_zone).map_err(|e| ApiError::invalid("/time_zone", e))?;
    if let Some(locale) = &req.locale {
        check_locale(locale).map_err(|e| ApiError::invalid("/locale", e))?;
    }
    let preferences = req.preferences.unwrap_or_default();
    checked(&preferences, "/preferences")?;
    let sub = match (&req.subscription, &req.email) {
        (Some(sub), None) => sub,
        (None, Some(email)) => {
            let new = NewEmailDevice {
                email,
                time_zone: &time_zone,
                locale: req.locale.as_deref(),
                preferences: &preferences,
            };
            let r = crate::mailboxes::register(&app, new).await?;
            let created = DeviceCreated {
                device_id: r.device.0,
                token: r.token,
                subscription_id: r.subscription.0,
                time_zone,
                locale: req.locale,
                preferences,
                confirm_by: Some(r.confirm_by),
            };
            return Ok((StatusCode::CREATED, Json(created)));
        }
        _ => {
            return Err(ApiError::invalid(
                "",
                "give either subscription (Web Push) or email, not both",
            ));
        }
    };
    validate_subscription(sub, &app.settings.policy, "/subscription").await?;

    let (token, hash) = new_token()?;
    let device = DeviceId::new();
    let subscription = SubscriptionId::new();
    let first = new_subscription(subscription, sub);
    let new = NewDevice {
        id: device,
        token_hash: &hash,
        time_zone: &time_zone,
        locale: req.locale.as_deref(),
        preferences: &preferences,
    };
    devices::register(&app.pool, new, first)
        .await
        .map_err(db("registering a device"))?;
    tracing::info!(device_id = %device, "device registered");
    Ok((
        StatusCode::CREATED,
        Json(DeviceCreated {
            device_id: device.0,
            token,
            subscription_id: subscription.0,
            time_zone,
            locale: req.locale,
            preferences,
            confirm_by: None,
        }),
    ))
}

#[utoipa::path(
    put, path = "/v1/devices/me/subscription", tag = "devices",
    request_body = SubscriptionIn,
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The new subscription replaced the old one", body = SubscriptionReplaced),
        BodyRejected,
        Unauthorized,
        (status = 409, description = "The device is a webhook endpoint", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid subscription", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn replace_subscription(
    State(app): State<AppState>,
    device: Device,
    body: JsonBody<SubscriptionIn>,
) -> Result<Json<SubscriptionReplaced>, ApiError> {
    let sub = body.value;
    validate_subscription(&sub, &app.settings.policy, "").await?;
    // An endpoint's device posts to its URL; a browser subscription would make it another.
    let channel = tidings_store::endpoints::channel_of_device(&app.pool, device.id)
        .await
        .map_err(db("reading a device's channel"))?;
    if channel == Some(tidings_domain::Channel::Webhook) {
        return Err(ApiError::Conflict {
            kind: "webhook-endpoint",
            detail: "this device is a webhook endpoint: register a new endpoint for another URL"
                .into(),
        });
    }
    let id = SubscriptionId::new();
    // One transaction: the dispatcher sends pending rows to whichever subscription is active
    // when it sends, and there is never a moment with two, or none.
    let mut tx = app
        .pool
        .begin()
        .await
        .map_err(db("replacing a subscription"))?;
    devices::replace_subscription(&mut tx, device.id, new_subscription(id, &sub))
        .await
        .map_err(db("replacing a subscription"))?;
    tx.commit().await.map_err(db("replacing a subscription"))?;
    tracing::info!(device_id = %device.id, subscription_id = %id, "subscription replaced");
    Ok(Json(SubscriptionReplaced {
        subscription_id: id.0,
    }))
}

fn my_device(d: devices::Device) -> MyDevice {
    MyDevice {
        device_id: d.id.0,
        channel: d.channel,
        time_zone: d.time_zone,
        locale: d.locale,
        preferences: d.preferences.0,
        watch_count: d.watch_count,
        created_at: d.created_at,
    }
}

#[utoipa::path(
    get, path = "/v1/devices/me", tag = "devices",
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The device: its channel, time zone, locale and preferences", body = MyDevice),
        Unauthorized,
    )
)]
pub async fn get_device(
    State(app): State<AppState>,
    device: Device,
) -> Result<Json<MyDevice>, ApiError> {
    let row = devices::read(&app.pool, device.id)
        .await
        .map_err(db("reading a device"))?;
    // Authenticated a moment ago: gone since, it is as if the token were unknown.
    let row = row.filter(|d| d.removed_at.is_none());
    row.map(|d| Json(my_device(d)))
        .ok_or(ApiError::Unauthorized("invalid device token"))
}

#[utoipa::path(
    patch, path = "/v1/devices/me", tag = "devices",
    request_body = UpdateDevice,
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The updated device", body = MyDevice),
        BodyRejected,
        Unauthorized,
        (status = 422, description = "Unknown or invalid field (`locale` and `preferences` can change)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn update_device(
    State(app): State<AppState>,
    device: Device,
    body: JsonBody<UpdateDevice>,
) -> Result<Json<MyDevice>, ApiError> {
    let req = body.value;
    if let Some(Some(locale)) = &req.locale {
        check_locale(locale).map_err(|e| ApiError::invalid("/locale", e))?;
    }
    if let Some(p) = &req.preferences {
        checked(p, "/preferences")?;
    }
    let change = devices::DeviceChange {
        locale: req.locale.as_ref().map(Option::as_deref),
        preferences: req.preferences.as_ref(),
    };
    let row = devices::change(&app.pool, device.id, &change)
        .await
        .map_err(db("updating a device"))?;
    let row = row.ok_or(ApiError::Unauthorized("invalid device token"))?;
    if req.preferences.is_some() {
        release_held(&app, device.id, None).await?;
    }
    tracing::info!(device_id = %device.id, "device updated");
    Ok(Json(my_device(row)))
}

#[utoipa::path(
    delete, path = "/v1/devices/me", tag = "devices",
    security(("device_token" = [])),
    responses(
        (status = 204, description = "Device, its subscription and its watches removed; pending notifications will be dropped"),
        Unauthorized,
    )
)]
pub async fn delete_device(
    State(app): State<AppState>,
    device: Device,
) -> Result<StatusCode, ApiError> {
    // The dispatcher's pre-guard drops whatever is still pending (watch_removed /
    // subscription_inactive).
    devices::remove(&app.pool, device.id)
        .await
        .map_err(db("removing a device"))?;
    tracing::info!(device_id = %device.id, "device removed");
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get, path = "/v1/vapid-public-key", tag = "devices",
    responses(
        (status = 200, description = "The key to subscribe with", body = VapidPublicKey),
        (status = 503, description = "No VAPID public key configured", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn vapid_public_key(
    State(app): State<AppState>,
) -> Result<Json<VapidPublicKey>, ApiError> {
    app.settings
        .vapid_public_key
        .clone()
        .map(|public_key| Json(VapidPublicKey { public_key }))
        .ok_or_else(|| {
            ApiError::Unavailable(
                "no VAPID public key is configured (TIDINGS_VAPID_PUBLIC_KEY)".into(),
            )
        })
}
