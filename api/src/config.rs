//! Api configuration: every setting a flag and an environment variable.

use crate::Settings;
use crate::limits::{Rate, parse_rate};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tidings_domain::duration::parse_duration;
use tidings_endpoint_guard::EndpointArgs;

#[derive(clap::Args, Clone, Debug)]
pub struct Config {
    #[command(flatten)]
    pub database: tidings_runtime::secrets::DatabaseArgs,
    #[arg(long, env = "TIDINGS_API_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// The operator routes (`/v1/admin/*`) and `/metrics`, apart from the public port (the
    /// workers serve their metrics on the same variable).
    #[arg(long, env = "TIDINGS_OPS_LISTEN", default_value = "0.0.0.0:9090")]
    pub ops_listen: SocketAddr,
    /// After SIGTERM, how long the api keeps serving (unready) before it closes its listeners,
    /// so load balancers stop sending it requests first.
    #[arg(long, env = "TIDINGS_API_DRAIN", default_value = "5s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Postgres connections (each replica).
    #[arg(long, env = "TIDINGS_API_DB_POOL", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub db_pool: u32,
    /// Bearer token for the operator endpoints (at least 32 characters); unset disables them.
    #[arg(long, env = "TIDINGS_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A file holding the operator token (a mounted Secret), instead of TIDINGS_ADMIN_TOKEN.
    #[arg(long, env = "TIDINGS_ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// The name the audit trail gives the holder of TIDINGS_ADMIN_TOKEN.
    #[arg(long, env = "TIDINGS_ADMIN_TOKEN_NAME", default_value = "operator")]
    pub admin_token_name: String,
    /// Named operator tokens, stored hashed: one `NAME SHA256-HEX` a line (`tidings-api
    /// operator-token NAME` prints a token and its line). Beside TIDINGS_ADMIN_TOKEN or instead.
    #[arg(long, env = "TIDINGS_ADMIN_TOKENS_FILE")]
    pub admin_tokens_file: Option<std::path::PathBuf>,
    /// Base64url VAPID public key served to browsers (`tidings-pusher vapid-keygen` prints it).
    #[arg(long, env = "TIDINGS_VAPID_PUBLIC_KEY")]
    pub vapid_public_key: Option<String>,
    /// A file holding the VAPID public key (the pusher's mounted key Secret), instead of
    /// TIDINGS_VAPID_PUBLIC_KEY.
    #[arg(
        long,
        env = "TIDINGS_VAPID_PUBLIC_KEY_FILE",
        conflicts_with = "vapid_public_key"
    )]
    pub vapid_public_key_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub endpoints: EndpointArgs,
    #[command(flatten)]
    pub webhooks: tidings_endpoint_guard::WebhookArgs,
    /// After a webhook endpoint's secret is rotated, how long the previous one keeps signing
    /// beside it, so its receiver can switch over.
    #[arg(long, env = "TIDINGS_WEBHOOK_SECRET_OVERLAP", default_value = "24h", value_parser = parse_duration)]
    pub webhook_secret_overlap: Duration,
    #[command(flatten)]
    pub webhook_keys: tidings_sealing::SecretKeyArgs,
    /// The relay confirmation mails go through (email devices: docs/email.md).
    #[command(flatten)]
    pub relay: tidings_email::settings::RelayArgs,
    #[command(flatten)]
    pub sender: tidings_email::settings::SenderArgs,
    /// Confirmation mails to one address in a day.
    #[arg(
        long,
        env = "TIDINGS_EMAIL_CONFIRMATIONS_PER_ADDRESS",
        default_value_t = 3
    )]
    pub email_confirmations_per_address: u32,
    /// Confirmation mails to one domain in an hour.
    #[arg(
        long,
        env = "TIDINGS_EMAIL_CONFIRMATIONS_PER_DOMAIN",
        default_value_t = 200
    )]
    pub email_confirmations_per_domain: u32,
    /// Secrets (one `whsec_…` a line) that sign the bounce reports a relay or mail provider
    /// posts to `/v1/email/bounces`; without them the route refuses every report.
    #[arg(long, env = "TIDINGS_EMAIL_BOUNCE_SECRETS_FILE")]
    pub email_bounce_secrets_file: Option<std::path::PathBuf>,
    /// How long a confirmation link works.
    #[arg(long, env = "TIDINGS_EMAIL_CONFIRM_WITHIN", default_value = "24h", value_parser = parse_duration)]
    pub email_confirm_within: Duration,
    #[arg(long, env = "TIDINGS_MAX_WATCHES_PER_DEVICE", default_value_t = 100)]
    pub max_watches_per_device: u32,
    /// Webhook endpoints one API client may have at once (removed ones do not count).
    #[arg(long, env = "TIDINGS_API_ENDPOINTS_PER_CLIENT", default_value_t = 100)]
    pub max_endpoints_per_client: u32,
    #[arg(long, env = "TIDINGS_MAX_TRIGGERS_PER_WATCH", default_value_t = 8)]
    pub max_triggers_per_watch: usize,
    /// Largest accepted request body, bytes.
    #[arg(long, env = "TIDINGS_API_MAX_BODY", default_value_t = 16 * 1024)]
    pub max_body_bytes: usize,
    // The limits are spelled `std::option::Option` so clap takes the parser's `None` (`off`) as a
    // value rather than treating the flag as optional.
    /// Device registrations per client address (`COUNT/UNIT`, UNIT s, m, h or d; `off`).
    #[arg(long, env = "TIDINGS_API_REGISTER_RATE", default_value = "100/h", value_parser = parse_rate)]
    pub register_rate: std::option::Option<Rate>,
    /// Watch creations per client address.
    #[arg(long, env = "TIDINGS_API_WATCH_RATE_PER_ADDRESS", default_value = "600/m", value_parser = parse_rate)]
    pub watch_rate_per_address: std::option::Option<Rate>,
    /// Watch creations per device.
    #[arg(long, env = "TIDINGS_API_WATCH_RATE_PER_DEVICE", default_value = "60/m", value_parser = parse_rate)]
    pub watch_rate_per_device: std::option::Option<Rate>,
    /// Change hints per client address (`POST /v1/items/changed`), counted before the signature
    /// is checked.
    #[arg(long, env = "TIDINGS_API_HINT_RATE_PER_ADDRESS", default_value = "600/m", value_parser = parse_rate)]
    pub hint_rate_per_address: std::option::Option<Rate>,
    /// Proxies (load balancer, ingress) in front of the api whose `X-Forwarded-For` entries are
    /// believed when limits look up the client's address; 0 uses the TCP peer.
    #[arg(long, env = "TIDINGS_API_TRUSTED_PROXIES", default_value_t = 0)]
    pub trusted_proxies: usize,
    /// How many api replicas share the rate limits behind one load balancer: each keeps 1/N of
    /// every rate, so a client spread over them gets the configured rate in all (1–1000).
    #[arg(long, env = "TIDINGS_API_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub replicas: u32,
    /// Most concurrent watch creates inserted by one statement; 1 inserts each alone.
    #[arg(long, env = "TIDINGS_API_CREATE_BATCH", default_value_t = 64)]
    pub create_batch: usize,
    /// Connect to NATS (as its own user, `NATS_USER=api`) for the operator routes that need it:
    /// dead letters and `doctor`'s stream, consumer and VAPID checks. The public routes never
    /// use NATS; without it those operator routes answer 503.
    #[arg(long, env = "TIDINGS_API_NATS", default_value_t = false)]
    pub operator_nats: bool,
    /// Origins (comma-separated, e.g. `https://shop.example`) whose pages may call the public
    /// routes from a browser; none by default. The operator port never answers CORS.
    #[arg(long, env = "TIDINGS_API_CORS_ORIGINS", default_value = "")]
    pub cors_origins: String,
    /// Serve the browser client (`tidings.js`, `sw.js`) and a demo page under `/web/`.
    #[arg(long, env = "TIDINGS_API_WEB", default_value_t = false)]
    pub web: bool,
    /// The sources (the workers' settings), which show-time checks read and new watches are
    /// checked against. None: `GET /v1/notifications/{id}/now` answers 503 and devices show
    /// "as of".
    #[command(flatten)]
    pub source: tidings_source::SourceArgs,
    /// Time budget of one show-time catalog request.
    #[arg(long, env = "TIDINGS_API_CHECK_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub check_timeout: Duration,
    /// How long an item's current value serves show-time checks: the devices a push reaches at
    /// once ask the catalog once.
    #[arg(long, env = "TIDINGS_API_CHECK_CACHE", default_value = "10s", value_parser = parse_duration)]
    pub check_cache: Duration,
    /// NATS, and the streams `doctor` expects (the workers' settings).
    #[command(flatten)]
    pub nats: tidings_bus::NatsArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Secret(#[from] tidings_runtime::secrets::SecretError),
    #[error("TIDINGS_ADMIN_TOKEN must be at least 32 characters")]
    WeakAdminToken,
    #[error(
        "TIDINGS_ADMIN_TOKEN_NAME must be 1 to 64 of A–Z, a–z, 0–9, `.`, `_`, `@`, `-`, and not a name of TIDINGS_ADMIN_TOKENS_FILE"
    )]
    AdminTokenName,
    #[error("TIDINGS_ADMIN_TOKENS_FILE {}: {source}", path.display())]
    OperatorTokensFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TIDINGS_ADMIN_TOKENS_FILE: {0}")]
    OperatorTokens(#[from] crate::auth::OperatorTokensError),
    #[error("TIDINGS_MAX_WATCHES_PER_DEVICE must be between 1 and 1000000")]
    MaxWatches,
    #[error("TIDINGS_MAX_TRIGGERS_PER_WATCH must be at least 1")]
    MaxTriggers,
    #[error("TIDINGS_API_MAX_BODY must be at least 1024 bytes")]
    MaxBody,
    #[error("TIDINGS_API_CREATE_BATCH must be between 1 and 1000")]
    CreateBatch,
    #[error("TIDINGS_API_CORS_ORIGINS: {0}")]
    CorsOrigins(#[from] crate::cors::OriginError),
    #[error("TIDINGS_PREFIX: {0}")]
    Prefix(#[from] tidings_domain::subjects::InvalidPrefix),
    #[error("TIDINGS_SOURCE_URL: {0}")]
    Source(#[from] tidings_source::SourceConfigError),
    #[error("TIDINGS_SOURCES_FILE: {0}")]
    HintSecrets(#[from] crate::hints::SecretError),
    #[error(transparent)]
    WebhookKeys(#[from] tidings_sealing::KeysError),
    #[error("email")]
    Email(#[from] tidings_email::settings::SettingsError),
    #[error("TIDINGS_SMTP_HOST and TIDINGS_EMAIL_FROM go together: set both for email, or neither")]
    EmailHalf,
}

impl Config {
    /// The operator tokens: the tokens file's, and TIDINGS_ADMIN_TOKEN under its name.
    fn operators(&self) -> Result<Vec<crate::auth::OperatorToken>, ConfigError> {
        let admin_token = tidings_runtime::secrets::value_or_file(
            "TIDINGS_ADMIN_TOKEN",
            self.admin_token.as_deref(),
            self.admin_token_file.as_deref(),
        )?;
        let mut operators = match &self.admin_tokens_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| {
                    ConfigError::OperatorTokensFile {
                        path: path.clone(),
                        source,
                    }
                })?;
                crate::auth::parse_operator_tokens(&text)?
            }
            None => Vec::new(),
        };
        match &admin_token {
            Some(t) if t.len() < 32 => return Err(ConfigError::WeakAdminToken),
            Some(_) if !crate::auth::valid_operator_name(&self.admin_token_name) => {
                return Err(ConfigError::AdminTokenName);
            }
            Some(_) if operators.iter().any(|o| o.name == self.admin_token_name) => {
                return Err(ConfigError::AdminTokenName);
            }
            Some(t) => operators.push(crate::auth::OperatorToken::named(&self.admin_token_name, t)),
            None => {}
        }
        Ok(operators)
    }

    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let operators = self.operators()?;
        let max_watches_per_device = i32::try_from(self.max_watches_per_device)
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .ok_or(ConfigError::MaxWatches)?;
        if self.max_triggers_per_watch == 0 {
            return Err(ConfigError::MaxTriggers);
        }
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::MaxBody);
        }
        if !(1..=1000).contains(&self.create_batch) {
            return Err(ConfigError::CreateBatch);
        }
        let catalog = match (&self.source.source_url, &self.source.sources_file) {
            (None, None) => None,
            _ => {
                let mut c = self.source.config()?;
                c.set_timeout(self.check_timeout);
                tidings_source::Sources::new(c.clone())?;
                Some(c)
            }
        };
        let vapid_public_key = tidings_runtime::secrets::value_or_file(
            "TIDINGS_VAPID_PUBLIC_KEY",
            self.vapid_public_key.as_deref(),
            self.vapid_public_key_file.as_deref(),
        )?;
        let mail = match (self.relay.relay()?, self.sender.sender()?) {
            (Some(relay), Some(sender)) => Some(Arc::new(crate::mailboxes::Mailer {
                relay,
                sender,
                limits: tidings_store::mailboxes::MailLimits {
                    per_address_per_day: self.email_confirmations_per_address.into(),
                    per_domain_per_hour: self.email_confirmations_per_domain.into(),
                },
                confirm_within: self.email_confirm_within,
                bounce_secrets: match &self.email_bounce_secrets_file {
                    Some(path) => {
                        crate::hints::read_secrets("TIDINGS_EMAIL_BOUNCE_SECRETS_FILE", path)?
                    }
                    None => Vec::new(),
                },
            })),
            (None, None) => None,
            _ => return Err(ConfigError::EmailHalf),
        };
        Ok(Settings {
            mail,
            policy: self.endpoints.policy(),
            webhook_policy: self.webhooks.policy(),
            webhook_secret_overlap: self.webhook_secret_overlap,
            webhook_secret_keys: self.webhook_keys.keys()?,
            vapid_public_key,
            operators,
            max_watches_per_device,
            max_endpoints_per_client: self.max_endpoints_per_client,
            max_triggers_per_watch: self.max_triggers_per_watch,
            max_body_bytes: self.max_body_bytes,
            create_batch: self.create_batch,
            register_rate: self.register_rate,
            watch_rate_per_address: self.watch_rate_per_address,
            watch_rate_per_device: self.watch_rate_per_device,
            hint_rate_per_address: self.hint_rate_per_address,
            trusted_proxies: self.trusted_proxies,
            replicas: self.replicas,
            cors_origins: crate::cors::Origins::parse(&self.cors_origins)?,
            web: self.web,
            subjects: self.nats.subjects()?,
            streams: self.nats.streams(),
            bus: None,
            hint_keys: crate::hints::Keys::read(catalog.as_ref())?,
            catalog,
            check_cache: self.check_cache,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    fn settings(args: &[&str]) -> Result<Settings, ConfigError> {
        let mut argv = vec!["tidings-api", "--database-url", "postgres://x@127.0.0.1/x"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .expect("the flags parse")
            .config
            .settings()
    }

    #[test]
    fn the_vapid_public_key_and_admin_token_may_come_from_files() {
        let dir = std::env::temp_dir().join(format!("tidings-api-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("public-key");
        let token = dir.join("token");
        std::fs::write(&key, "BPublicKey\n").unwrap();
        std::fs::write(&token, "t".repeat(40)).unwrap();
        let s = settings(&[
            "--vapid-public-key-file",
            key.to_str().unwrap(),
            "--admin-token-file",
            token.to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(s.vapid_public_key.as_deref(), Some("BPublicKey"));
        assert_eq!(
            s.operators,
            vec![crate::auth::OperatorToken::named(
                "operator",
                &"t".repeat(40)
            )]
        );

        std::fs::write(&key, "").unwrap();
        let empty = settings(&["--vapid-public-key-file", key.to_str().unwrap()]);
        assert!(matches!(empty, Err(ConfigError::Secret(_))), "{empty:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_value_and_a_file_for_one_setting_are_refused() {
        let both = Cli::try_parse_from([
            "tidings-api",
            "--database-url",
            "postgres://x@127.0.0.1/x",
            "--vapid-public-key",
            "B",
            "--vapid-public-key-file",
            "/nonexistent",
        ]);
        assert!(both.is_err());
    }
}
