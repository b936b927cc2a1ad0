//! A fake catalog: serves observations whose values a test sets, in Tidings' own source
//! protocol (one item, and the batch form) and as a shop's JSON API would (`/shop/products/
//! {code}`, read by the `json` format) and as its product pages (`/shop/pages/{code}`, read by
//! the `schema.org` format), and answers 404, 429, 500 or hangs on demand. Item
//! answers carry an ETag and answer a request naming it with 304. Also runnable as a binary for
//! the demo (`PUT /admin/items/{code}`).

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tidings_domain::money;
use tidings_source::json::JsonMapping;
use tidings_source::{Format, SourceConfig, SourceSpec};
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
    not_modified: AtomicU64,
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

    /// `value` with its ETag, or 304 to a request that names it.
    fn conditional(&self, headers: &HeaderMap, value: serde_json::Value) -> Response {
        self.conditional_text(headers, value.to_string(), "application/json")
    }

    fn conditional_text(&self, headers: &HeaderMap, text: String, media_type: &str) -> Response {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&text, &mut hasher);
        let etag = format!("\"{:016x}\"", std::hash::Hasher::finish(&hasher));
        let asked = headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok());
        if asked == Some(etag.as_str()) {
            self.not_modified.fetch_add(1, Ordering::Relaxed);
            return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
        }
        (
            [
                (header::ETAG, etag),
                (header::CONTENT_TYPE, media_type.to_owned()),
            ],
            text,
        )
            .into_response()
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

/// The item a single-item request answers with, or the failure it meets instead.
async fn answerable(inner: &Inner, code: &str) -> Result<Item, Response> {
    inner.item_requests.fetch_add(1, Ordering::Relaxed);
    if let Some(failed) = inner.fault().await {
        return Err(failed);
    }
    let item = inner.look(code);
    let Some(item) = item else {
        return Err(StatusCode::NOT_FOUND.into_response());
    };
    let failed = match item.behavior {
        Behavior::NotFound => StatusCode::NOT_FOUND.into_response(),
        Behavior::RateLimited => {
            (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response()
        }
        Behavior::ServerError => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        Behavior::Hang => std::future::pending().await,
        Behavior::Normal | Behavior::Empty => return Ok(item),
    };
    Err(failed)
}

async fn one(
    State(inner): State<Arc<Inner>>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Response {
    match answerable(&inner, &code).await {
        Ok(item) => inner.conditional(&headers, body(&item)),
        Err(failed) => failed,
    }
}

/// How a `json` source reads [`shop_body`].
fn shop_mapping() -> serde_json::Value {
    serde_json::json!({
        "price": "/data/price/amount",
        "currency": "/data/price/currency",
        "availability": "/data/stock",
        "available": {"in_stock": true, "sold_out": false},
        "paused": "/data/hidden",
    })
}

/// The item's price as a decimal, as shops write it (`"12.99"`); none when it is empty.
fn decimal(item: &Item) -> Option<String> {
    (item.behavior != Behavior::Empty).then(|| {
        let text = money::format(item.price, &item.currency, money::Separators::POINT);
        text.replace(',', "")
            .replace(&format!(" {}", item.currency), "")
    })
}

/// The shop's product page for `code` (docs/sources.md's `schema.org` example): its JSON-LD
/// offers the item (sku `code`) and a gift-wrapped variant 5.00 dearer (sku `code-GIFT`), so a
/// watch must name its offer.
fn page_body(code: &str, item: &Item) -> String {
    let availability = match item.in_stock {
        true => "https://schema.org/InStock",
        false => "https://schema.org/OutOfStock",
    };
    let gift = Item {
        price: item.price + 500,
        ..item.clone()
    };
    let ld = serde_json::json!({
        "@context": "https://schema.org",
        "@type": "Product",
        "name": format!("Product {code}"),
        "offers": [
            {"@type": "Offer", "sku": code, "price": decimal(item),
             "priceCurrency": item.currency, "availability": availability},
            {"@type": "Offer", "sku": format!("{code}-GIFT"), "price": decimal(&gift),
             "priceCurrency": item.currency, "availability": availability},
        ],
    });
    format!(
        "<!doctype html><html><head><title>Product {code}</title>\n\
         <script type=\"application/ld+json\">{ld}</script></head>\n\
         <body><h1>Product {code}</h1></body></html>"
    )
}

async fn shop_page(
    State(inner): State<Arc<Inner>>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Response {
    match answerable(&inner, &code).await {
        Ok(item) => inner.conditional_text(&headers, page_body(&code, &item), "text/html"),
        Err(failed) => failed,
    }
}

/// The shop API's shape (docs/sources.md's `json` example): a decimal price as text.
fn shop_body(code: &str, item: &Item) -> serde_json::Value {
    let amount = decimal(item);
    serde_json::json!({
        "data": {
            "sku": code,
            "price": {"amount": amount, "currency": item.currency},
            "stock": if item.in_stock { "in_stock" } else { "sold_out" },
            "hidden": item.paused,
        }
    })
}

async fn shop_product(
    State(inner): State<Arc<Inner>>,
    Path(code): Path<String>,
    headers: HeaderMap,
) -> Response {
    match answerable(&inner, &code).await {
        Ok(item) => inner.conditional(&headers, shop_body(&code, &item)),
        Err(failed) => failed,
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
            .route("/shop/products/{code}", get(shop_product))
            .route("/shop/pages/{code}", get(shop_page))
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
            c.sources[0].format = Format::Tidings {
                batch_url: Some(self.batch_url()),
            };
        }
        c
    }

    /// A `json`-format source named `shop` for item codes `shop:<code>`, reading this catalog's
    /// shop API (the mapping docs/sources.md shows).
    pub fn shop_source(&self) -> SourceSpec {
        let mapping: JsonMapping = serde_json::from_value(shop_mapping())
            .unwrap_or_else(|e| panic!("the shop mapping is a test fixture: {e}"));
        let mut spec = SourceConfig::new(self.item_url()).sources.remove(0);
        spec.name = "shop".into();
        spec.prefix = "shop:".into();
        spec.format = Format::Json(mapping);
        spec.item_url = self.shop_url();
        spec
    }

    fn shop_url(&self) -> String {
        format!("http://{}/shop/products/{{item}}", self.addr)
    }

    /// A `schema.org`-format source named `pages` for item codes `page:<code>`, reading this
    /// catalog's product pages.
    pub fn page_source(&self) -> SourceSpec {
        let mut spec = SourceConfig::new(self.item_url()).sources.remove(0);
        spec.name = "pages".into();
        spec.prefix = "page:".into();
        spec.format = Format::SchemaOrg;
        spec.item_url = self.page_url();
        spec
    }

    fn page_url(&self) -> String {
        format!("http://{}/shop/pages/{{item}}", self.addr)
    }

    /// A `TIDINGS_SOURCES_FILE` with [`Self::shop_source`] and [`Self::page_source`], written as
    /// an operator would.
    pub fn sources_file(&self) -> serde_json::Value {
        serde_json::json!({"sources": [{
            "name": "shop",
            "prefix": "shop:",
            "format": "json",
            "url": self.shop_url(),
            "json": shop_mapping(),
        }, {
            "name": "pages",
            "prefix": "page:",
            "format": "schema.org",
            "url": self.page_url(),
        }]})
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

    /// Single-item requests answered 304 Not Modified so far.
    pub fn not_modified(&self) -> u64 {
        self.inner.not_modified.load(Ordering::Relaxed)
    }
}
