//! The operator api over HTTP, and what can go wrong, each with the exit code scripts rely on.

use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;
use tidings_api_types::dead_letters::DeadLetterList;
use tidings_api_types::outbox::OutboxList;
use tidings_api_types::problem::Problem;

/// Exit codes (also in `tidings --help`).
pub mod exit {
    /// Everything asked was done; `doctor` found nothing wrong.
    pub const OK: u8 = 0;
    /// `doctor` found something wrong.
    pub const FAULT: u8 = 1;
    /// The command line was wrong (clap uses 2 as well).
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    /// The resource's state refused it (not replayable, not cancellable, …).
    pub const CONFLICT: u8 = 4;
    /// No token, or a wrong one.
    pub const UNAUTHORIZED: u8 = 5;
    /// The api or what it needs (Postgres, NATS) could not be reached or failed.
    pub const UNAVAILABLE: u8 = 6;
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot reach the operator api at {url}: {detail} (set --api or TIDINGS_OPS_URL)")]
    Unreachable { url: String, detail: String },
    #[error("{method} {path}: HTTP {status}: {detail}")]
    Api {
        method: &'static str,
        path: String,
        status: u16,
        detail: String,
    },
    /// The api answered with something this CLI cannot read (another version of Tidings?).
    #[error("{path}: the answer is not what this version of tidings expects")]
    Answer {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("reading the operator token from {path}: {detail}")]
    TokenFile { path: String, detail: String },
    #[error("{0}")]
    Local(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::TokenFile { .. } => exit::USAGE,
            CliError::Unreachable { .. } | CliError::Local(_) | CliError::Answer { .. } => {
                exit::UNAVAILABLE
            }
            CliError::Api { status, .. } => match status {
                400 | 422 => exit::USAGE,
                401 | 403 => exit::UNAUTHORIZED,
                404 => exit::NOT_FOUND,
                409 => exit::CONFLICT,
                _ => exit::UNAVAILABLE,
            },
        }
    }
}

/// The operator api at `base` with its bearer token.
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    pub fn new(base: &str, token: String) -> Result<Self, CliError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| CliError::Local(format!("building the HTTP client: {e}")))?;
        Ok(Api {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
        })
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T, CliError> {
        let text = self.exchange(method, path, query, body).await?;
        serde_json::from_str(&text).map_err(|source| CliError::Answer {
            path: path.to_owned(),
            source,
        })
    }

    /// The body of a 2xx answer; any other is an error that carries the problem's detail.
    async fn exchange(
        &self,
        method: &'static str,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<String, CliError> {
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.base))
            .map_err(|e| CliError::Usage(format!("--api {}: {e}", self.base)))?;
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let mut req = match method {
            "POST" => self.http.post(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.get(url),
        }
        .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let unreachable = |e: reqwest::Error| CliError::Unreachable {
            url: self.base.clone(),
            detail: e.to_string(),
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(unreachable)?;
        if !(200..300).contains(&status) {
            // A problem document (RFC 9457) says what was wrong.
            let detail = match serde_json::from_str::<Problem>(&text) {
                Ok(p) if !p.detail.is_empty() => p.detail,
                Ok(p) => p.title,
                Err(_) => text,
            };
            return Err(CliError::Api {
                method,
                path: path.to_owned(),
                status,
                detail,
            });
        }
        Ok(text)
    }

    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, CliError> {
        self.send("GET", path, query, None).await
    }

    /// Up to `limit` items of a listing at `path`, following its `next_cursor` page by page
    /// (at most 200 a page).
    pub async fn list<P: Page>(
        &self,
        path: &str,
        query: &[(&'static str, String)],
        limit: usize,
    ) -> Result<Vec<P::Item>, CliError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        while items.len() < limit {
            let mut q = query.to_vec();
            q.push(("limit", (limit - items.len()).min(200).to_string()));
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let (page, next) = self.get::<P>(path, &q).await?.split();
            items.extend(page);
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(items)
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, CliError> {
        self.send("POST", path, &[], Some(body)).await
    }

    /// A `DELETE`, whose answer has no body.
    pub async fn delete(&self, path: &str) -> Result<(), CliError> {
        self.exchange("DELETE", path, &[], None).await.map(drop)
    }
}

/// A page of a listing: its items, and the cursor of the next page (none on the last).
pub trait Page: DeserializeOwned {
    type Item;
    fn split(self) -> (Vec<Self::Item>, Option<String>);
}

impl Page for OutboxList {
    type Item = tidings_api_types::outbox::OutboxRow;
    fn split(self) -> (Vec<Self::Item>, Option<String>) {
        (self.items, self.next_cursor)
    }
}

impl Page for DeadLetterList {
    type Item = tidings_api_types::dead_letters::DeadLetterSummary;
    fn split(self) -> (Vec<Self::Item>, Option<String>) {
        (self.items, self.next_cursor.map(|c| c.to_string()))
    }
}

impl Page for tidings_api_types::audit::AuditList {
    type Item = tidings_api_types::audit::AuditEntry;
    fn split(self) -> (Vec<Self::Item>, Option<String>) {
        (self.items, self.next_cursor.map(|c| c.to_string()))
    }
}

impl Page for tidings_api_types::endpoints::EndpointAttemptList {
    type Item = tidings_api_types::endpoints::EndpointAttempt;
    fn split(self) -> (Vec<Self::Item>, Option<String>) {
        (self.items, self.next_cursor)
    }
}
