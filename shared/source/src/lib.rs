//! The HTTP/JSON source: "what is item X now?" (docs/design.md, "Sources and triggers"). Used by the detector to scan and
//! by the dispatcher to re-fetch right before sending.
//!
//! Protocol (what an upstream, or an adapter in front of one, serves):
//!
//! - one item: `GET <item_url with {item} replaced>` → `200 {"price": 1100, "currency": "EUR",
//!   "in_stock": true, "paused": false}`. `"price": null` means the item has nothing to sell
//!   (`empty`); 404 is `not_found`; 429 is `rate_limited`; 5xx, a timeout or a connection error is
//!   `unavailable`; anything else, or a body we cannot read, is `bad_data`.
//! - many items (optional): `GET <batch_url with {items} replaced by comma-separated codes>` →
//!   `200 {"items": {"<code>": <item body> | {"error": "<kind>"} | null}}`; a code that is missing
//!   or null is `not_found`. A failed batch request fails each of its items the same way.
//!
//! Every host gets a concurrency limit, requests have connect and total timeouts, and response
//! bodies are read up to a cap, so a slow or hostile upstream cannot stall a scan or exhaust
//! memory.

use chrono::Utc;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tidings_domain::duration::parse_duration;
use tidings_domain::item::ItemCode;
use tidings_domain::trigger::{Observation, SourceErrorKind};
use tidings_runtime::flags;
use tidings_runtime::metrics::{Counter, Family, KindLabels};
use tokio::sync::Semaphore;

#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// URL template with `{item}`, e.g. `http://catalog/items/{item}`.
    pub item_url: String,
    /// Optional URL template with `{items}`, e.g. `http://catalog/items?codes={items}`.
    pub batch_url: Option<String>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Requests in flight per upstream host.
    pub max_concurrency_per_host: usize,
    /// Items per batch request.
    pub batch_size: usize,
}

impl SourceConfig {
    /// The source at `item_url`, everything else at its flag's default.
    pub fn new(item_url: impl Into<String>) -> Self {
        let item_url = item_url.into();
        flags::parsed_defaults::<SourceArgs>(&["--source-url", &item_url]).config()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceConfigError {
    #[error("source URL template {0:?} must contain {1}")]
    Placeholder(String, &'static str),
    #[error("source URL template {0:?} is not a valid http(s) URL: {1}")]
    Url(String, String),
    #[error("could not build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

tidings_runtime::families! {
    /// What sources answer instead of observations (exported by the services that read the
    /// catalog: the detector, the dispatcher, and the api for show-time checks).
    pub struct SourceMetrics {
        source_errors: Family<KindLabels, Counter> = Family::default()
            => "tidings_source_errors", "Source (catalog) errors by kind";
    }
}

fn source_errors() -> &'static Family<KindLabels, Counter> {
    &metrics().source_errors
}

/// A source answer that is not an observation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", kind.as_str())]
pub struct SourceError {
    pub kind: SourceErrorKind,
    pub detail: String,
}

impl SourceError {
    /// Every source error is made here, so this is where they are counted.
    fn new(kind: SourceErrorKind, detail: impl Into<String>) -> Self {
        source_errors()
            .get_or_create(&tidings_runtime::metrics::KindLabels {
                kind: kind.as_str().to_owned(),
            })
            .inc();
        SourceError {
            kind,
            detail: detail.into(),
        }
    }
}

pub type Fetched = Result<Observation, SourceError>;

const MAX_ITEM_BODY: usize = 64 * 1024;
const MAX_BATCH_BODY: usize = 16 * 1024 * 1024;

#[derive(Deserialize)]
struct ItemBody {
    price: Option<i64>,
    #[serde(default)]
    currency: String,
    in_stock: bool,
    #[serde(default)]
    paused: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BatchEntry {
    Error { error: SourceErrorKind },
    Item(ItemBody),
}

#[derive(Deserialize)]
struct BatchBody {
    items: HashMap<String, Option<BatchEntry>>,
}

impl ItemBody {
    fn into_observation(self) -> Fetched {
        match self.price {
            None => Err(SourceError::new(
                SourceErrorKind::Empty,
                "no price: nothing to sell",
            )),
            Some(p) if p < 0 => Err(SourceError::new(
                SourceErrorKind::BadData,
                format!("negative price {p}"),
            )),
            Some(price) => Ok(Observation {
                price,
                currency: self.currency,
                in_stock: self.in_stock,
                paused: self.paused,
                observed_at: Utc::now(),
            }),
        }
    }
}

/// The shipped source client.
pub struct HttpSource {
    client: reqwest::Client,
    config: SourceConfig,
    host: String,
    limits: HashMap<String, Arc<Semaphore>>,
}

fn host_of(template: &str, placeholder: &'static str) -> Result<String, SourceConfigError> {
    if !template.contains(placeholder) {
        return Err(SourceConfigError::Placeholder(
            template.to_owned(),
            placeholder,
        ));
    }
    let url = reqwest::Url::parse(&template.replace(placeholder, "x"))
        .map_err(|e| SourceConfigError::Url(template.to_owned(), e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(SourceConfigError::Url(
            template.to_owned(),
            "scheme must be http or https".into(),
        ));
    }
    let host = url
        .host_str()
        .ok_or_else(|| SourceConfigError::Url(template.to_owned(), "no host".into()))?;
    Ok(format!(
        "{host}:{}",
        url.port_or_known_default().unwrap_or(0)
    ))
}

impl HttpSource {
    pub fn new(config: SourceConfig) -> Result<Self, SourceConfigError> {
        tidings_runtime::metrics::at_zero(
            source_errors(),
            tidings_runtime::metrics::kinds(SourceErrorKind::ALL.map(SourceErrorKind::as_str)),
        );
        let mut limits = HashMap::new();
        let permits = config.max_concurrency_per_host.max(1);
        let mut hosts = vec![host_of(&config.item_url, "{item}")?];
        if let Some(batch) = &config.batch_url {
            hosts.push(host_of(batch, "{items}")?);
        }
        // hosts[0] is "host:port" of the item URL.
        let host = hosts[0]
            .rsplit_once(':')
            .map_or(hosts[0].as_str(), |(h, _)| h)
            .to_owned();
        for host in hosts {
            limits
                .entry(host)
                .or_insert_with(|| Arc::new(Semaphore::new(permits)));
        }
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(permits)
            .build()?;
        Ok(HttpSource {
            client,
            config,
            host,
            limits,
        })
    }

    /// The catalog's host (`server.address` of a fetch span).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn config(&self) -> &SourceConfig {
        &self.config
    }

    async fn get(&self, url: &str, host: &str, cap: usize) -> Result<Vec<u8>, SourceError> {
        let _permit = match self.limits.get(host) {
            Some(sem) => Some(sem.acquire().await.map_err(|_| {
                SourceError::new(SourceErrorKind::Unavailable, "source limiter closed")
            })?),
            None => None,
        };
        let mut resp = self.client.get(url).send().await.map_err(|e| {
            SourceError::new(SourceErrorKind::Unavailable, format!("GET {url}: {e}"))
        })?;
        let status = resp.status();
        if !status.is_success() {
            let kind = match status.as_u16() {
                404 => SourceErrorKind::NotFound,
                429 => SourceErrorKind::RateLimited,
                s if s >= 500 => SourceErrorKind::Unavailable,
                _ => SourceErrorKind::BadData,
            };
            return Err(SourceError::new(kind, format!("GET {url}: HTTP {status}")));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| {
            SourceError::new(
                SourceErrorKind::Unavailable,
                format!("GET {url}: reading body: {e}"),
            )
        })? {
            if body.len() + chunk.len() > cap {
                return Err(SourceError::new(
                    SourceErrorKind::BadData,
                    format!("GET {url}: body larger than {cap} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// One item.
    pub async fn fetch(&self, item: &ItemCode) -> Fetched {
        let url = self.config.item_url.replace("{item}", item.as_str());
        let host = host_of(&self.config.item_url, "{item}").unwrap_or_default();
        let body = self.get(&url, &host, MAX_ITEM_BODY).await?;
        serde_json::from_slice::<ItemBody>(&body)
            .map_err(|e| SourceError::new(SourceErrorKind::BadData, format!("GET {url}: {e}")))?
            .into_observation()
    }

    async fn fetch_batch(&self, items: &[ItemCode]) -> Vec<(ItemCode, Fetched)> {
        let Some(template) = &self.config.batch_url else {
            return Vec::new();
        };
        let codes: Vec<&str> = items.iter().map(ItemCode::as_str).collect();
        let url = template.replace("{items}", &codes.join(","));
        let host = host_of(template, "{items}").unwrap_or_default();
        let parsed = match self.get(&url, &host, MAX_BATCH_BODY).await {
            Ok(body) => serde_json::from_slice::<BatchBody>(&body).map_err(|e| {
                SourceError::new(
                    SourceErrorKind::BadData,
                    format!("batch of {}: {e}", items.len()),
                )
            }),
            Err(e) => Err(e),
        };
        match parsed {
            Err(e) => items.iter().map(|i| (i.clone(), Err(e.clone()))).collect(),
            Ok(mut batch) => items
                .iter()
                .map(|i| {
                    let answer = match batch.items.remove(i.as_str()).flatten() {
                        None => Err(SourceError::new(
                            SourceErrorKind::NotFound,
                            "not in batch answer",
                        )),
                        Some(BatchEntry::Error { error }) => {
                            Err(SourceError::new(error, "reported by the batch endpoint"))
                        }
                        Some(BatchEntry::Item(body)) => body.into_observation(),
                    };
                    (i.clone(), answer)
                })
                .collect(),
        }
    }

    /// Many items, through the batch endpoint when there is one; each item is asked once
    /// whatever its multiplicity in `items`.
    pub async fn fetch_many(&self, items: &[ItemCode]) -> HashMap<ItemCode, Fetched> {
        let mut unique: Vec<ItemCode> = items.to_vec();
        unique.sort();
        unique.dedup();
        if self.config.batch_url.is_some() {
            let chunks = unique.chunks(self.config.batch_size.max(1));
            futures::future::join_all(chunks.map(|c| self.fetch_batch(c)))
                .await
                .into_iter()
                .flatten()
                .collect()
        } else {
            let answers = futures::future::join_all(unique.iter().map(|i| self.fetch(i))).await;
            unique.into_iter().zip(answers).collect()
        }
    }
}

/// The source's flags.
#[derive(clap::Args, Clone, Debug)]
pub struct SourceArgs {
    /// Source URL template with {item}.
    #[arg(long, env = "TIDINGS_SOURCE_URL")]
    pub source_url: String,
    /// Optional batch URL template with {items} (comma-separated codes).
    #[arg(long, env = "TIDINGS_SOURCE_BATCH_URL")]
    pub source_batch_url: Option<String>,
    #[arg(long, env = "TIDINGS_SOURCE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub source_timeout: Duration,
    /// Source requests in flight per upstream host.
    #[arg(long, env = "TIDINGS_SOURCE_CONCURRENCY", default_value_t = 16)]
    pub source_concurrency: usize,
    /// Items per batch request.
    #[arg(long, env = "TIDINGS_SOURCE_BATCH_SIZE", default_value_t = 100)]
    pub source_batch_size: usize,
}

impl SourceArgs {
    pub fn config(&self) -> SourceConfig {
        SourceConfig {
            item_url: self.source_url.clone(),
            batch_url: self.source_batch_url.clone(),
            timeout: self.source_timeout,
            connect_timeout: Duration::from_secs(2),
            max_concurrency_per_host: self.source_concurrency,
            batch_size: self.source_batch_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_need_their_placeholder_and_an_http_url() {
        assert!(HttpSource::new(SourceConfig::new("http://catalog/items")).is_err());
        assert!(HttpSource::new(SourceConfig::new("ftp://catalog/{item}")).is_err());
        let mut c = SourceConfig::new("http://catalog/items/{item}");
        c.batch_url = Some("http://catalog/items".into());
        assert!(HttpSource::new(c).is_err());
        assert!(HttpSource::new(SourceConfig::new("http://catalog:8080/items/{item}")).is_ok());
    }

    #[test]
    fn item_bodies_classify() {
        let body = |json: &str| {
            serde_json::from_str::<ItemBody>(json)
                .unwrap()
                .into_observation()
        };
        let ok = body(r#"{"price": 1100, "currency": "EUR", "in_stock": true}"#).unwrap();
        assert_eq!((ok.price, ok.in_stock, ok.paused), (1100, true, false));
        assert_eq!(
            body(r#"{"price": null, "in_stock": false}"#)
                .unwrap_err()
                .kind,
            SourceErrorKind::Empty
        );
        assert_eq!(
            body(r#"{"price": -1, "in_stock": true}"#).unwrap_err().kind,
            SourceErrorKind::BadData
        );
    }
}
