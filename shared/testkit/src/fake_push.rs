//! A fake push service over HTTPS (the fixture certificate in `tests/fixtures/tls`).
//!
//! It behaves like FCM or Mozilla's autopush from the pusher's side, and checks what a real one
//! checks, independently of our own code: every body is decrypted with the subscription's private
//! key by `web-push-native` (an RFC 8291 implementation we did not write), and the VAPID JWT's
//! ES256 signature and claims (`aud` = this origin, `exp` ≤ 24 h ahead, `sub` mailto:/https:) are
//! verified. It records what it received and answers 201, 404, 410, 413, 429 with Retry-After,
//! 500, or hangs, per subscription and on demand.
//!
//! A subscription can be offline ([`FakePushService::set_offline`]): its pushes wait in the
//! service, a newer one with the same `Topic` replacing an older one (RFC 8030 §5.4), until it
//! comes back, and a waiting message can be deleted by a VAPID-signed `DELETE` on the `Location`
//! its push was answered with (RFC 8030 §6.3; 404 once delivered).

use aws_lc_rs::agreement::{ECDH_P256, PrivateKey};
use aws_lc_rs::encoding::{AsBigEndian, EcPrivateKeyBin};
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use tidings_domain::messages::Subscription;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::task::AbortOnDropHandle;

pub const CERT_PEM: &[u8] = include_bytes!("../../../tests/fixtures/tls/cert.pem");

/// The push hosts a pusher must allow for [`FakePushService::named_subscription`] and
/// [`FakePushService::subscription`] (`TIDINGS_PUSH_ALLOWED_HOSTS`).
pub const NAMED_HOSTS: &str = "localhost:*,127.0.0.1:*";
const KEY_PEM: &[u8] = include_bytes!("../../../tests/fixtures/tls/key.pem");

/// How the service answers a push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Created,
    NotFound,
    Gone,
    TooLarge,
    TooManyRequests {
        retry_after: String,
    },
    ServerError,
    Unauthorized,
    /// Never answers.
    Hang,
    /// Accepts the push (it counts as received) but answers 201 only after this long: past a
    /// pusher's HTTP timeout, the push arrived although the pusher saw a timeout.
    CreatedAfter(std::time::Duration),
}

/// One push as received, after decryption and VAPID verification.
#[derive(Clone, Debug)]
pub struct Received {
    pub subscription: String,
    pub plaintext: Vec<u8>,
    pub ttl: Option<String>,
    pub urgency: Option<String>,
    pub topic: Option<String>,
    pub vapid_claims: serde_json::Value,
    pub vapid_public_key: String,
    /// When the service accepted it (unix ms).
    pub at_ms: i64,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.plaintext).unwrap_or(serde_json::Value::Null)
    }

    /// The outbox row the notification is for (its payload's `id`): what counts deliveries per
    /// row now that a `Topic` names a watch.
    pub fn notification_id(&self) -> Option<String> {
        self.json()["id"].as_str().map(str::to_owned)
    }
}

/// What RFC 8030 asks of a push's headers, refused here as a push service would (400): `TTL` a
/// whole number of seconds, `Urgency` one of its four words, `Topic` at most 32 characters of
/// the URL-safe base64 alphabet. Tidings sends all three on every push.
fn check_headers(headers: &HeaderMap) -> Result<(), String> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match get("ttl") {
        Some(t) if t.parse::<u32>().is_ok() => {}
        other => return Err(format!("TTL {other:?} is not a whole number of seconds")),
    }
    match get("urgency") {
        Some("very-low" | "low" | "normal" | "high") => {}
        other => {
            return Err(format!(
                "Urgency {other:?} is not very-low, low, normal or high"
            ));
        }
    }
    match get("topic") {
        Some(t)
            if (1..=32).contains(&t.len())
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') => {}
        other => {
            return Err(format!(
                "Topic {other:?} is not 1 to 32 URL-safe base64 characters"
            ));
        }
    }
    Ok(())
}

struct Sub {
    secret: Vec<u8>,
    auth: [u8; 16],
    answers: VecDeque<Answer>,
    default: Answer,
    /// Its device is away: pushes wait in `Inner::waiting`.
    offline: bool,
}

#[derive(Default)]
struct Inner {
    subs: Mutex<HashMap<String, Sub>>,
    received: Mutex<Vec<Received>>,
    /// Accepted for an offline subscription and not yet delivered, by message id.
    waiting: Mutex<Vec<(String, Received)>>,
    /// Deleted by a DELETE while waiting.
    deleted: Mutex<Vec<Received>>,
    /// Requests refused for their headers, a bad VAPID token or a body that does not decrypt.
    rejected: Mutex<Vec<String>>,
    origin: Mutex<String>,
    /// Every request that reached the handler, whatever happened to it.
    hits: std::sync::atomic::AtomicUsize,
    /// Benchmark sink: answer 201 to everything without verifying or decrypting.
    sink: std::sync::atomic::AtomicBool,
    /// Sink: (Topic, unix ms) of every accepted push.
    sunk: Mutex<Vec<(String, i64)>>,
    /// Sink: one in this many topics is refused (503, Retry-After: 2) on its first attempt.
    flaky_one_in: std::sync::atomic::AtomicU64,
    flaked: Mutex<std::collections::HashSet<String>>,
    /// Sink: decrypt one push in this many (0: none), proving the load is real Web Push.
    sample_one_in: std::sync::atomic::AtomicU64,
    /// Random failures for pushes with no scripted answer (chaos runs).
    faults: Mutex<Option<Faults>>,
    draws: std::sync::atomic::AtomicU64,
}

/// How often a push with no scripted answer fails, in per mille of pushes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// 500.
    pub server_error: u64,
    /// 429 with Retry-After: 1.
    pub too_many_requests: u64,
    /// Accepted, answered 201 after `slow_delay` (past a pusher's timeout).
    pub slow_created: u64,
    pub slow_delay: std::time::Duration,
}

impl Inner {
    /// A pseudo-random draw in 0..1000 (SplitMix64 over a counter).
    fn draw(&self) -> u64 {
        let n = self
            .draws
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut z = n
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(0x2545_f491_4f6c_dd1d);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % 1000
    }

    /// The answer `faults` pick for this push, if any.
    fn fault(&self) -> Option<Answer> {
        let f = (*lock(&self.faults))?;
        let d = self.draw();
        if d < f.server_error {
            Some(Answer::ServerError)
        } else if d < f.server_error + f.too_many_requests {
            Some(Answer::TooManyRequests {
                retry_after: "1".into(),
            })
        } else if d < f.server_error + f.too_many_requests + f.slow_created {
            Some(Answer::CreatedAfter(f.slow_delay))
        } else {
            None
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct FakePushService {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    /// The server task, stopped when this is dropped.
    _server: AbortOnDropHandle<()>,
}

fn verify_vapid(headers: &HeaderMap, origin: &str) -> Result<(serde_json::Value, String), String> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or("no Authorization header")?;
    let rest = auth
        .strip_prefix("vapid ")
        .ok_or("Authorization is not vapid")?;
    let mut t = None;
    let mut k = None;
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("t=") {
            t = Some(v);
        } else if let Some(v) = part.strip_prefix("k=") {
            k = Some(v);
        }
    }
    let (t, k) = (t.ok_or("no t=")?, k.ok_or("no k=")?);
    let (input, sig) = t.rsplit_once('.').ok_or("JWT has no signature")?;
    let key = URL_SAFE_NO_PAD
        .decode(k)
        .map_err(|_| "k is not base64url")?;
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| "signature is not base64url")?;
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &key)
        .verify(input.as_bytes(), &sig)
        .map_err(|_| "ES256 signature does not verify")?;
    let claims = input.split('.').nth(1).ok_or("JWT has no claims")?;
    let claims: serde_json::Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(claims)
            .map_err(|_| "claims not base64url")?,
    )
    .map_err(|_| "claims not JSON")?;
    if claims["aud"] != origin {
        return Err(format!("aud {} is not {origin}", claims["aud"]));
    }
    let exp = claims["exp"].as_i64().ok_or("no exp")?;
    let now = chrono::Utc::now().timestamp();
    if exp <= now || exp > now + 24 * 3600 {
        return Err(format!("exp {exp} is not within 24 h of now {now}"));
    }
    let sub = claims["sub"].as_str().unwrap_or_default();
    if !(sub.starts_with("mailto:") || sub.starts_with("https:")) {
        return Err(format!("sub {sub:?} is not mailto: or https:"));
    }
    Ok((claims, k.to_owned()))
}

/// The origin a push was addressed to, which its VAPID `aud` must name: this service's own
/// (`https://127.0.0.1:PORT`), or the same port by the name `localhost`
/// ([`FakePushService::named_subscription`]).
fn addressed_origin(own: &str, uri: &axum::http::Uri, headers: &HeaderMap) -> String {
    let authority = uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| headers.get("host").and_then(|v| v.to_str().ok()));
    let named = own.replacen("https://127.0.0.1:", "https://localhost:", 1);
    match authority.map(|a| format!("https://{a}")) {
        Some(addressed) if addressed == named => named,
        _ => own.to_owned(),
    }
}

async fn push(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    inner.hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // When the push arrived: what a real push service would call its acceptance, before this
    // fake spends time verifying and decrypting.
    let arrived_ms = chrono::Utc::now().timestamp_millis();
    if let Err(e) = check_headers(&headers) {
        lock(&inner.rejected).push(format!("{id}: headers: {e}"));
        return (StatusCode::BAD_REQUEST, e).into_response();
    }
    if inner.sink.load(std::sync::atomic::Ordering::Relaxed)
        && let Some(answer) = sunk(&inner, &headers)
    {
        return answer;
    }
    let origin = addressed_origin(&lock(&inner.origin), &uri, &headers);
    let (vapid_claims, vapid_public_key) = match verify_vapid(&headers, &origin) {
        Ok(v) => v,
        Err(e) => {
            lock(&inner.rejected).push(format!("{id}: VAPID: {e}"));
            return (StatusCode::UNAUTHORIZED, e).into_response();
        }
    };
    let Some((answer, secret, auth, offline)) = inner.next_answer(&id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let message = uuid::Uuid::new_v4().simple().to_string();
    if answer == Answer::Hang {
        return std::future::pending().await;
    }
    if matches!(answer, Answer::Created | Answer::CreatedAfter(_)) {
        let Ok(secret) = p256::SecretKey::from_slice(&secret) else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let auth = web_push_native::Auth::clone_from_slice(&auth);
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        match web_push_native::decrypt(body.to_vec(), &secret, &auth) {
            Ok(plaintext) => inner.accept(
                &message,
                offline,
                Received {
                    subscription: id.clone(),
                    plaintext,
                    ttl: header("ttl"),
                    urgency: header("urgency"),
                    topic: header("topic"),
                    vapid_claims,
                    vapid_public_key,
                    at_ms: arrived_ms,
                },
            ),
            Err(e) => {
                lock(&inner.rejected).push(format!("{id}: decrypt: {e:?}"));
                return (StatusCode::BAD_REQUEST, "cannot decrypt").into_response();
            }
        }
    }
    inner.respond(answer, &origin, &message).await
}

/// `DELETE /m/{message}` (RFC 8030 §6.3): 204 for a message still waiting for its device, 404
/// for one delivered or unknown; 401 without a VAPID token for this origin.
async fn delete_message(
    State(inner): State<Arc<Inner>>,
    Path(message): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    inner.hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let origin = addressed_origin(&lock(&inner.origin), &uri, &headers);
    if let Err(e) = verify_vapid(&headers, &origin) {
        lock(&inner.rejected).push(format!("DELETE {message}: VAPID: {e}"));
        return (StatusCode::UNAUTHORIZED, e).into_response();
    }
    let mut waiting = lock(&inner.waiting);
    match waiting.iter().position(|(m, _)| *m == message) {
        Some(i) => {
            let (_, r) = waiting.remove(i);
            lock(&inner.deleted).push(r);
            StatusCode::NO_CONTENT.into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// In sink mode: the answer to a push that is only counted (or refused once, when flaky); `None`
/// for a sampled push, which goes on to full verification and decryption.
fn sunk(inner: &Inner, headers: &HeaderMap) -> Option<Response> {
    let topic = headers
        .get("topic")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let flaky = inner
        .flaky_one_in
        .load(std::sync::atomic::Ordering::Relaxed);
    if flaky > 0
        && topic_hash(&topic).is_multiple_of(flaky)
        && lock(&inner.flaked).insert(topic.clone())
    {
        return Some((StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "2")]).into_response());
    }
    lock(&inner.sunk).push((topic, chrono::Utc::now().timestamp_millis()));
    let n = inner.hits.load(std::sync::atomic::Ordering::Relaxed) as u64;
    let sample = inner
        .sample_one_in
        .load(std::sync::atomic::Ordering::Relaxed);
    if sample == 0 || !n.is_multiple_of(sample) {
        return Some((StatusCode::CREATED, [("location", "/m/sink")]).into_response());
    }
    None
}

impl Inner {
    /// Takes push `r` as message `message`: delivered at once, or for an offline subscription
    /// kept waiting in place of any waiting message of the same subscription and topic.
    fn accept(&self, message: &str, offline: bool, r: Received) {
        if !offline {
            lock(&self.received).push(r);
            return;
        }
        let mut waiting = lock(&self.waiting);
        if r.topic.is_some() {
            waiting.retain(|(_, w)| !(w.subscription == r.subscription && w.topic == r.topic));
        }
        waiting.push((message.to_owned(), r));
    }

    /// Subscription `id`'s next scripted answer (or its default), with its keys and whether it
    /// is offline; `None` if there is no such subscription.
    fn next_answer(&self, id: &str) -> Option<(Answer, Vec<u8>, [u8; 16], bool)> {
        let mut subs = lock(&self.subs);
        let sub = subs.get_mut(id)?;
        let answer = match sub.answers.pop_front() {
            Some(a) => a,
            None if sub.default == Answer::Created => {
                self.fault().unwrap_or_else(|| sub.default.clone())
            }
            None => sub.default.clone(),
        };
        Some((answer, sub.secret.clone(), sub.auth, sub.offline))
    }

    /// The HTTP answer a scripted `answer` stands for; an accepted push is message `message`.
    async fn respond(&self, answer: Answer, origin: &str, message: &str) -> Response {
        match answer {
            Answer::CreatedAfter(delay) => {
                tokio::time::sleep(delay).await;
                let location = format!("{origin}/m/late");
                (StatusCode::CREATED, [("location", location)]).into_response()
            }
            Answer::Created => {
                let location = format!("{origin}/m/{message}");
                (StatusCode::CREATED, [("location", location)]).into_response()
            }
            Answer::NotFound => StatusCode::NOT_FOUND.into_response(),
            Answer::Gone => StatusCode::GONE.into_response(),
            Answer::TooLarge => StatusCode::PAYLOAD_TOO_LARGE.into_response(),
            Answer::TooManyRequests { retry_after } => (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", retry_after)],
            )
                .into_response(),
            Answer::ServerError => {
                (StatusCode::INTERNAL_SERVER_ERROR, "upstream exploded").into_response()
            }
            Answer::Unauthorized => StatusCode::UNAUTHORIZED.into_response(),
            Answer::Hang => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    }
}

/// Serves `app` over TLS (HTTP/2 or 1.1) with the fixture certificate, on `addr`, until the
/// handle is dropped.
pub async fn serve_tls(
    addr: SocketAddr,
    app: Router,
) -> std::io::Result<(SocketAddr, AbortOnDropHandle<()>)> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(CERT_PEM)
        .collect::<Result<_, _>>()
        .map_err(std::io::Error::other)?;
    let key = PrivateKeyDer::from_pem_slice(KEY_PEM).map_err(std::io::Error::other)?;
    let mut tls = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(std::io::Error::other)?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    });
    Ok((addr, AbortOnDropHandle::new(server)))
}

impl FakePushService {
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/push/{id}", post(push))
            .route("/m/{message}", delete(delete_message))
            .with_state(inner.clone());
        let (addr, server) = serve_tls(addr, app).await?;
        *lock(&inner.origin) = format!("https://127.0.0.1:{}", addr.port());
        Ok(FakePushService {
            addr,
            inner,
            _server: server,
        })
    }

    /// A fast local sink for benchmarks: every push is answered 201 unread.
    pub async fn start_sink() -> std::io::Result<Self> {
        let s = Self::start().await?;
        s.inner
            .sink
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(s)
    }

    /// A new browser-like subscription on this service (fresh P-256 key pair and auth secret).
    pub fn subscription(&self) -> Subscription {
        new_subscription(&self.inner, self.addr.port())
    }

    /// [`FakePushService::subscription`] whose endpoint names its host, `localhost`, as a real
    /// push service's does: a pusher resolves it (the benchmarks count that cost). Allowed by
    /// [`NAMED_HOSTS`].
    pub fn named_subscription(&self) -> Subscription {
        let sub = self.subscription();
        Subscription {
            endpoint: sub
                .endpoint
                .replacen("https://127.0.0.1:", "https://localhost:", 1),
            ..sub
        }
    }

    /// Sink: refuse the first attempt of one topic in `n` with 503 + Retry-After: 2 (0: never).
    pub fn set_flaky(&self, n: u64) {
        self.inner
            .flaky_one_in
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sink: fully verify and decrypt one push in `n` (0: none).
    pub fn set_sample(&self, n: u64) {
        self.inner
            .sample_one_in
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sink: (Topic, unix ms) of every push accepted so far.
    pub fn sunk(&self) -> Vec<(String, i64)> {
        lock(&self.inner.sunk).clone()
    }

    /// Plain-HTTP control of this service for the demo (`tidings-fakes`):
    /// `POST /admin/push/subscriptions` makes a subscription (as `PushSubscription.toJSON()`),
    /// `POST /admin/push/subscriptions/{id}/answers` queues answers (`created`, `gone`,
    /// `not_found`, `too_large`, `server_error`, `unauthorized`, `429:<retry-after>`),
    /// `GET /admin/push/received` lists what was accepted, decrypted.
    pub fn admin_router(&self) -> Router {
        let (inner, port) = (self.inner.clone(), self.addr.port());
        let make = {
            let inner = inner.clone();
            move || {
                let sub = new_subscription(&inner, port);
                async move {
                    axum::Json(serde_json::json!({
                        "endpoint": sub.endpoint,
                        "expirationTime": null,
                        "keys": {"p256dh": sub.p256dh, "auth": sub.auth},
                    }))
                }
            }
        };
        let queue = {
            let inner = inner.clone();
            move |Path(id): Path<String>, axum::Json(answers): axum::Json<Vec<String>>| {
                let parsed: Result<Vec<Answer>, String> =
                    answers.iter().map(|a| parse_answer(a)).collect();
                let result = parsed.and_then(|answers| {
                    lock(&inner.subs)
                        .get_mut(&id)
                        .map(|s| s.answers.extend(answers))
                        .ok_or_else(|| format!("no subscription {id}"))
                });
                async move {
                    match result {
                        Ok(()) => StatusCode::NO_CONTENT.into_response(),
                        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
                    }
                }
            }
        };
        let received = move || {
            let list: Vec<serde_json::Value> = lock(&inner.received)
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "subscription": r.subscription,
                        "topic": r.topic,
                        "urgency": r.urgency,
                        "ttl": r.ttl,
                        "body": r.json(),
                    })
                })
                .collect();
            async move { axum::Json(list) }
        };
        Router::new()
            .route("/admin/push/subscriptions", post(make))
            .route("/admin/push/subscriptions/{id}/answers", post(queue))
            .route("/admin/push/received", axum::routing::get(received))
    }
}

fn topic_hash(topic: &str) -> u64 {
    topic.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn parse_answer(a: &str) -> Result<Answer, String> {
    Ok(match a {
        "created" => Answer::Created,
        "gone" => Answer::Gone,
        "not_found" => Answer::NotFound,
        "too_large" => Answer::TooLarge,
        "server_error" => Answer::ServerError,
        "unauthorized" => Answer::Unauthorized,
        "hang" => Answer::Hang,
        other => match other.strip_prefix("429:") {
            Some(ra) => Answer::TooManyRequests {
                retry_after: ra.to_owned(),
            },
            None => return Err(format!("unknown answer {other:?}")),
        },
    })
}

fn new_subscription(inner: &Inner, port: u16) -> Subscription {
    let private = PrivateKey::generate(&ECDH_P256).expect("key");
    let public = private.compute_public_key().expect("public key");
    let scalar: EcPrivateKeyBin<'static> = private.as_be_bytes().expect("scalar");
    let mut auth = [0u8; 16];
    aws_lc_rs::rand::fill(&mut auth).expect("random");
    let id = uuid::Uuid::new_v4().simple().to_string();
    lock(&inner.subs).insert(
        id.clone(),
        Sub {
            secret: scalar.as_ref().to_vec(),
            auth,
            answers: VecDeque::new(),
            default: Answer::Created,
            offline: false,
        },
    );
    Subscription {
        endpoint: format!("https://127.0.0.1:{}/push/{id}", port),
        p256dh: URL_SAFE_NO_PAD.encode(public.as_ref()),
        auth: URL_SAFE_NO_PAD.encode(auth),
    }
}

impl FakePushService {
    fn sub_id(endpoint: &str) -> String {
        endpoint.rsplit('/').next().unwrap_or_default().to_owned()
    }

    /// The next answers for a subscription, then its default again.
    /// Random failures for every push with no scripted answer (`None`: none).
    pub fn set_faults(&self, faults: Option<Faults>) {
        *lock(&self.inner.faults) = faults;
    }

    pub fn answer_next(&self, sub: &Subscription, answers: &[Answer]) {
        if let Some(s) = lock(&self.inner.subs).get_mut(&Self::sub_id(&sub.endpoint)) {
            s.answers.extend(answers.iter().cloned());
        }
    }

    /// The answer for every push to `sub` from now on.
    pub fn answer_always(&self, sub: &Subscription, answer: Answer) {
        if let Some(s) = lock(&self.inner.subs).get_mut(&Self::sub_id(&sub.endpoint)) {
            s.default = answer;
        }
    }

    /// Takes `sub`'s device away (its pushes wait, and can be deleted) or brings it back (what
    /// waited is delivered, oldest first).
    pub fn set_offline(&self, sub: &Subscription, offline: bool) {
        let id = Self::sub_id(&sub.endpoint);
        if let Some(s) = lock(&self.inner.subs).get_mut(&id) {
            s.offline = offline;
        }
        if !offline {
            let mut waiting = lock(&self.inner.waiting);
            let (back, stay): (Vec<_>, Vec<_>) =
                waiting.drain(..).partition(|(_, r)| r.subscription == id);
            *waiting = stay;
            lock(&self.inner.received).extend(back.into_iter().map(|(_, r)| r));
        }
    }

    /// Pushes waiting for an offline device.
    pub fn waiting(&self) -> Vec<Received> {
        lock(&self.inner.waiting)
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Waiting pushes deleted by their sender.
    pub fn deleted(&self) -> Vec<Received> {
        lock(&self.inner.deleted).clone()
    }

    /// Pushes accepted (201) so far, decrypted.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.inner.received).clone()
    }

    /// Pushes received for `sub` (accepted ones only).
    pub fn received_by(&self, sub: &Subscription) -> Vec<Received> {
        let id = Self::sub_id(&sub.endpoint);
        self.received()
            .into_iter()
            .filter(|r| r.subscription == id)
            .collect()
    }

    /// Requests that reached the service at all.
    pub fn hits(&self) -> usize {
        self.inner.hits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests refused for their headers, a bad VAPID token or an undecryptable body.
    pub fn rejected(&self) -> Vec<String> {
        lock(&self.inner.rejected).clone()
    }
}
