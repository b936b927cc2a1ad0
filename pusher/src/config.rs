//! Pusher configuration: every setting a flag and an environment variable; secrets from the
//! environment or a file, never logged.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tidings_bus::NatsArgs;
use tidings_bus::streams::StreamSettings;
use tidings_domain::duration::parse_duration;
use tidings_domain::subjects::{InvalidPrefix, Subjects};
use tidings_endpoint_guard::EndpointArgs;
use tidings_endpoint_guard::EndpointPolicy;
use tidings_endpoint_guard::WebhookArgs;
use tidings_runtime::flags;
use tidings_runtime::ops::OpsArgs;
use tidings_webpush::vapid::{VapidError, VapidKey, VapidSigner};

#[derive(clap::Parser, Clone, Debug)]
#[command(name = "tidings-pusher", version, about, after_help = KEYGEN_HELP)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub ops: OpsArgs,
    /// VAPID private key: base64url P-256 scalar or PEM.
    #[arg(long, env = "TIDINGS_VAPID_PRIVATE_KEY", hide_env_values = true)]
    pub vapid_private_key: Option<String>,
    /// File holding the VAPID private key (instead of TIDINGS_VAPID_PRIVATE_KEY).
    #[arg(long, env = "TIDINGS_VAPID_PRIVATE_KEY_FILE")]
    pub vapid_private_key_file: Option<PathBuf>,
    /// Contact for push services: mailto: or https: URL.
    #[arg(long, env = "TIDINGS_VAPID_SUBJECT")]
    pub vapid_subject: String,
    /// Push requests in flight at once.
    #[arg(long, env = "TIDINGS_PUSH_CONCURRENCY", default_value_t = 256)]
    pub concurrency: usize,
    /// Total timeout of a push request (keep the dispatcher's TIDINGS_PUSH_HTTP_TIMEOUT equal).
    #[arg(long, env = "TIDINGS_PUSH_HTTP_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub http_timeout: Duration,
    #[arg(long, env = "TIDINGS_PUSH_CONNECT_TIMEOUT", default_value = "3s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// Ask the delivery log before every push, first attempts too. Off, only redelivered
    /// requests and later attempts are looked up; on while recovering from a Postgres restore,
    /// when restored rows repeat attempt numbers that were delivered (docs/operations.md).
    #[arg(
        long,
        env = "TIDINGS_PUSH_CHECK_EVERY_ATTEMPT",
        default_value_t = false
    )]
    pub check_every_attempt: bool,
    #[command(flatten)]
    pub endpoints: EndpointArgs,
    #[command(flatten)]
    pub webhooks: WebhookArgs,
    /// Webhooks in flight at once to one receiver (the address its host resolves to, and the
    /// port, so not one per subdomain): a slow or failing receiver holds only its own
    /// slots, never the others'.
    #[arg(
        long,
        env = "TIDINGS_WEBHOOK_CONCURRENCY_PER_HOST",
        default_value_t = 8
    )]
    pub webhook_concurrency_per_host: usize,
    #[command(flatten)]
    pub relay: tidings_email::settings::RelayArgs,
    /// Mails in flight at once to one destination domain (the recipient's, behind the relay).
    #[arg(
        long,
        env = "TIDINGS_EMAIL_CONCURRENCY_PER_DOMAIN",
        default_value_t = 4
    )]
    pub email_concurrency_per_domain: usize,
    /// Extra PEM root certificate to trust (a local fake push service).
    #[arg(long, env = "TIDINGS_PUSH_EXTRA_CA_FILE")]
    pub extra_ca_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "set TIDINGS_VAPID_PRIVATE_KEY or TIDINGS_VAPID_PRIVATE_KEY_FILE (generate one with `tidings-pusher vapid-keygen`)"
    )]
    NoVapidKey,
    #[error("reading {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("VAPID: {0}")]
    Vapid(#[from] VapidError),
    #[error("TIDINGS_PUSH_EXTRA_CA_FILE: {0}")]
    Ca(#[source] reqwest::Error),
    #[error("TIDINGS_PUSH_CONCURRENCY must be at least 1")]
    Concurrency,
    #[error(transparent)]
    Prefix(#[from] InvalidPrefix),
    #[error("email")]
    Email(#[from] tidings_email::settings::SettingsError),
}

/// Validated settings; tests build these directly.
#[derive(Clone)]
pub struct Settings {
    pub subjects: Subjects,
    pub streams: StreamSettings,
    pub vapid: Arc<VapidSigner>,
    pub concurrency: usize,
    pub http_timeout: Duration,
    pub connect_timeout: Duration,
    /// Look up every request in the delivery log (see [`Config::check_every_attempt`]).
    pub check_every_attempt: bool,
    pub policy: EndpointPolicy,
    /// Where webhooks may go.
    pub webhook_policy: EndpointPolicy,
    pub webhook_concurrency_per_host: usize,
    /// PEM root certificates to trust in addition to the system's.
    pub extra_roots: Vec<Vec<u8>>,
    /// The relay mails are submitted to; `None`: email is off here.
    pub relay: Option<Arc<tidings_email::relay::Relay>>,
    pub email_concurrency_per_domain: usize,
}

impl Settings {
    /// Every setting at its flag's default but where things are and the key: for tests and
    /// benchmarks.
    pub fn new(subjects: Subjects, vapid: VapidSigner) -> Self {
        let placeholders = ["--vapid-subject", "-"];
        flags::parsed_defaults::<Config>(&placeholders).settings_with(subjects, vapid, Vec::new())
    }

    /// JetStream redelivers a request not acked within this: a delivery (its HTTP request plus
    /// publishing the result) must fit comfortably.
    pub fn ack_wait(&self) -> Duration {
        self.http_timeout + self.connect_timeout + Duration::from_secs(10)
    }
}

fn read(path: &PathBuf) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::File {
        path: path.display().to_string(),
        source,
    })
}

impl Config {
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let key_text = match (&self.vapid_private_key, &self.vapid_private_key_file) {
            (Some(k), _) => k.clone(),
            (None, Some(path)) => read(path)?,
            (None, None) => return Err(ConfigError::NoVapidKey),
        };
        let signer = VapidSigner::new(VapidKey::parse(&key_text)?, &self.vapid_subject)?;
        if self.concurrency == 0 {
            return Err(ConfigError::Concurrency);
        }
        let mut extra_roots = Vec::new();
        if let Some(path) = &self.extra_ca_file {
            let pem = read(path)?.into_bytes();
            reqwest::Certificate::from_pem(&pem).map_err(ConfigError::Ca)?;
            extra_roots.push(pem);
        }
        let mut settings = self.settings_with(self.nats.subjects()?, signer, extra_roots);
        settings.relay = self.relay.relay()?.map(Arc::new);
        Ok(settings)
    }

    fn settings_with(
        &self,
        subjects: Subjects,
        vapid: VapidSigner,
        extra_roots: Vec<Vec<u8>>,
    ) -> Settings {
        Settings {
            subjects,
            streams: self.nats.streams(),
            vapid: Arc::new(vapid),
            concurrency: self.concurrency,
            http_timeout: self.http_timeout,
            connect_timeout: self.connect_timeout,
            check_every_attempt: self.check_every_attempt,
            policy: self.endpoints.policy(),
            webhook_policy: self.webhooks.policy(),
            webhook_concurrency_per_host: self.webhook_concurrency_per_host.max(1),
            extra_roots,
            relay: None,
            email_concurrency_per_domain: self.email_concurrency_per_domain.max(1),
        }
    }
}

/// `--help`'s word on the key generator.
pub const KEYGEN_HELP: &str = "`tidings-pusher vapid-keygen` prints a new VAPID key pair: the \
    private key for TIDINGS_VAPID_PRIVATE_KEY and the public key browsers pass to \
    pushManager.subscribe as applicationServerKey.";

/// A new VAPID key pair, as the lines `tidings-pusher vapid-keygen` prints.
pub fn vapid_keygen() -> Result<String, VapidError> {
    let (private, public) = VapidKey::generate()?;
    Ok(format!(
        "TIDINGS_VAPID_PRIVATE_KEY={private}\nTIDINGS_VAPID_PUBLIC_KEY={public}\n"
    ))
}
