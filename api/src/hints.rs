//! `POST /v1/items/changed`: change hints from whoever owns a source's data, signed with
//! Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`: `v1,` and the
//! base64 HMAC-SHA256 of `id.timestamp.body` under the source's secret). The signature names
//! the source: a hint is checked against each source's secrets. A verified hint is published on
//! `<prefix>.hints.<source>`, where every detector shard hears it and fetches those items now;
//! it is never trusted for a value. docs/sources.md, "Change hints".

use crate::AppState;
use crate::extract::{ClientAddr, RawBody, within};
use crate::problem::{ApiError, Problem};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tidings_domain::hints::BadHint;
use tidings_domain::item::ItemCode;
use tidings_signatures::{self as signatures, BadSecret, Headers, Secret, Unverified};
use tidings_source::SourceConfig;
use utoipa::ToSchema;

/// How far a hint's `webhook-timestamp` may be from now, either way.
pub const TOLERANCE: Duration = Duration::from_secs(signatures::TOLERANCE_SECS);
/// Message ids remembered per source (for [`TOLERANCE`] each) to refuse a replay. One source
/// that fills its memory is slowed down; every other source keeps its own.
const SEEN_PER_SOURCE: usize = 20_000;

/// Every source's hint secrets (each its current one, and one being rotated out), read at start,
/// with the sources' prefixes (a hinted code must route to the source that signed it).
#[derive(Clone, Default)]
pub struct Keys {
    sources: Vec<(String, Vec<Secret>)>,
    routes: Option<SourceConfig>,
}

/// Names the sources, never their keys.
impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.sources.iter().map(|(source, _)| source))
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{name}: reading {path}")]
    Read {
        name: String,
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{name}: line {line} of {path:?}")]
    Form {
        name: String,
        path: PathBuf,
        line: usize,
        #[source]
        error: BadSecret,
    },
    #[error("{0}: the secrets file holds no secret")]
    Empty(String),
}

impl Keys {
    /// The keys of `(source, secrets)` pairs, each secret written `whsec_<base64>`.
    pub fn new(sources: &[(&str, &[&str])]) -> Result<Self, SecretError> {
        let mut keys = Keys::default();
        for (name, secrets) in sources {
            let parsed = secrets
                .iter()
                .enumerate()
                .map(|(i, s)| secret(name, Path::new(""), i, s))
                .collect::<Result<_, _>>()?;
            keys.sources.push(((*name).to_owned(), parsed));
        }
        Ok(keys)
    }

    /// The keys of every source of `config` that has a `hint_secrets_file`.
    pub fn read(config: Option<&SourceConfig>) -> Result<Self, SecretError> {
        let mut keys = Keys {
            routes: config.cloned(),
            ..Keys::default()
        };
        for spec in config.map(|c| c.sources.as_slice()).unwrap_or_default() {
            if let Some(path) = &spec.hints.secrets_file {
                keys.sources.push((
                    spec.name.clone(),
                    read_secrets(&format!("source {:?}'s hint_secrets_file", spec.name), path)?,
                ));
            }
        }
        Ok(keys)
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The source whose secret signed `body` under `headers` within the tolerance of
    /// `now_unix`, and the message id.
    pub fn verify<'a>(
        &self,
        headers: &'a HeaderMap,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(&str, &'a str), Unverified> {
        let signed = signed_headers(headers);
        let groups: Vec<&[Secret]> = self.sources.iter().map(|(_, s)| s.as_slice()).collect();
        let (group, id) = signatures::verify(&groups, signed, body, now_unix)?;
        Ok((self.sources[group].0.as_str(), id))
    }

    /// The first item `source` hinted that another source's prefix claims, and that source.
    fn foreign<'a>(&'a self, source: &str, items: &'a [ItemCode]) -> Option<(usize, &'a str)> {
        let routes = self.routes.as_ref()?;
        items.iter().enumerate().find_map(|(index, item)| {
            routes
                .claimed_from(source, item.as_str())
                .map(|other| (index, other))
        })
    }
}

fn secret(name: &str, path: &Path, index: usize, text: &str) -> Result<Secret, SecretError> {
    Secret::parse(text).map_err(|error| SecretError::Form {
        name: name.to_owned(),
        path: path.to_owned(),
        line: index + 1,
        error,
    })
}

/// The Standard Webhooks secrets in `path`, one a line (`name` says whose, in errors).
pub(crate) fn read_secrets(name: &str, path: &Path) -> Result<Vec<Secret>, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|error| SecretError::Read {
        name: name.to_owned(),
        path: path.to_owned(),
        error,
    })?;
    let secrets = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| secret(name, path, i, line))
        .collect::<Result<Vec<_>, _>>()?;
    if secrets.is_empty() {
        return Err(SecretError::Empty(name.to_owned()));
    }
    Ok(secrets)
}

/// The Standard Webhooks headers of a request, as received.
pub(crate) fn signed_headers(headers: &HeaderMap) -> Headers<'_> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    Headers {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
    }
}

/// Why a hint was not taken (its metric label and the answer).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Unverified(#[from] Unverified),
    #[error("webhook-id {0:?} was already taken")]
    Replayed(String),
    #[error("source {0:?} sent more than {SEEN_PER_SOURCE} hints in 5 minutes")]
    Saturated(String),
    #[error("item {index} belongs to source {owner:?}, not to {signer:?} that signed the hint")]
    Foreign {
        index: usize,
        signer: String,
        owner: String,
    },
}

impl Refused {
    fn label(&self) -> &'static str {
        match self {
            Refused::Unverified(Unverified::Header(_)) => "malformed",
            Refused::Unverified(Unverified::Stale) => "stale",
            Refused::Unverified(Unverified::Signature) => "unsigned",
            Refused::Replayed(_) => "replayed",
            Refused::Saturated(_) => "saturated",
            Refused::Foreign { .. } => "foreign",
        }
    }
}

/// Whether a message id was new.
#[derive(Debug, PartialEq, Eq)]
enum Taken {
    New,
    Replayed,
    /// The source's memory is full of ids still live: it sends faster than it may.
    Full,
}

/// Message ids taken in the last [`TOLERANCE`], each source in a memory of its own: a replay
/// within it is refused, and one after it has a stale timestamp. Per api replica: a replay that
/// reaches another replica costs one more fetch of items already fetched (a hint carries no
/// value). Ids are at most `tidings_signatures::MAX_ID_LEN` bytes, so a source's memory is
/// bounded too.
#[derive(Default)]
pub struct Seen {
    taken: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl Seen {
    fn take(&self, source: &str, id: &str) -> Taken {
        let mut all = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let taken = all.entry(source.to_owned()).or_default();
        if taken.get(id).is_some_and(|at| at.elapsed() < TOLERANCE) {
            return Taken::Replayed;
        }
        if taken.len() >= SEEN_PER_SOURCE {
            taken.retain(|_, at| at.elapsed() < TOLERANCE);
            if taken.len() >= SEEN_PER_SOURCE {
                return Taken::Full;
            }
        }
        taken.insert(id.to_owned(), Instant::now());
        Taken::New
    }
}

/// The answer to a refused hint, counted by why.
fn refused(r: Refused) -> ApiError {
    crate::metrics::hint(r.label());
    match r {
        Refused::Replayed(_) => ApiError::Conflict {
            kind: "replayed",
            detail: r.to_string(),
        },
        Refused::Saturated(_) => ApiError::RateLimited {
            what: "hints_per_source",
            retry_after: TOLERANCE,
        },
        Refused::Foreign { index, .. } => ApiError::invalid(format!("/items/{index}"), r),
        Refused::Unverified(Unverified::Stale) => {
            ApiError::Unauthorized("webhook-timestamp is more than 5 minutes from now")
        }
        Refused::Unverified(Unverified::Header(_)) => ApiError::Unauthorized(
            "a signed hint needs webhook-id (at most 256 bytes), webhook-timestamp and webhook-signature (at most 5 v1 signatures of 32 bytes)",
        ),
        Refused::Unverified(Unverified::Signature) => {
            ApiError::Unauthorized("no source's secret signs this hint")
        }
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
        (status = 422, description = "Not 1 to 1000 valid item codes, or a code another source's prefix claims", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many hints from this address, or from this source in 5 minutes", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The api has no NATS to pass hints on (TIDINGS_API_NATS)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn items_changed(
    State(app): State<AppState>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<HintTaken>), ApiError> {
    // Before any hashing: an unauthenticated sender is held to its address's rate.
    within(&app.limits.hints_per_address, &client, "hints_per_address")?;
    let now = chrono::Utc::now().timestamp();
    let (source, id) = app
        .settings
        .hint_keys
        .verify(&headers, &body, now)
        .map_err(|e| refused(e.into()))?;
    let items = tidings_domain::hints::decode(&body).map_err(|e| {
        crate::metrics::hint("invalid");
        match e {
            BadHint::Code { index, .. } => ApiError::invalid(format!("/items/{index}"), e),
            _ => ApiError::invalid("/items", e),
        }
    })?;
    if let Some((index, owner)) = app.settings.hint_keys.foreign(source, &items) {
        return Err(refused(Refused::Foreign {
            index,
            signer: source.to_owned(),
            owner: owner.to_owned(),
        }));
    }
    let bus = app.settings.bus.clone().ok_or_else(|| {
        ApiError::Unavailable("the api is not connected to NATS (set TIDINGS_API_NATS=true)".into())
    })?;
    match app.hints_seen.take(source, id) {
        Taken::New => {}
        Taken::Replayed => return Err(refused(Refused::Replayed(id.to_owned()))),
        Taken::Full => return Err(refused(Refused::Saturated(source.to_owned()))),
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

    #[test]
    fn the_secret_that_verifies_names_the_source() {
        let (acme, acme_text) = Secret::generate().unwrap();
        let (_, other_text) = Secret::generate().unwrap();
        let keys = Keys::new(&[
            ("other", &[other_text.as_str()]),
            ("acme", &[other_text.as_str(), acme_text.as_str()]),
        ])
        .unwrap();
        let body = br#"{"items": ["4711"]}"#;
        let sig = acme.sign("msg_1", 1_700_000_000, body);
        let h = headers("msg_1", "1700000000", &sig);
        assert_eq!(
            keys.verify(&h, body, 1_700_000_000).unwrap(),
            ("acme", "msg_1")
        );
        assert!(
            Keys::new(&[("acme", &["whsec_c2hvcnQ="])]).is_err(),
            "5 bytes is too short"
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// The fuzzing pass over the hint route's checks (`PROPTEST_CASES` sets how long): any
        /// headers and body are refused or taken without a panic, and never for a secret that
        /// did not sign them.
        #[test]
        fn fuzz_hint_headers_and_bodies(
            id in ".{0,300}",
            timestamp in prop_oneof![".{0,12}", (1_699_999_000i64..1_700_001_000).prop_map(|t| t.to_string())],
            signature in ".{0,400}",
            body in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let (_, secret) = Secret::generate().unwrap();
            let keys = Keys::new(&[("acme", &[secret.as_str()])]).unwrap();
            let mut h = HeaderMap::new();
            for (k, v) in [("webhook-id", &id), ("webhook-timestamp", &timestamp), ("webhook-signature", &signature)] {
                if let Ok(v) = HeaderValue::from_str(v) {
                    h.insert(k, v);
                }
            }
            prop_assert!(keys.verify(&h, &body, 1_700_000_000).is_err());
            let _ = tidings_domain::hints::decode(&body);
        }
    }

    #[test]
    fn an_id_is_taken_once() {
        let seen = Seen::default();
        assert_eq!(seen.take("acme", "msg_1"), Taken::New);
        assert_eq!(seen.take("acme", "msg_1"), Taken::Replayed);
        assert_eq!(seen.take("other", "msg_1"), Taken::New);
    }

    /// Regression: the memory was shared, so one source's secret could fill it and every other
    /// source's hints were refused (as replays) for five minutes.
    #[test]
    fn one_source_that_fills_its_memory_slows_only_itself() {
        let seen = Seen::default();
        for i in 0..SEEN_PER_SOURCE {
            assert_eq!(seen.take("flood", &format!("msg_{i}")), Taken::New);
        }
        assert_eq!(seen.take("flood", "one_more"), Taken::Full);
        assert_eq!(seen.take("acme", "msg_0"), Taken::New);
    }

    #[test]
    fn a_hinted_code_that_another_source_claims_is_foreign() {
        let config = SourceConfig::new("http://default/{item}")
            .with_source("acme", "acme:")
            .with_source("acme-eu", "acme:eu:");
        let keys = Keys {
            routes: Some(config),
            ..Keys::default()
        };
        let items: Vec<ItemCode> = ["42", "eu:42"]
            .iter()
            .map(|c| ItemCode::parse(c).unwrap())
            .collect();
        assert_eq!(keys.foreign("acme", &items), Some((1, "acme-eu")));
        assert_eq!(keys.foreign("acme-eu", &items), None);
        assert_eq!(keys.foreign("acme", &items[..1]), None);
        // The catch-all's hint for `acme:1` is acme's item.
        assert_eq!(keys.foreign("default", &items[..1]), None);
        let acme_item = [ItemCode::parse("acme:1").unwrap()];
        assert_eq!(keys.foreign("default", &acme_item), Some((0, "acme")));
    }
}
