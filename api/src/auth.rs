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

/// An operator request (one of the operator tokens).
#[derive(Clone, Debug)]
pub struct Operator {
    /// The token's name: who the audit trail says acted.
    pub name: String,
}

/// An operator token the api accepts: its name and the SHA-256 of the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorToken {
    pub name: String,
    pub hash: Vec<u8>,
}

impl OperatorToken {
    pub fn named(name: &str, token: &str) -> Self {
        OperatorToken {
            name: name.to_owned(),
            hash: token_hash(token),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperatorTokensError {
    #[error(
        "line {line}: expected `NAME SHA256-HEX` (`tidings-api operator-token NAME` prints one)"
    )]
    Shape { line: usize },
    #[error("line {line}: a name is 1 to 64 of A–Z, a–z, 0–9, `.`, `_`, `@`, `-`")]
    Name { line: usize },
    #[error("line {line}: the hash is 64 hex digits, the SHA-256 of the token")]
    Hash { line: usize },
    #[error("line {line}: {name} is named twice")]
    Twice { line: usize, name: String },
}

/// Whether `name` may name an operator.
pub fn valid_operator_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".@_-".contains(&b))
}

/// The tokens of a `TIDINGS_ADMIN_TOKENS_FILE`: one `NAME SHA256-HEX` a line, `#` comments.
pub fn parse_operator_tokens(text: &str) -> Result<Vec<OperatorToken>, OperatorTokensError> {
    let mut tokens: Vec<OperatorToken> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut parts = content.split_whitespace();
        let (Some(name), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(OperatorTokensError::Shape { line });
        };
        if !valid_operator_name(name) {
            return Err(OperatorTokensError::Name { line });
        }
        let hex = hex.strip_prefix("sha256:").unwrap_or(hex);
        let hash = decode_hex(hex).ok_or(OperatorTokensError::Hash { line })?;
        if tokens.iter().any(|t| t.name == name) {
            return Err(OperatorTokensError::Twice {
                line,
                name: name.to_owned(),
            });
        }
        tokens.push(OperatorToken {
            name: name.to_owned(),
            hash,
        });
    }
    Ok(tokens)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// A new operator token for `name`: the token, and its line for `TIDINGS_ADMIN_TOKENS_FILE`.
pub fn new_operator_token(name: &str) -> Result<(String, String), ApiError> {
    let (token, _) = new_token()?;
    let token = format!("tot_{token}");
    let hex: String = token_hash(&token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((token, format!("{name} sha256:{hex}")))
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        // Already authenticated by the audit trail's middleware (`crate::audit::record`).
        if let Some(known) = parts.extensions.get::<Operator>() {
            return Ok(known.clone());
        }
        operator_of(parts, &app.settings.operators)
    }
}

/// The operator whose token `parts` carries. Every known token is compared, each in constant
/// time, so the time taken says nothing about which one (or how much of one) matched.
pub(crate) fn operator_of(parts: &Parts, known: &[OperatorToken]) -> Result<Operator, ApiError> {
    if known.is_empty() {
        return Err(ApiError::Unauthorized(
            "operator endpoints are disabled: no TIDINGS_ADMIN_TOKEN or TIDINGS_ADMIN_TOKENS_FILE is configured",
        ));
    }
    let given = token_hash(bearer(parts)?);
    let mut found = None;
    for token in known {
        #[allow(deprecated)]
        let same = aws_lc_rs::constant_time::verify_slices_are_equal(&given, &token.hash).is_ok();
        if same && found.is_none() {
            found = Some(token.name.clone());
        }
    }
    found
        .map(|name| Operator { name })
        .ok_or(ApiError::Unauthorized("invalid operator token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_of(token: &str) -> String {
        token_hash(token)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn the_tokens_file_names_each_hash_and_refuses_what_it_cannot_read() {
        let file = format!(
            "# on-call\nalice sha256:{}\n\nbob {}  # the second\n",
            hex_of("a-token"),
            hex_of("b-token")
        );
        let tokens = parse_operator_tokens(&file).unwrap();
        assert_eq!(
            tokens,
            vec![
                OperatorToken::named("alice", "a-token"),
                OperatorToken::named("bob", "b-token")
            ]
        );
        let h = hex_of("x");
        for (bad, why) in [
            ("alice".to_owned(), OperatorTokensError::Shape { line: 1 }),
            (
                format!("alice {h} extra"),
                OperatorTokensError::Shape { line: 1 },
            ),
            (
                format!("al ice:x {h}"),
                OperatorTokensError::Shape { line: 1 },
            ),
            (format!("al/ice {h}"), OperatorTokensError::Name { line: 1 }),
            (
                format!("alice {}", &h[..62]),
                OperatorTokensError::Hash { line: 1 },
            ),
            (
                format!("alice {}zz", &h[..62]),
                OperatorTokensError::Hash { line: 1 },
            ),
            (
                format!("alice {h}\nalice {h}"),
                OperatorTokensError::Twice {
                    line: 2,
                    name: "alice".into(),
                },
            ),
        ] {
            assert_eq!(parse_operator_tokens(&bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn a_printed_token_matches_its_printed_line() {
        let (token, line) = new_operator_token("carol").unwrap();
        assert!(token.starts_with("tot_"));
        let parsed = parse_operator_tokens(&line).unwrap();
        assert_eq!(parsed, vec![OperatorToken::named("carol", &token)]);
    }
}
