//! Which sources a deployment reads, and how: `TIDINGS_SOURCE_URL` (one source in the `tidings`
//! format for every item) and/or `TIDINGS_SOURCES_FILE` (named sources, each chosen by an
//! item-code prefix). docs/sources.md shows the file.

use crate::json::{JsonMapping, MappingError};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use tidings_domain::duration::parse_duration;
use tidings_domain::item::ItemCode;
use tidings_runtime::flags;

/// How a source's answers are read.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// Tidings' own protocol (`{"price", "currency", "in_stock", "paused"}`), one item or a batch.
    Tidings { batch_url: Option<String> },
    /// Any JSON document, read by JSON Pointer paths.
    Json(JsonMapping),
    /// A product page's schema.org `Product`/`Offer` nodes (JSON-LD or microdata).
    SchemaOrg,
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::Tidings { .. } => "tidings",
            Format::Json(_) => "json",
            Format::SchemaOrg => "schema.org",
        }
    }
}

/// One source: what it answers for, where and how it is asked, and its limits.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceSpec {
    /// Names the source in metrics, logs and errors.
    pub name: String,
    /// The item codes it answers for: those that start with it (the longest matching prefix
    /// wins). Its URL gets the code without the prefix. Empty: every code no other source takes.
    pub prefix: String,
    pub format: Format,
    /// URL template with `{item}`.
    pub item_url: String,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Requests in flight per upstream host.
    pub max_concurrency_per_host: usize,
    /// Items per batch request (the `tidings` format with a batch URL).
    pub batch_size: usize,
    /// The largest item answer read.
    pub max_body: usize,
    /// Change hints for this source's items: who may send them over HTTP, and how many
    /// items a second they may make the detector fetch.
    pub hints: HintSpec,
}

/// A source's change hints (docs/sources.md, "Change hints").
#[derive(Clone, Debug, PartialEq)]
pub struct HintSpec {
    /// Standard Webhooks secrets (`whsec_…`, one per line; two while rotating) that sign
    /// `POST /v1/items/changed` for this source. Unset: no hints over HTTP.
    pub secrets_file: Option<PathBuf>,
    /// Hinted items a second this source's hints may make each detector fetch; the rest wait.
    pub rate: u32,
}

/// Hinted items a second per source unless the file says otherwise.
pub const HINT_RATE: u32 = 100;

/// Every source of a deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceConfig {
    pub sources: Vec<SourceSpec>,
}

impl SourceConfig {
    /// One `tidings`-format source at `item_url` for every item, its limits at their flags'
    /// defaults.
    pub fn new(item_url: impl Into<String>) -> Self {
        let item_url = item_url.into();
        let args = flags::parsed_defaults::<SourceArgs>(&["--source-url", &item_url]);
        SourceConfig {
            sources: vec![args.default_source(item_url)],
        }
    }

    /// The same with one more source named `name` for the items with `prefix`, at
    /// `http://<name>/{item}`, its format and limits those of the first (tests and examples).
    pub fn with_source(mut self, name: &str, prefix: &str) -> Self {
        let mut spec = self.sources[0].clone();
        spec.name = name.into();
        spec.prefix = prefix.into();
        spec.item_url = format!("http://{name}/{{item}}");
        self.sources.push(spec);
        self
    }

    /// Sets every source's total timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.sources.iter_mut().for_each(|s| s.timeout = timeout);
    }

    /// The source other than `source` that would read `code` hinted by `source`: a hint's code
    /// is given its source's prefix and then routed by the longest prefix, so `acme`'s hint for
    /// `eu:42` is `acme:eu:42`, which a source with prefix `acme:eu:` claims. A source's secret
    /// speaks for its own items only, so such a code is refused (`None`: it is `source`'s own).
    pub fn claimed_from(&self, source: &str, code: &str) -> Option<&str> {
        let own = self.sources.iter().find(|s| s.name == source)?;
        let full = format!("{}{code}", own.prefix);
        self.sources
            .iter()
            .filter(|other| other.prefix.len() > own.prefix.len())
            .filter(|other| {
                full.strip_prefix(other.prefix.as_str())
                    .is_some_and(|rest| ItemCode::parse(rest).is_ok())
            })
            .max_by_key(|other| other.prefix.len())
            .map(|other| other.name.as_str())
    }

    /// The longest a source request may take.
    pub fn max_timeout(&self) -> Duration {
        self.sources
            .iter()
            .map(|s| s.timeout)
            .max()
            .unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceConfigError {
    #[error("no source: set TIDINGS_SOURCE_URL or TIDINGS_SOURCES_FILE")]
    None,
    #[error("source {0:?}: URL template {1:?} must contain {2}")]
    Placeholder(String, String, &'static str),
    #[error("source {0:?}: URL template {1:?} is not a valid http(s) URL: {2}")]
    Url(String, String, String),
    #[error("could not build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("reading TIDINGS_SOURCES_FILE {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("TIDINGS_SOURCES_FILE {0}: {1}")]
    Parse(PathBuf, #[source] serde_json::Error),
    #[error("source {0:?}: {1}")]
    Invalid(String, String),
    #[error("source {0:?}: bad duration")]
    Duration(String, #[source] tidings_domain::duration::InvalidDuration),
    #[error("source {0:?}")]
    Mapping(String, #[source] MappingError),
    #[error("sources {0:?} and {1:?} have the same {2}")]
    Clash(String, String, &'static str),
}

/// The source flags: one `tidings` source, the file of named ones, and the limits a source
/// has unless the file says otherwise.
#[derive(clap::Args, Clone, Debug)]
pub struct SourceArgs {
    /// A `tidings`-format source URL template with {item}, named `default`, for every item code
    /// no source of TIDINGS_SOURCES_FILE takes.
    #[arg(long, env = "TIDINGS_SOURCE_URL")]
    pub source_url: Option<String>,
    /// Optional batch URL template with {items} (comma-separated codes) of that source.
    #[arg(long, env = "TIDINGS_SOURCE_BATCH_URL")]
    pub source_batch_url: Option<String>,
    /// A JSON file of named sources (docs/sources.md).
    #[arg(long, env = "TIDINGS_SOURCES_FILE")]
    pub sources_file: Option<PathBuf>,
    #[arg(long, env = "TIDINGS_SOURCE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub source_timeout: Duration,
    /// Source requests in flight per upstream host.
    #[arg(long, env = "TIDINGS_SOURCE_CONCURRENCY", default_value_t = 16)]
    pub source_concurrency: usize,
    /// Items per batch request.
    #[arg(long, env = "TIDINGS_SOURCE_BATCH_SIZE", default_value_t = 100)]
    pub source_batch_size: usize,
}

/// The largest item answer read unless a source says otherwise.
pub const MAX_ITEM_BODY: usize = 64 * 1024;
/// The largest product page read unless a source says otherwise: pages carry their scripts
/// and markup along with the few hundred bytes that matter.
pub const MAX_PAGE_BODY: usize = 2 * 1024 * 1024;

impl SourceArgs {
    fn default_source(&self, item_url: String) -> SourceSpec {
        SourceSpec {
            name: "default".into(),
            prefix: String::new(),
            format: Format::Tidings {
                batch_url: self.source_batch_url.clone(),
            },
            item_url,
            timeout: self.source_timeout,
            connect_timeout: Duration::from_secs(2),
            max_concurrency_per_host: self.source_concurrency,
            batch_size: self.source_batch_size,
            max_body: MAX_ITEM_BODY,
            hints: HintSpec {
                secrets_file: None,
                rate: HINT_RATE,
            },
        }
    }

    /// The deployment's sources: the file's, then the `default` one; at least one.
    pub fn config(&self) -> Result<SourceConfig, SourceConfigError> {
        let mut sources = match &self.sources_file {
            Some(path) => {
                let text =
                    std::fs::read(path).map_err(|e| SourceConfigError::Read(path.clone(), e))?;
                let file: SourcesFile = serde_json::from_slice(&text)
                    .map_err(|e| SourceConfigError::Parse(path.clone(), e))?;
                file.sources
                    .into_iter()
                    .map(|s| s.into_spec(self))
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => Vec::new(),
        };
        if let Some(url) = &self.source_url {
            sources.push(self.default_source(url.clone()));
        }
        let config = SourceConfig { sources };
        validate(&config)?;
        Ok(config)
    }
}

/// What `Sources::new` and the file check before a source is asked anything.
pub(crate) fn validate(config: &SourceConfig) -> Result<(), SourceConfigError> {
    if config.sources.is_empty() {
        return Err(SourceConfigError::None);
    }
    for (i, a) in config.sources.iter().enumerate() {
        let valid_name = !a.name.is_empty()
            && a.name.len() <= 64
            && a.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !valid_name {
            return Err(SourceConfigError::Invalid(
                a.name.clone(),
                "a name is 1 to 64 characters from a-z, 0-9, '-', '_'".into(),
            ));
        }
        for b in &config.sources[..i] {
            if a.name == b.name {
                return Err(SourceConfigError::Clash(
                    b.name.clone(),
                    a.name.clone(),
                    "name",
                ));
            }
            if a.prefix == b.prefix {
                return Err(SourceConfigError::Clash(
                    b.name.clone(),
                    a.name.clone(),
                    "prefix",
                ));
            }
        }
        if a.timeout.is_zero() || a.max_body == 0 {
            return Err(SourceConfigError::Invalid(
                a.name.clone(),
                "timeout and max_body must be above zero".into(),
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourcesFile {
    sources: Vec<FileSource>,
}

/// One source as the file writes it; limits left out take the flags' values.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSource {
    name: String,
    #[serde(default)]
    prefix: String,
    format: FormatName,
    url: String,
    batch_url: Option<String>,
    batch_size: Option<usize>,
    timeout: Option<String>,
    concurrency: Option<usize>,
    max_body: Option<usize>,
    json: Option<JsonMapping>,
    hint_secrets_file: Option<PathBuf>,
    hint_rate: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum FormatName {
    Tidings,
    Json,
    #[serde(rename = "schema.org")]
    SchemaOrg,
}

impl FileSource {
    fn into_spec(self, args: &SourceArgs) -> Result<SourceSpec, SourceConfigError> {
        let name = self.name;
        let invalid = |why: &str| SourceConfigError::Invalid(name.clone(), why.to_owned());
        let format = match (self.format, self.json, self.batch_url) {
            (FormatName::Tidings, None, batch_url) => Format::Tidings { batch_url },
            (FormatName::Json, Some(mapping), None) => {
                mapping
                    .check()
                    .map_err(|e| SourceConfigError::Mapping(name.clone(), e))?;
                Format::Json(mapping)
            }
            (FormatName::SchemaOrg, None, None) => Format::SchemaOrg,
            (FormatName::SchemaOrg, _, _) => {
                return Err(invalid(
                    "the schema.org format takes neither \"json\" nor batch_url",
                ));
            }
            (FormatName::Json, None, _) => {
                return Err(invalid("format json needs its \"json\" mapping"));
            }
            (FormatName::Json, _, Some(_)) => {
                return Err(invalid("batch_url is for the tidings format"));
            }
            (FormatName::Tidings, Some(_), _) => {
                return Err(invalid("\"json\" is for the json format"));
            }
        };
        let timeout = match &self.timeout {
            Some(t) => {
                parse_duration(t).map_err(|e| SourceConfigError::Duration(name.clone(), e))?
            }
            None => args.source_timeout,
        };
        let max_body = self.max_body.unwrap_or(match format {
            Format::SchemaOrg => MAX_PAGE_BODY,
            _ => MAX_ITEM_BODY,
        });
        Ok(SourceSpec {
            prefix: self.prefix,
            format,
            item_url: self.url,
            timeout,
            connect_timeout: Duration::from_secs(2).min(timeout),
            max_concurrency_per_host: self.concurrency.unwrap_or(args.source_concurrency),
            batch_size: self.batch_size.unwrap_or(args.source_batch_size),
            max_body,
            hints: HintSpec {
                secrets_file: self.hint_secrets_file,
                rate: self.hint_rate.unwrap_or(HINT_RATE).max(1),
            },
            name,
        })
    }
}
