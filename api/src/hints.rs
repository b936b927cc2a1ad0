//! `POST /v1/items/changed`: change hints from whoever owns a source's data, signed with
//! Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`: `v1,` and the
//! base64 HMAC-SHA256 of `id.timestamp.body` under the source's secret). The signature names
//! the source: a hint is checked against each source's secrets. A verified hint is published on
//! `<prefix>.hints.<source>`, where every detector shard hears it and fetches those items now;
//! it is never trusted for a value. docs/sources.md, "Change hints".

use crate::AppState;
use crate::problem::{ApiError, Problem};
use aws_lc_rs::hmac;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tidings_domain::hints::BadHint;
use tidings_source::SourceConfig;
use utoipa::ToSchema;

/// How far a hint's `webhook-timestamp` may be from now, either way.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// Message ids remembered (for [`TOLERANCE`] each) to refuse a replay.
const SEEN_KEPT: usize = 100_000;

/// One source's keys: each secret of its file (two while one is rotated out).
#[derive(Clone)]
struct SourceKeys {
    source: String,
    keys: Vec<hmac::Key>,
}

/// Every source's hint secrets, read at start.
#[derive(Clone, Default)]
pub struct Keys {
    sources: Vec<SourceKeys>,
}

/// Names the sources, never their keys.
impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.sources.iter().map(|s| &s.source))
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("source {name:?}: reading its hint_secrets_file {path}")]
    Read {
        name: String,
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error(
        "source {name:?}: line {line} of {path} is not a Standard Webhooks secret (whsec_ and base64 of 24 to 64 bytes)"
    )]
    Form {
        name: String,
        path: PathBuf,
        line: usize,
    },
    #[error("source {0:?}: its hint_secrets_file holds no secret")]
    Empty(String),
}

impl Keys {
    /// The keys of `(source, secrets)` pairs, each secret written `whsec_<base64>`.
    pub fn new(sources: &[(&str, &[&str])]) -> Result<Self, SecretError> {
        let sources = sources
            .iter()
            .map(|(source, secrets)| {
                let keys = secrets
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        key(s).ok_or_else(|| SecretError::Form {
                            name: (*source).to_owned(),
                            path: PathBuf::new(),
                            line: i + 1,
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(SourceKeys {
                    source: (*source).to_owned(),
                    keys,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Keys { sources })
    }

    /// The keys of every source of `config` that has a `hint_secrets_file`.
    pub fn read(config: Option<&SourceConfig>) -> Result<Self, SecretError> {
        let mut sources = Vec::new();
        for spec in config.map(|c| c.sources.as_slice()).unwrap_or_default() {
            if let Some(path) = &spec.hints.secrets_file {
                sources.push(SourceKeys {
                    source: spec.name.clone(),
                    keys: read_secrets(&spec.name, path)?,
                });
            }
        }
        Ok(Keys { sources })
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }
}

fn read_secrets(source: &str, path: &Path) -> Result<Vec<hmac::Key>, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|error| SecretError::Read {
        name: source.to_owned(),
        path: path.to_owned(),
        error,
    })?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        keys.push(key(line.trim()).ok_or_else(|| SecretError::Form {
            name: source.to_owned(),
            path: path.to_owned(),
            line: i + 1,
        })?);
    }
    if keys.is_empty() {
        return Err(SecretError::Empty(source.to_owned()));
    }
    Ok(keys)
}

fn key(secret: &str) -> Option<hmac::Key> {
    let bytes = STANDARD.decode(secret.strip_prefix("whsec_")?).ok()?;
    (24..=64)
        .contains(&bytes.len())
        .then(|| hmac::Key::new(hmac::HMAC_SHA256, &bytes))
}

/// Why a hint was not taken (its metric label and the answer).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("missing or malformed {0} header")]
    Header(&'static str),
    #[error("webhook-timestamp is more than 5 minutes from now")]
    Stale,
    #[error("no source's secret signs this hint")]
    Signature,
    #[error("webhook-id {0:?} was already taken")]
    Replayed(String),
}

impl Refused {
    fn label(&self) -> &'static str {
        match self {
            Refused::Header(_) => "malformed",
            Refused::Stale => "stale",
            Refused::Signature => "unsigned",
            Refused::Replayed(_) => "replayed",
        }
    }
}

/// A hint's Standard Webhooks headers.
struct Signed<'a> {
    id: &'a str,
    timestamp: &'a str,
    signatures: Vec<Vec<u8>>,
}

fn signed(headers: &HeaderMap) -> Result<Signed<'_>, Refused> {
    let header = |name: &'static str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or(Refused::Header(name))
    };
    let id = header("webhook-id")?;
    let timestamp = header("webhook-timestamp")?;
    // Space-separated `v1,<base64>`; other versions are not ours to read.
    let signatures: Vec<Vec<u8>> = header("webhook-signature")?
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|s| STANDARD.decode(s).ok())
        .collect();
    if signatures.is_empty() {
        return Err(Refused::Header("webhook-signature"));
    }
    Ok(Signed {
        id,
        timestamp,
        signatures,
    })
}

impl Keys {
    /// The source whose secret signed `body` under `headers`, if the timestamp is within
    /// [`TOLERANCE`] of `now_unix`; returns it with the message id.
    pub fn verify<'a>(
        &self,
        headers: &'a HeaderMap,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(&str, &'a str), Refused> {
        let signed = signed(headers)?;
        let at: i64 = signed
            .timestamp
            .parse()
            .map_err(|_| Refused::Header("webhook-timestamp"))?;
        if at.abs_diff(now_unix) > TOLERANCE.as_secs() {
            return Err(Refused::Stale);
        }
        let mut content =
            Vec::with_capacity(signed.id.len() + signed.timestamp.len() + body.len() + 2);
        for part in [
            signed.id.as_bytes(),
            b".",
            signed.timestamp.as_bytes(),
            b".",
            body,
        ] {
            content.extend_from_slice(part);
        }
        for source in &self.sources {
            let verifies = source.keys.iter().any(|key| {
                signed
                    .signatures
                    .iter()
                    .any(|sig| hmac::verify(key, &content, sig).is_ok())
            });
            if verifies {
                return Ok((&source.source, signed.id));
            }
        }
        Err(Refused::Signature)
    }
}

/// Message ids taken in the last [`TOLERANCE`], per source: a replay within it is refused,
/// and one after it has a stale timestamp. Per api replica: a replay that reaches another
/// replica costs one more fetch of items already fetched (a hint carries no value).
#[derive(Default)]
pub struct Seen {
    taken: Mutex<HashMap<(String, String), Instant>>,
}

impl Seen {
    /// Takes `id` for `source`: false if it was taken before (or the memory is full of live ids).
    fn take(&self, source: &str, id: &str) -> bool {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let key = (source.to_owned(), id.to_owned());
        if taken.get(&key).is_some_and(|at| at.elapsed() < TOLERANCE) {
            return false;
        }
        if taken.len() >= SEEN_KEPT {
            taken.retain(|_, at| at.elapsed() < TOLERANCE);
            if taken.len() >= SEEN_KEPT {
                return false;
            }
        }
        taken.insert(key, Instant::now());
        true
    }
}

/// What a taken hint did.
#[derive(Debug, Serialize, ToSchema)]
pub struct HintTaken {
    /// The source whose secret signed it.
    pub source: String,
    /// Items the detectors will fetch now.
    pub items: usize,
}

#[utoipa::path(
    post, path = "/v1/items/changed", tag = "sources",
    request_body = HintBody,
    params(
        ("webhook-id" = String, Header, description = "The message's id, unique per source: a second hint with it is refused"),
        ("webhook-timestamp" = i64, Header, description = "Unix seconds, within 5 minutes of now"),
        ("webhook-signature" = String, Header, description = "`v1,<base64 HMAC-SHA256 of id.timestamp.body>`, space-separated when several"),
    ),
    responses(
        (status = 202, description = "Taken: every detector fetches those items now", body = HintTaken),
        (status = 401, description = "Unsigned, badly signed, or stale", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A webhook-id already taken (a replay)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not 1 to 1000 valid item codes", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The api has no NATS to pass hints on (TIDINGS_API_NATS)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn items_changed(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<HintTaken>), ApiError> {
    let refused = |r: Refused| {
        crate::metrics::hint(r.label());
        match r {
            Refused::Replayed(_) => ApiError::Conflict {
                kind: "replayed",
                detail: r.to_string(),
            },
            _ => ApiError::Unauthorized(match r {
                Refused::Stale => "webhook-timestamp is more than 5 minutes from now",
                Refused::Header(_) => {
                    "a signed hint needs webhook-id, webhook-timestamp and webhook-signature"
                }
                _ => "no source's secret signs this hint",
            }),
        }
    };
    let now = chrono::Utc::now().timestamp();
    let (source, id) = app
        .settings
        .hint_keys
        .verify(&headers, &body, now)
        .map_err(refused)?;
    let items = tidings_domain::hints::decode(&body).map_err(|e| {
        crate::metrics::hint("invalid");
        match e {
            BadHint::Code { index, .. } => ApiError::invalid(format!("/items/{index}"), e),
            _ => ApiError::invalid("/items", e),
        }
    })?;
    let bus = app.settings.bus.clone().ok_or_else(|| {
        ApiError::Unavailable("the api is not connected to NATS (set TIDINGS_API_NATS=true)".into())
    })?;
    if !app.hints_seen.take(source, id) {
        return Err(refused(Refused::Replayed(id.to_owned())));
    }
    let subject = app.settings.subjects.hints(source);
    // Flushed before answering: a 202 means the hint left for the detectors.
    let published = match bus.publish(subject, body.clone()).await {
        Ok(()) => bus.flush().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = published {
        tracing::warn!(source, webhook_id = id, error = %e, "publishing a change hint");
        return Err(ApiError::Unavailable(format!(
            "passing the hint on failed: {e}"
        )));
    }
    crate::metrics::hint("taken");
    tracing::info!(
        source,
        webhook_id = id,
        items = items.len(),
        "change hint taken"
    );
    Ok((
        StatusCode::ACCEPTED,
        Json(HintTaken {
            source: source.to_owned(),
            items: items.len(),
        }),
    ))
}

/// A hint's body (`tidings_domain::hints::ItemsChanged`), as the api's schema shows it.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct HintBody {
    /// Item codes as the source knows them (without its prefix), 1 to 1000.
    items: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(id: &str, ts: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("webhook-id", id),
            ("webhook-timestamp", ts),
            ("webhook-signature", sig),
        ] {
            h.insert(k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// The example of the Standard Webhooks specification.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn the_specification_example_verifies_and_what_differs_does_not() {
        let keys = Keys::new(&[("acme", &[SECRET])]).unwrap();
        let ts = TS.to_string();
        let good = headers(ID, &ts, SIGNATURE);
        assert_eq!(keys.verify(&good, BODY, TS).unwrap(), ("acme", ID));
        // Tampered body, another id, a stale or future timestamp, a wrong version tag.
        assert!(matches!(
            keys.verify(&good, br#"{"test": 2432232315}"#, TS),
            Err(Refused::Signature)
        ));
        assert!(matches!(
            keys.verify(&headers("msg_other", &ts, SIGNATURE), BODY, TS),
            Err(Refused::Signature)
        ));
        assert!(matches!(
            keys.verify(&good, BODY, TS + 301),
            Err(Refused::Stale)
        ));
        assert!(matches!(
            keys.verify(&good, BODY, TS - 301),
            Err(Refused::Stale)
        ));
        let v2 = SIGNATURE.replacen("v1,", "v2,", 1);
        assert!(matches!(
            keys.verify(&headers(ID, &ts, &v2), BODY, TS),
            Err(Refused::Header(_))
        ));
        assert!(matches!(
            keys.verify(&HeaderMap::new(), BODY, TS),
            Err(Refused::Header("webhook-id"))
        ));
    }

    #[test]
    fn during_a_rotation_either_secret_signs_and_the_signature_names_the_source() {
        let new = format!("whsec_{}", STANDARD.encode([7u8; 32]));
        let keys = Keys::new(&[
            ("other", &[new.as_str()]),
            ("acme", &[new.as_str(), SECRET]),
        ])
        .unwrap();
        let ts = TS.to_string();
        // Two signatures, one by a key nobody holds: the one that verifies is enough.
        let both = format!("v1,{} {SIGNATURE}", STANDARD.encode([1u8; 32]));
        assert_eq!(
            keys.verify(&headers(ID, &ts, &both), BODY, TS).unwrap().0,
            "acme"
        );
        assert!(
            Keys::new(&[("acme", &["whsec_c2hvcnQ="])]).is_err(),
            "5 bytes is too short"
        );
        assert!(Keys::new(&[("acme", &["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])]).is_err());
    }

    #[test]
    fn an_id_is_taken_once() {
        let seen = Seen::default();
        assert!(seen.take("acme", "msg_1"));
        assert!(!seen.take("acme", "msg_1"));
        assert!(seen.take("other", "msg_1"));
    }
}
