//! One source's HTTP side: per-host concurrency, timeouts, a body cap, and conditional requests
//! (ETag / Last-Modified) so an unchanged item costs its upstream a 304 and us no parsing.

use crate::config::{Format, SourceConfigError, SourceSpec};
use crate::{Fetched, SourceError, schema_org, source_requests, tidings};
use chrono::Utc;
use reqwest::StatusCode;
use reqwest::header::{ETAG, HeaderMap, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tidings_domain::item::ItemCode;
use tidings_domain::trigger::{Observation, SourceErrorKind};
use tidings_runtime::metrics::SourceRequestLabels;
use tokio::sync::Semaphore;

/// Items whose validators one source remembers; past it the memory starts over (a full
/// response each, once), so it stays bounded whatever the number of watched items.
const VALIDATORS_KEPT: usize = 200_000;

/// What an upstream said last time about one item, and what that answer meant.
struct Validated {
    etag: Option<String>,
    last_modified: Option<String>,
    observation: Observation,
}

/// An answer's body, or word that the last one still stands.
pub(crate) enum Body {
    Fresh(Vec<u8>, HeaderMap),
    NotModified,
}

pub(crate) struct Source {
    pub(crate) spec: SourceSpec,
    client: reqwest::Client,
    /// Requests in flight at the item URL's host, and at the batch URL's (the same limit when
    /// both name one host). Resolved once here, not per request.
    pub(crate) item_limit: Arc<Semaphore>,
    pub(crate) batch_limit: Option<Arc<Semaphore>>,
    /// The item URL's host (`server.address` of a fetch span).
    pub(crate) host: String,
    validators: Mutex<HashMap<String, Validated>>,
}

/// `host:port` of a URL template, checking its placeholder and scheme.
pub(crate) fn host_of(
    spec: &SourceSpec,
    template: &str,
    placeholder: &'static str,
) -> Result<String, SourceConfigError> {
    let url_error =
        |why: String| SourceConfigError::Url(spec.name.clone(), template.to_owned(), why);
    if !template.contains(placeholder) {
        return Err(SourceConfigError::Placeholder(
            spec.name.clone(),
            template.to_owned(),
            placeholder,
        ));
    }
    let url = reqwest::Url::parse(&template.replace(placeholder, "x"))
        .map_err(|e| url_error(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(url_error("scheme must be http or https".into()));
    }
    let host = url.host_str().ok_or_else(|| url_error("no host".into()))?;
    Ok(format!(
        "{host}:{}",
        url.port_or_known_default().unwrap_or(0)
    ))
}

/// A 304 to a request that named no version: nothing to reuse, so the answer is unreadable.
pub(crate) fn unasked_304(what: String) -> SourceError {
    SourceError::new(
        SourceErrorKind::BadData,
        format!("{what}: 304 to a request that named no version"),
    )
}

/// A product page read on a blocking thread: a page of up to its source's `max_body` takes
/// milliseconds of CPU (its budget is `page::TIME_BUDGET`), which must not stall the runtime
/// that serves other fetches, the api's requests and the probes.
async fn read_page(body: Vec<u8>, selector: Option<schema_org::OfferSelector>) -> Fetched {
    tokio::task::spawn_blocking(move || schema_org::read(&body, selector.as_ref()))
        .await
        .unwrap_or_else(|e| {
            Err(SourceError::new(
                SourceErrorKind::BadData,
                format!("the page reader stopped: {e}"),
            ))
        })
}

/// A GET of a source: `url` within `limit` (its host's), its body read up to `cap` bytes; with
/// the validators (ETag, Last-Modified) of the answer last read, a 304 is [`Body::NotModified`].
pub(crate) struct Get<'a> {
    pub url: &'a str,
    pub limit: &'a Semaphore,
    pub cap: usize,
    pub validators: Option<(Option<String>, Option<String>)>,
}

impl Source {
    pub(crate) fn new(spec: SourceSpec) -> Result<Self, SourceConfigError> {
        let permits = spec.max_concurrency_per_host.max(1);
        let item_host = host_of(&spec, &spec.item_url, "{item}")?;
        let item_limit = Arc::new(Semaphore::new(permits));
        let batch_limit = match &spec.format {
            Format::Tidings {
                batch_url: Some(batch),
            } if host_of(&spec, batch, "{items}")? == item_host => Some(item_limit.clone()),
            Format::Tidings { batch_url: Some(_) } => Some(Arc::new(Semaphore::new(permits))),
            _ => None,
        };
        let client = reqwest::Client::builder()
            .timeout(spec.timeout)
            .connect_timeout(spec.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(permits)
            .build()?;
        let host = item_host
            .rsplit_once(':')
            .map_or(item_host.as_str(), |(h, _)| h)
            .to_owned();
        Ok(Source {
            spec,
            client,
            item_limit,
            batch_limit,
            host,
            validators: Mutex::new(HashMap::new()),
        })
    }

    fn count(&self, result: &'static str) {
        source_requests()
            .get_or_create(&SourceRequestLabels {
                source: self.spec.name.clone(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// Makes `get`, counting how it ended.
    pub(crate) async fn get(&self, get: Get<'_>) -> Result<Body, SourceError> {
        let answer = self.exchange(get).await;
        self.count(match &answer {
            Ok(Body::Fresh(..)) => "fetched",
            Ok(Body::NotModified) => "not_modified",
            Err(_) => "failed",
        });
        answer
    }

    async fn exchange(&self, get: Get<'_>) -> Result<Body, SourceError> {
        let Get {
            url,
            limit,
            cap,
            validators,
        } = get;
        let fail = |kind, detail: String| {
            SourceError::new(kind, format!("GET {}: {detail}", crate::shown_url(url)))
        };
        let _permit = limit
            .acquire()
            .await
            .map_err(|_| fail(SourceErrorKind::Unavailable, "source limiter closed".into()))?;
        let mut request = self.client.get(url);
        if let Some((etag, last_modified)) = validators {
            if let Some(etag) = etag {
                request = request.header(IF_NONE_MATCH, etag);
            }
            if let Some(date) = last_modified {
                request = request.header(IF_MODIFIED_SINCE, date);
            }
        }
        let mut resp = request
            .send()
            .await
            .map_err(|e| fail(SourceErrorKind::Unavailable, crate::transport(e)))?;
        let status = resp.status();
        if status == StatusCode::NOT_MODIFIED {
            return Ok(Body::NotModified);
        }
        if !status.is_success() {
            let kind = match status.as_u16() {
                404 => SourceErrorKind::NotFound,
                429 => SourceErrorKind::RateLimited,
                s if s >= 500 => SourceErrorKind::Unavailable,
                _ => SourceErrorKind::BadData,
            };
            return Err(fail(kind, format!("HTTP {status}")));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| {
            fail(
                SourceErrorKind::Unavailable,
                format!("reading body: {}", crate::transport(e)),
            )
        })? {
            if body.len() + chunk.len() > cap {
                return Err(fail(
                    SourceErrorKind::BadData,
                    format!("body larger than {cap} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Body::Fresh(body, resp.headers().clone()))
    }

    /// One item (`code` without this source's prefix), asked conditionally when its last answer
    /// carried validators: a 304 is that answer again, observed now. What is remembered is kept
    /// by code, not URL: on a product page, each offer selector reads its own answer.
    pub(crate) async fn fetch(&self, code: &str) -> Fetched {
        let (page, selector) = match &self.spec.format {
            Format::SchemaOrg => schema_org::split(code).map_err(|e| {
                SourceError::new(SourceErrorKind::BadData, format!("item code {code:?}: {e}"))
            })?,
            _ => (code, None),
        };
        let url = self.spec.item_url.replace("{item}", page);
        let known = self.remembered(code);
        let get = Get {
            url: &url,
            limit: &self.item_limit,
            cap: self.spec.max_body,
            validators: known,
        };
        match self.get(get).await? {
            Body::NotModified => self.reuse(code, &url),
            Body::Fresh(body, headers) => {
                let answer = match &self.spec.format {
                    Format::Tidings { .. } => tidings::read_item(&body),
                    Format::Json(mapping) => mapping.read(&body),
                    Format::SchemaOrg => read_page(body, selector).await,
                };
                self.remember(code, &headers, &answer);
                answer.map_err(|e| e.at(&url))
            }
        }
    }

    fn remembered(&self, code: &str) -> Option<(Option<String>, Option<String>)> {
        let kept = self.validators.lock().ok()?;
        kept.get(code)
            .map(|v| (v.etag.clone(), v.last_modified.clone()))
    }

    fn reuse(&self, code: &str, url: &str) -> Fetched {
        let kept = self.validators.lock().ok();
        match kept.as_ref().and_then(|k| k.get(code)) {
            Some(v) => Ok(Observation {
                observed_at: Utc::now(),
                ..v.observation.clone()
            }),
            // Asked without validators, or forgotten since: nothing to reuse.
            None => Err(unasked_304(format!("GET {}", crate::shown_url(url)))),
        }
    }

    fn remember(&self, code: &str, headers: &HeaderMap, answer: &Fetched) {
        let header = |name| {
            headers
                .get(name)
                .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
                .map(str::to_owned)
        };
        let (etag, last_modified) = (header(ETAG), header(LAST_MODIFIED));
        let Ok(mut kept) = self.validators.lock() else {
            return;
        };
        match answer {
            Ok(observation) if etag.is_some() || last_modified.is_some() => {
                if kept.len() >= VALIDATORS_KEPT && !kept.contains_key(code) {
                    kept.clear();
                }
                kept.insert(
                    code.to_owned(),
                    Validated {
                        etag,
                        last_modified,
                        observation: observation.clone(),
                    },
                );
            }
            _ => {
                kept.remove(code);
            }
        }
    }

    /// Many items of this source (codes without its prefix): through its batch URL in chunks
    /// when it has one, else one request each.
    pub(crate) async fn fetch_many(
        &self,
        codes: &[(ItemCode, String)],
    ) -> Vec<(ItemCode, Fetched)> {
        if let Format::Tidings {
            batch_url: Some(template),
        } = &self.spec.format
        {
            let chunks = codes.chunks(self.spec.batch_size.max(1));
            return futures::future::join_all(
                chunks.map(|chunk| tidings::fetch_batch(self, template, chunk)),
            )
            .await
            .into_iter()
            .flatten()
            .collect();
        }
        let answers =
            futures::future::join_all(codes.iter().map(|(_, code)| self.fetch(code))).await;
        codes
            .iter()
            .map(|(item, _)| item.clone())
            .zip(answers)
            .collect()
    }
}
