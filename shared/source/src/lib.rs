//! The sources: "what is item X now?" (docs/sources.md). Used by the detector to scan, by the
//! dispatcher to re-fetch right before sending, and by the api for show-time checks.
//!
//! A deployment has one or more named sources ([`config`]), each chosen by an item-code prefix
//! and each speaking a format: `tidings` (Tidings' own protocol, [`tidings`]), `json` (any
//! JSON API read by JSON Pointer paths, [`json`]) or `schema.org` (a product page's JSON-LD or
//! microdata, [`schema_org`]). Every source answers an item with an
//! observation or a [`SourceError`]: 404 is `not_found`; 429 is `rate_limited`; 5xx, a timeout
//! or a connection error is `unavailable`; anything else, or a body we cannot read, is
//! `bad_data`.
//!
//! Every host gets a concurrency limit, requests have connect and total timeouts, response
//! bodies are read up to a cap, and item requests are conditional (ETag / Last-Modified), so a
//! slow or hostile upstream cannot stall a scan or exhaust memory, and an unchanged item costs
//! a 304.

mod client;
pub mod config;
pub mod json;
mod page;
pub mod schema_org;
mod tidings;

use client::Source;
pub use config::{Format, HintSpec, SourceArgs, SourceConfig, SourceConfigError, SourceSpec};
pub use schema_org::OfferSelector;
use std::collections::HashMap;
use tidings_domain::item::{InvalidItemCode, ItemCode};
use tidings_domain::trigger::{Observation, SourceErrorKind};
use tidings_runtime::metrics::{Counter, Family, KindLabels, SourceRequestLabels};

tidings_runtime::families! {
    /// What sources answer (exported by the services that read the catalog: the detector, the
    /// dispatcher, and the api for show-time checks).
    pub struct SourceMetrics {
        source_errors: Family<KindLabels, Counter> = Family::default()
            => "tidings_source_errors", "Source (catalog) errors by kind";
        source_requests: Family<SourceRequestLabels, Counter> = Family::default()
            => "tidings_source_requests", "Source requests by source and result (fetched, not_modified, failed)";
        pages_too_complex: Family<KindLabels, Counter> = Family::default()
            => "tidings_source_pages_too_complex", "Product pages refused as bad_data past their budget, by what ran out (time, tags, text, items, json, offers)";
    }
}

/// Counts a page refused past its budget, by what ran out.
fn pages_too_complex(what: &str) {
    metrics()
        .pages_too_complex
        .get_or_create(&KindLabels {
            kind: what.to_owned(),
        })
        .inc();
}

fn source_errors() -> &'static Family<KindLabels, Counter> {
    &metrics().source_errors
}

fn source_requests() -> &'static Family<SourceRequestLabels, Counter> {
    &metrics().source_requests
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
            .get_or_create(&KindLabels {
                kind: kind.as_str().to_owned(),
            })
            .inc();
        SourceError {
            kind,
            detail: detail.into(),
        }
    }

    /// The same error, saying which request it answered.
    fn at(mut self, url: &str) -> Self {
        self.detail = format!("GET {}: {}", shown_url(url), self.detail);
        self
    }
}

/// A source URL as errors show it (they reach logs and rows' `last_error`): without its query
/// or user info, where an API's key is often written (`?key=…`); the path names the item.
pub(crate) fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            let hidden = parsed.query().is_some();
            parsed.set_query(None);
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            match hidden {
                true => format!("{parsed}?…"),
                false => parsed.to_string(),
            }
        }
        Err(_) => "(a URL that does not parse)".to_owned(),
    }
}

/// A transport error without the URL reqwest puts in it, with its causes.
pub(crate) fn transport(e: reqwest::Error) -> String {
    tidings_runtime::telemetry::with_causes(&e.without_url())
}

pub type Fetched = Result<Observation, SourceError>;

/// Why a watch's item could not be read by any source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unwatchable {
    #[error(transparent)]
    Code(#[from] InvalidItemCode),
    #[error("no source answers for item code {0}: its prefix names none")]
    NoSource(ItemCode),
    #[error("no source is named {0:?}")]
    UnknownSource(String),
    #[error(
        "item code {item} is read by source {routed:?}, not {named:?}: a longer prefix claims it"
    )]
    Claimed {
        item: ItemCode,
        named: String,
        routed: String,
    },
    #[error("an offer is named on a schema.org source only; source {0:?} is {1}")]
    OfferOutsidePages(String, &'static str),
    #[error(transparent)]
    Selector(#[from] schema_org::SelectorError),
}

/// Every source of a deployment, each item routed to the one whose prefix it has (the longest).
pub struct Sources {
    /// Longest prefix first.
    sources: Vec<Source>,
}

impl Sources {
    pub fn new(config: SourceConfig) -> Result<Self, SourceConfigError> {
        config::validate(&config)?;
        tidings_runtime::metrics::at_zero(
            source_errors(),
            tidings_runtime::metrics::kinds(SourceErrorKind::ALL.map(SourceErrorKind::as_str)),
        );
        tidings_runtime::metrics::at_zero(
            &metrics().pages_too_complex,
            tidings_runtime::metrics::kinds(["time", "tags", "text", "items", "json", "offers"]),
        );
        let mut sources = config
            .sources
            .into_iter()
            .map(Source::new)
            .collect::<Result<Vec<_>, _>>()?;
        sources.sort_by_key(|s| std::cmp::Reverse(s.spec.prefix.len()));
        Ok(Sources { sources })
    }

    /// The index of the source that answers for `item`, and the code it is asked for (without
    /// its prefix).
    fn route_index<'a>(&self, item: &'a ItemCode) -> Option<(usize, &'a str)> {
        self.sources.iter().enumerate().find_map(|(i, s)| {
            let code = item.as_str().strip_prefix(s.spec.prefix.as_str())?;
            // What is left must itself be a code: never empty, never a `..` path segment.
            ItemCode::parse(code).ok().map(|_| (i, code))
        })
    }

    fn route<'a>(&self, item: &'a ItemCode) -> Option<(&Source, &'a str)> {
        self.route_index(item)
            .map(|(i, code)| (&self.sources[i], code))
    }

    /// The name of the source that answers for `item`, if any does.
    pub fn source_of(&self, item: &ItemCode) -> Option<&str> {
        self.route(item).map(|(s, _)| s.spec.name.as_str())
    }

    /// The item a watch means: `code` as written, or under the source named (its prefix put in
    /// front), with the offer named (`::sku:…`, schema.org sources only); refused when no source
    /// would read it as meant.
    pub fn watched_item(
        &self,
        code: &str,
        source: Option<&str>,
        offer: Option<&OfferSelector>,
    ) -> Result<ItemCode, Unwatchable> {
        let mut full = match source {
            Some(name) => {
                let named = self.sources.iter().find(|s| s.spec.name == name);
                let named = named.ok_or_else(|| Unwatchable::UnknownSource(name.to_owned()))?;
                format!("{}{code}", named.spec.prefix)
            }
            None => code.to_owned(),
        };
        if let Some(offer) = offer {
            full = format!("{full}{}{}", schema_org::SELECTOR_MARK, offer.code());
        }
        let item = ItemCode::parse(&full)?;
        let (routed, code) = self
            .route(&item)
            .ok_or_else(|| Unwatchable::NoSource(item.clone()))?;
        if let Some(named) = source.filter(|n| *n != routed.spec.name) {
            return Err(Unwatchable::Claimed {
                named: named.to_owned(),
                routed: routed.spec.name.clone(),
                item,
            });
        }
        match &routed.spec.format {
            Format::SchemaOrg => {
                schema_org::split(code)?;
            }
            other if offer.is_some() => {
                return Err(Unwatchable::OfferOutsidePages(
                    routed.spec.name.clone(),
                    other.name(),
                ));
            }
            _ => {}
        }
        Ok(item)
    }

    /// The host of the source that answers for `item` (`server.address` of a fetch span).
    pub fn host(&self, item: &ItemCode) -> &str {
        self.route(item).map_or("", |(s, _)| s.host.as_str())
    }

    fn unrouted(item: &ItemCode) -> SourceError {
        SourceError::new(
            SourceErrorKind::NotFound,
            format!("no source answers for item code {item}"),
        )
    }

    /// One item.
    pub async fn fetch(&self, item: &ItemCode) -> Fetched {
        match self.route(item) {
            Some((source, code)) => source.fetch(code).await,
            None => Err(Self::unrouted(item)),
        }
    }

    /// Many items, each source asked at once (through its batch endpoint when it has one); each
    /// item is asked once whatever its multiplicity in `items`.
    pub async fn fetch_many(&self, items: &[ItemCode]) -> HashMap<ItemCode, Fetched> {
        let mut unique: Vec<&ItemCode> = items.iter().collect();
        unique.sort();
        unique.dedup();
        let mut per_source: Vec<Vec<(ItemCode, String)>> = vec![Vec::new(); self.sources.len()];
        let mut answers = HashMap::with_capacity(unique.len());
        for item in unique {
            match self.route_index(item) {
                Some((i, code)) => per_source[i].push((item.clone(), code.to_owned())),
                None => {
                    answers.insert(item.clone(), Err(Self::unrouted(item)));
                }
            }
        }
        let asked = self
            .sources
            .iter()
            .zip(&per_source)
            .filter(|(_, codes)| !codes.is_empty())
            .map(|(source, codes)| source.fetch_many(codes));
        answers.extend(futures::future::join_all(asked).await.into_iter().flatten());
        answers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(code: &str) -> ItemCode {
        ItemCode::parse(code).unwrap()
    }

    #[test]
    fn templates_need_their_placeholder_and_an_http_url() {
        assert!(Sources::new(SourceConfig::new("http://catalog/items")).is_err());
        assert!(Sources::new(SourceConfig::new("ftp://catalog/{item}")).is_err());
        let mut c = SourceConfig::new("http://catalog/items/{item}");
        c.sources[0].format = Format::Tidings {
            batch_url: Some("http://catalog/items".into()),
        };
        assert!(Sources::new(c).is_err());
        assert!(Sources::new(SourceConfig::new("http://catalog:8080/items/{item}")).is_ok());
        assert!(matches!(
            Sources::new(SourceConfig { sources: vec![] }),
            Err(SourceConfigError::None)
        ));
    }

    #[test]
    fn an_item_goes_to_the_source_with_its_longest_prefix_and_is_asked_without_it() {
        let config = SourceConfig::new("http://default/{item}")
            .with_source("acme", "acme:")
            .with_source("acme-eu", "acme:eu:");
        let sources = Sources::new(config).unwrap();
        let routed = |code: &str| {
            let code = item(code);
            sources
                .route(&code)
                .map(|(s, c)| (s.spec.name.clone(), c.to_owned()))
        };
        assert_eq!(routed("acme:eu:42"), Some(("acme-eu".into(), "42".into())));
        assert_eq!(routed("acme:42"), Some(("acme".into(), "42".into())));
        assert_eq!(routed("SKU-1"), Some(("default".into(), "SKU-1".into())));
        // What is left after a prefix must be a code of its own: not `..`, not empty.
        assert_eq!(
            routed("acme:.."),
            Some(("default".into(), "acme:..".into()))
        );
        assert_eq!(sources.host(&item("acme:1")), "acme");
    }

    #[test]
    fn without_a_catch_all_an_unclaimed_code_has_no_source() {
        let mut config = SourceConfig::new("http://acme/{item}");
        config.sources[0].prefix = "acme:".into();
        let sources = Sources::new(config).unwrap();
        assert_eq!(sources.source_of(&item("acme:1")), Some("default"));
        assert_eq!(sources.source_of(&item("other:1")), None);
        assert_eq!(sources.source_of(&item("acme:")), None);
    }

    #[test]
    fn a_watch_names_its_source_and_offer_or_writes_them_in_its_code() {
        let mut config = SourceConfig::new("http://default/{item}");
        let mut pages = config.sources[0].clone();
        pages.name = "pages".into();
        pages.prefix = "page:".into();
        pages.format = Format::SchemaOrg;
        config.sources.push(pages);
        let sources = Sources::new(config).unwrap();
        let sku = OfferSelector::Sku("TEE-M".into());
        let watched = |code, source, offer| sources.watched_item(code, source, offer);
        assert_eq!(
            watched("tee", Some("pages"), Some(&sku)),
            Ok(item("page:tee::sku:TEE-M"))
        );
        assert_eq!(
            watched("page:tee::sku:TEE-M", None, None),
            Ok(item("page:tee::sku:TEE-M"))
        );
        assert_eq!(watched("SKU-1", Some("default"), None), Ok(item("SKU-1")));
        assert_eq!(
            watched("tee", Some("shop"), None),
            Err(Unwatchable::UnknownSource("shop".into()))
        );
        assert!(matches!(
            watched("page:tee", Some("default"), None),
            Err(Unwatchable::Claimed { .. })
        ));
        assert_eq!(
            watched("SKU-1", None, Some(&sku)),
            Err(Unwatchable::OfferOutsidePages("default".into(), "tidings"))
        );
        assert!(matches!(
            watched("page:tee::colour:red", None, None),
            Err(Unwatchable::Selector(_))
        ));
        assert!(matches!(
            watched("tee/x", Some("pages"), None),
            Err(Unwatchable::Code(_))
        ));
        // Regression: `..` as the page reached the parent path on the shop's host.
        assert!(matches!(
            watched("..", Some("pages"), Some(&sku)),
            Err(Unwatchable::Selector(schema_org::SelectorError::Page(_)))
        ));
    }

    /// Regression: a source's error carried its whole URL, so an API key in a template's query
    /// (`?key=…`) reached logs and rows' last_error.
    #[test]
    fn errors_show_a_source_url_without_its_query_or_user_info() {
        assert_eq!(
            shown_url("https://u:pw@api.shop.example/items/42?key=s3cret&x=1"),
            "https://api.shop.example/items/42?…"
        );
        assert_eq!(
            shown_url("http://catalog:8080/items/42"),
            "http://catalog:8080/items/42"
        );
        let e = SourceError::new(SourceErrorKind::NotFound, "HTTP 404")
            .at("https://api.shop.example/items/42?key=s3cret");
        assert!(!e.detail.contains("s3cret"), "{}", e.detail);
    }

    #[test]
    fn names_and_prefixes_are_one_per_source() {
        let mut config = SourceConfig::new("http://a/{item}");
        config.sources.push(config.sources[0].clone());
        assert!(matches!(
            Sources::new(config.clone()),
            Err(SourceConfigError::Clash(_, _, "name"))
        ));
        config.sources[1].name = "b".into();
        assert!(matches!(
            Sources::new(config.clone()),
            Err(SourceConfigError::Clash(_, _, "prefix"))
        ));
        config.sources[1].name = "B c".into();
        assert!(matches!(
            Sources::new(config),
            Err(SourceConfigError::Invalid(..))
        ));
    }
}
