//! Device and operator authentication.
//!
//! A device token is 32 random bytes (base64url), shown once at registration; the database keeps
//! only its SHA-256. A request's token is hashed and looked up by hash, so the stored secret is
//! never compared byte by byte with input: timing reveals nothing about a token. The operator
//! token is compared as SHA-256 digests in constant time.

use crate::AppState;
use crate::problem::ApiError;
use aws_lc_rs::digest::{SHA256, digest};
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tidings_domain::DeviceId;
use tidings_store::db;

pub const TOKEN_BYTES: usize = 32;

/// A new device token and the hash to store.
pub fn new_token() -> Result<(String, Vec<u8>), ApiError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    aws_lc_rs::rand::fill(&mut bytes)
        .map_err(|_| ApiError::Internal("the system random generator failed".into()))?;
    let token = URL_SAFE_NO_PAD.encode(bytes);
    let hash = token_hash(&token);
    Ok((token, hash))
}

pub fn token_hash(token: &str) -> Vec<u8> {
    digest(&SHA256, token.as_bytes()).as_ref().to_vec()
}

pub(crate) fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or(ApiError::Unauthorized(
            "missing Authorization: Bearer token",
        ))?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        // RFC 9110 §11.1: the scheme is case-insensitive.
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::Unauthorized(
            "Authorization must be `Bearer <token>`",
        ))
}

/// The device a request's token belongs to.
#[derive(Clone, Debug)]
pub struct Device {
    pub id: DeviceId,
}

/// A device token's hash, not yet checked against the database: for statements that
/// authenticate and act in one round trip.
#[derive(Clone, Debug)]
pub struct DeviceToken {
    pub hash: Vec<u8>,
}

impl<S: Send + Sync> FromRequestParts<S> for DeviceToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        // A token of the wrong shape cannot match; no need to ask the database.
        if token.len() != 43 {
            return Err(ApiError::Unauthorized("invalid device token"));
        }
        Ok(DeviceToken {
            hash: token_hash(token),
        })
    }
}

impl DeviceToken {
    /// The live device this token belongs to.
    pub async fn device(&self, app: &AppState) -> Result<Device, ApiError> {
        let id = tidings_store::devices::authenticate(&app.pool, &self.hash)
            .await
            .map_err(db("authenticating a device"))?;
        id.map(|id| Device { id })
            .ok_or(ApiError::Unauthorized("invalid device token"))
    }
}

impl FromRequestParts<AppState> for Device {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        DeviceToken::from_request_parts(parts, app)
            .await?
            .device(app)
            .await
    }
}

/// An operator request (the admin token).
#[derive(Clone, Copy, Debug)]
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let Some(expected) = app.settings.admin_token_hash.as_deref() else {
            return Err(ApiError::Unauthorized(
                "operator endpoints are disabled: no TIDINGS_ADMIN_TOKEN is configured",
            ));
        };
        let given = token_hash(bearer(parts)?);
        #[allow(deprecated)]
        aws_lc_rs::constant_time::verify_slices_are_equal(&given, expected)
            .map(|()| Operator)
            .map_err(|_| ApiError::Unauthorized("invalid operator token"))
    }
}
