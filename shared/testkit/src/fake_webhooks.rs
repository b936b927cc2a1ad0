//! A fake webhook receiver over HTTPS (the fixture certificate): what an API client runs. It
//! records every request as received (headers and body, unverified: tests verify signatures with
//! an independent implementation) and answers each endpoint as told: 2xx, any status with or
//! without `Retry-After`, or never, or only after a delay (the request arrived, the answer is
//! late).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

use crate::fake_push::serve_tls;

/// How the receiver answers a webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200 with a short body.
    Ok,
    /// This status, with this body.
    Status(u16, &'static str),
    /// 429 with `Retry-After`.
    TooManyRequests { retry_after: &'static str },
    /// Never answers.
    Hang,
    /// Takes the webhook (it counts as received) but answers 200 only after this long.
    OkAfter(Duration),
}

/// One webhook as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub endpoint: String,
    pub id: Option<String>,
    pub timestamp: Option<String>,
    pub signature: Option<String>,
    pub content_type: Option<String>,
    pub body: String,
    /// When it arrived (unix ms).
    pub at_ms: i64,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Default)]
struct Inner {
    /// A benchmark's sink: every webhook answered 200 and counted, nothing kept.
    sink: std::sync::atomic::AtomicBool,
    sunk: std::sync::atomic::AtomicU64,
    received: Mutex<Vec<Received>>,
    next: Mutex<HashMap<String, VecDeque<Answer>>>,
    always: Mutex<HashMap<String, Answer>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct FakeWebhookReceiver {
    addr: SocketAddr,
    inner: Arc<Inner>,
    _server: AbortOnDropHandle<()>,
}

async fn receive(
    State(inner): State<Arc<Inner>>,
    Path(endpoint): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if inner.sink.load(std::sync::atomic::Ordering::Relaxed) {
        inner
            .sunk
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return StatusCode::OK.into_response();
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    lock(&inner.received).push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        content_type: header("content-type"),
        body: String::from_utf8_lossy(&body).into_owned(),
        at_ms: chrono::Utc::now().timestamp_millis(),
        endpoint: endpoint.clone(),
    });
    let answer = lock(&inner.next)
        .get_mut(&endpoint)
        .and_then(VecDeque::pop_front)
        .or_else(|| lock(&inner.always).get(&endpoint).cloned())
        .unwrap_or(Answer::Ok);
    match answer {
        Answer::Ok => (StatusCode::OK, "thanks").into_response(),
        Answer::Status(status, body) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        )
            .into_response(),
        Answer::TooManyRequests { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", retry_after)],
            "slow down",
        )
            .into_response(),
        Answer::Hang => {
            futures::future::pending::<()>().await;
            StatusCode::OK.into_response()
        }
        Answer::OkAfter(delay) => {
            tokio::time::sleep(delay).await;
            (StatusCode::OK, "late thanks").into_response()
        }
    }
}

impl FakeWebhookReceiver {
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/hooks/{endpoint}", post(receive))
            .with_state(inner.clone());
        let (addr, server) = serve_tls(addr, app).await?;
        Ok(FakeWebhookReceiver {
            addr,
            inner,
            _server: server,
        })
    }

    /// A fast sink for benchmarks: every webhook answered 200, counted, not kept.
    pub async fn start_sink() -> std::io::Result<Self> {
        let s = Self::start().await?;
        s.inner
            .sink
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(s)
    }

    /// How many webhooks a sink took.
    pub fn sunk(&self) -> u64 {
        self.inner.sunk.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The URL of endpoint `name` on this receiver.
    pub fn url(&self, name: &str) -> String {
        format!("https://127.0.0.1:{}/hooks/{name}", self.addr.port())
    }

    /// Answers endpoint `name`'s next requests with `answers`, in order.
    pub fn answer_next(&self, name: &str, answers: &[Answer]) {
        lock(&self.inner.next)
            .entry(name.to_owned())
            .or_default()
            .extend(answers.iter().cloned());
    }

    /// Answers every request to endpoint `name` with `answer` (after any `answer_next`).
    pub fn answer_always(&self, name: &str, answer: Answer) {
        lock(&self.inner.always).insert(name.to_owned(), answer);
    }

    /// `GET /admin/webhooks/received`: every webhook received, oldest first, with its headers
    /// (for the demo, which runs this receiver in `tidings-fakes`).
    pub fn admin_router(&self) -> Router {
        let inner = self.inner.clone();
        let received = move || {
            let list: Vec<serde_json::Value> = lock(&inner.received)
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "endpoint": r.endpoint,
                        "webhook-id": r.id,
                        "webhook-timestamp": r.timestamp,
                        "webhook-signature": r.signature,
                        "body": r.body,
                    })
                })
                .collect();
            async move { axum::Json(list) }
        };
        Router::new().route("/admin/webhooks/received", axum::routing::get(received))
    }

    /// What endpoint `name` received, oldest first.
    pub fn received_by(&self, name: &str) -> Vec<Received> {
        lock(&self.inner.received)
            .iter()
            .filter(|r| r.endpoint == name)
            .cloned()
            .collect()
    }
}
