//! A fake catalog: serves observations whose values a test sets, speaking the source protocol
//! of `tidings_source` (one item, and the batch form), and answers 404, 429, 500 or
//! hangs on demand. Also runnable as a binary for the demo (`PUT /admin/items/{code}`).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tidings_source::SourceConfig;
use tokio_util::task::AbortOnDropHandle;

/// How the catalog answers for an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    #[default]
    Normal,
    NotFound,
    /// 200 with no price: nothing to sell.
    Empty,
    RateLimited,
    ServerError,
    /// Never answers.
    Hang,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub price: i64,
    #[serde(default = "eur")]
    pub currency: String,
    #[serde(default = "yes")]
    pub in_stock: bool,
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub behavior: Behavior,
    /// Prices to answer with, one per request, before `price` is answered again: a price that
    /// moves between two looks (e.g. the detector sees a drop, the re-check a recovery).
    #[serde(default)]
    pub script: Vec<i64>,
    /// A price series in time: (unix ms, price) steps, sorted; before the first step `price`
    /// applies. What a benchmark's moving market looks like.
    #[serde(default)]
    pub timeline: Vec<(i64, i64)>,
}

impl Item {
    /// The price at `unix_ms` by the timeline (or `price`).
    pub fn price_at(&self, unix_ms: i64) -> i64 {
        self.timeline
            .iter()
            .take_while(|(t, _)| *t <= unix_ms)
            .last()
            .map_or(self.price, |(_, p)| *p)
    }
}

fn eur() -> String {
    "EUR".into()
}

fn yes() -> bool {
    true
}

impl Item {
    pub fn priced(price: i64) -> Self {
        Item {
            price,
            currency: eur(),
            in_stock: true,
            paused: false,
            behavior: Behavior::Normal,
            script: Vec::new(),
            timeline: Vec::new(),
        }
    }
}

#[derive(Default)]
struct Inner {
    items: Mutex<HashMap<String, Item>>,
    item_requests: AtomicU64,
    batch_requests: AtomicU64,
    /// Per mille of requests that fail (chaos runs): a third each 503, 429, and an answer slower
    /// than any client's timeout.
    faults: AtomicU64,
    draws: AtomicU64,
}

impl Inner {
    /// The failure this request meets, if any.
    async fn fault(&self) -> Option<Response> {
        let per_mille = self.faults.load(Ordering::Relaxed);
        if per_mille == 0 {
            return None;
        }
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        let mut z = n
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(0x632b_e59b_d9b4_e019);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 31)) % 3000;
        if z >= 3 * per_mille {
            return None;
        }
        Some(match z % 3 {
            0 => StatusCode::SERVICE_UNAVAILABLE.into_response(),
            1 => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response(),
            _ => {
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                StatusCode::SERVICE_UNAVAILABLE.into_response()
            }
        })
    }

    fn items(&self) -> MutexGuard<'_, HashMap<String, Item>> {
        // A test that panicked while holding the lock has already failed; keep serving.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The item as this request sees it: the next scripted price, if any, is used up.
    fn look(&self, code: &str) -> Option<Item> {
        let mut items = self.items();
        let item = items.get_mut(code)?;
        let mut seen = item.clone();
        if !item.script.is_empty() {
            seen.price = item.script.remove(0);
        } else if !item.timeline.is_empty() {
            seen.price = item.price_at(chrono::Utc::now().timestamp_millis());
        }
        Some(seen)
    }
}

pub struct FakeCatalog {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    /// The server task, stopped when this is dropped.
    _server: AbortOnDropHandle<()>,
}

fn body(item: &Item) -> serde_json::Value {
    let price = if item.behavior == Behavior::Empty {
        None
    } else {
        Some(item.price)
    };
    serde_json::json!({
        "price": price,
        "currency": item.currency,
        "in_stock": item.in_stock && item.behavior != Behavior::Empty,
        "paused": item.paused,
    })
}

async fn one(State(inner): State<Arc<Inner>>, Path(code): Path<String>) -> Response {
    inner.item_requests.fetch_add(1, Ordering::Relaxed);
    if let Some(failed) = inner.fault().await {
        return failed;
    }
    let item = inner.look(&code);
    let Some(item) = item else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match item.behavior {
        Behavior::NotFound => StatusCode::NOT_FOUND.into_response(),
        Behavior::RateLimited => {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response()
        }
        Behavior::ServerError => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Behavior::Hang => std::future::pending().await,
        Behavior::Normal | Behavior::Empty => Json(body(&item)).into_response(),
    }
}

#[derive(Deserialize)]
struct BatchQuery {
    codes: String,
}

async fn many(State(inner): State<Arc<Inner>>, Query(q): Query<BatchQuery>) -> Response {
    inner.batch_requests.fetch_add(1, Ordering::Relaxed);
    if let Some(failed) = inner.fault().await {
        return failed;
    }
    let answers: Vec<(String, Option<Item>)> = q
        .codes
        .split(',')
        .map(|c| (c.to_owned(), inner.look(c)))
        .collect();
    if answers
        .iter()
        .any(|(_, i)| i.as_ref().is_some_and(|i| i.behavior == Behavior::Hang))
    {
        return std::future::pending().await;
    }
    let mut out = serde_json::Map::new();
    for (code, item) in answers {
        let v = match item {
            None => serde_json::Value::Null,
            Some(i) => match i.behavior {
                Behavior::NotFound => serde_json::Value::Null,
                Behavior::RateLimited => serde_json::json!({"error": "rate_limited"}),
                Behavior::ServerError => serde_json::json!({"error": "unavailable"}),
                Behavior::Normal | Behavior::Empty | Behavior::Hang => body(&i),
            },
        };
        out.insert(code, v);
    }
    Json(serde_json::json!({ "items": out })).into_response()
}

async fn admin_put(
    State(inner): State<Arc<Inner>>,
    Path(code): Path<String>,
    Json(item): Json<Item>,
) -> StatusCode {
    inner.items().insert(code, item);
    StatusCode::NO_CONTENT
}

async fn admin_get(State(inner): State<Arc<Inner>>) -> Json<HashMap<String, Item>> {
    Json(inner.items().clone())
}

impl FakeCatalog {
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .route("/items", get(many))
            .route("/items/{code}", get(one))
            .route("/admin/items", get(admin_get))
            .route("/admin/items/{code}", put(admin_put))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("fake catalog stopped: {e}");
            }
        });
        Ok(FakeCatalog {
            addr,
            inner,
            _server: AbortOnDropHandle::new(server),
        })
    }

    pub fn item_url(&self) -> String {
        format!("http://{}/items/{{item}}", self.addr)
    }

    /// `PUT {admin_url}/{code}` with an [`Item`] sets what the catalog answers for `code`.
    pub fn admin_url(&self) -> String {
        format!("http://{}/admin/items", self.addr)
    }

    pub fn batch_url(&self) -> String {
        format!("http://{}/items?codes={{items}}", self.addr)
    }

    /// A source configuration pointing here, with the batch endpoint or without.
    pub fn source_config(&self, batch: bool) -> SourceConfig {
        let mut c = SourceConfig::new(self.item_url());
        if batch {
            c.batch_url = Some(self.batch_url());
        }
        c
    }

    pub fn set(&self, code: &str, item: Item) {
        self.inner.items().insert(code.to_owned(), item);
    }

    /// In stock at `price`, answering normally.
    pub fn set_price(&self, code: &str, price: i64) {
        self.set(code, Item::priced(price));
    }

    /// Changes one thing of an item (one priced 0 if it is new).
    fn change(&self, code: &str, f: impl FnOnce(&mut Item)) {
        let mut items = self.inner.items();
        f(items
            .entry(code.to_owned())
            .or_insert_with(|| Item::priced(0)));
    }

    pub fn set_behavior(&self, code: &str, behavior: Behavior) {
        self.change(code, |item| item.behavior = behavior);
    }

    pub fn set_in_stock(&self, code: &str, in_stock: bool) {
        self.change(code, |item| item.in_stock = in_stock);
    }

    /// Answer `prices` to the next requests for `code`, one each, then its price again.
    pub fn script(&self, code: &str, prices: &[i64]) {
        self.inner
            .items()
            .entry(code.to_owned())
            .or_insert_with(|| Item::priced(0))
            .script = prices.to_vec();
    }

    /// Fail this many requests per mille (0: none): 503, 429, or too slow to answer.
    pub fn set_faults(&self, per_mille: u64) {
        self.inner.faults.store(per_mille, Ordering::Relaxed);
    }

    /// (single-item requests, batch requests) served so far.
    pub fn requests(&self) -> (u64, u64) {
        (
            self.inner.item_requests.load(Ordering::Relaxed),
            self.inner.batch_requests.load(Ordering::Relaxed),
        )
    }
}
