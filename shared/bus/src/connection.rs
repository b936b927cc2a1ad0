//! How a service reaches NATS: a server list, credentials, TLS, and how it reconnects.
//!
//! The flags and their environment variables are the ones the `nats` CLI and the NATS clients
//! use (`NATS_URL`, `NATS_CREDS`, `NATS_NKEY`, `NATS_USER`, `NATS_PASSWORD`, `NATS_CA`,
//! `NATS_CERT`, `NATS_KEY`), so an operator's existing context carries over. `NATS_URL` may list
//! several servers separated by commas; the client starts at a random one of them, learns the rest
//! of the cluster from the server it reaches, and reconnects to another when one goes away.

use async_nats::{ConnectOptions, ServerAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tidings_domain::backoff::RetryPolicy;

/// Where NATS is and how to log in to it.
#[derive(clap::Args, Clone, Debug)]
pub struct ConnectionArgs {
    /// One NATS server or several, comma-separated (`nats://a:4222,nats://b:4222`); `tls://`
    /// requires TLS.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// A credentials file (user JWT and NKEY seed, as `nsc` writes it).
    #[arg(long, env = "NATS_CREDS", conflicts_with_all = ["nats_nkey", "user"])]
    pub nats_creds: Option<PathBuf>,
    /// A file holding an NKEY seed (`SU…`).
    #[arg(long, env = "NATS_NKEY", conflicts_with = "user")]
    pub nats_nkey: Option<PathBuf>,
    /// User name for user/password authentication (with `NATS_PASSWORD` or
    /// `NATS_PASSWORD_FILE`).
    #[arg(long, env = "NATS_USER", group = "user")]
    pub nats_user: Option<String>,
    /// A file holding the user name (a mounted Secret, beside its password), instead of
    /// `NATS_USER`.
    #[arg(long, env = "NATS_USER_FILE", group = "user")]
    pub nats_user_file: Option<PathBuf>,
    #[arg(long, env = "NATS_PASSWORD", requires = "user", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// A file holding the password (a mounted Secret), instead of `NATS_PASSWORD`.
    #[arg(
        long,
        env = "NATS_PASSWORD_FILE",
        requires = "user",
        conflicts_with = "nats_password"
    )]
    pub nats_password_file: Option<PathBuf>,
    /// CA certificate(s) to trust for the servers' TLS certificates; setting it requires TLS.
    #[arg(long, env = "NATS_CA")]
    pub nats_ca: Option<PathBuf>,
    /// Client certificate for servers that verify clients (with `NATS_KEY`).
    #[arg(long, env = "NATS_CERT", requires = "nats_key")]
    pub nats_cert: Option<PathBuf>,
    #[arg(long, env = "NATS_KEY", requires = "nats_cert")]
    pub nats_key: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("NATS_URL is empty: give one server or a comma-separated list")]
    NoServer,
    #[error("NATS_URL entry {entry:?}: {source}")]
    Server {
        entry: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{flag} {path}: {source}")]
    File {
        flag: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("NATS_USER is set but neither NATS_PASSWORD nor NATS_PASSWORD_FILE")]
    NoPassword,
    #[error(transparent)]
    Secret(#[from] tidings_runtime::secrets::SecretError),
    #[error("NATS_NKEY {path}: the file holds no seed")]
    EmptySeed { path: String },
    #[error("NATS at {servers}: {source}")]
    Connect {
        servers: String,
        #[source]
        source: async_nats::ConnectError,
    },
}

/// How long the client waits before reconnect attempt `attempts` (1 for the first): the first
/// at once (another server in the list is likely up), then doubling from 100 ms to 5 s with
/// ±50 % jitter, so replicas that lost the same server do not come back in step.
pub fn reconnect_delay(attempts: usize) -> Duration {
    const POLICY: RetryPolicy = RetryPolicy {
        base: Duration::from_millis(100),
        max_delay: Duration::from_secs(5),
        jitter: 0.5,
        max_retry_after: Duration::ZERO,
        max_retries: u32::MAX,
    };
    match attempts {
        0 | 1 => Duration::ZERO,
        // Past `u32` attempts the backoff is long at its cap anyway.
        n => POLICY.delay(u32::try_from(n - 2).unwrap_or(u32::MAX), None),
    }
}

/// The servers `NATS_URL` lists, in order: each entry trimmed, empty entries (a trailing comma)
/// skipped.
pub fn servers(url: &str) -> Result<Vec<ServerAddr>, ConnectionError> {
    let servers = url
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            entry
                .parse::<ServerAddr>()
                .map_err(|source| ConnectionError::Server {
                    entry: entry.to_owned(),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(ConnectionError::NoServer);
    }
    Ok(servers)
}

fn file_error(flag: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ConnectionError {
    let path = path.display().to_string();
    move |source| ConnectionError::File { flag, path, source }
}

fn readable(flag: &'static str, path: &Path) -> Result<PathBuf, ConnectionError> {
    std::fs::metadata(path).map_err(file_error(flag, path))?;
    Ok(path.to_owned())
}

impl ConnectionArgs {
    /// Only a URL, as tests and tools that talk to a local server use it.
    pub fn url(url: impl Into<String>) -> Self {
        let mut args = tidings_runtime::flags::parsed_defaults::<ConnectionArgs>(&[]);
        args.nats_url = url.into();
        args
    }

    /// The servers and the client options these flags ask for; every file named is read (or
    /// checked) here, so a wrong path fails at start with the flag that named it.
    pub async fn options(&self) -> Result<(Vec<ServerAddr>, ConnectOptions), ConnectionError> {
        let servers = servers(&self.nats_url)?;
        let mut options = ConnectOptions::new()
            .retry_on_initial_connect()
            .reconnect_delay_callback(reconnect_delay);
        // Replies on an inbox of the service's own, which its NATS user alone may read.
        if let Some(prefix) =
            crate::permissions::inbox_prefix(tidings_runtime::telemetry::service_name())
        {
            options = options.custom_inbox_prefix(prefix);
        }
        if let Some(path) = &self.nats_creds {
            let creds = tokio::fs::read_to_string(path)
                .await
                .map_err(file_error("NATS_CREDS", path))?;
            options = options
                .credentials(&creds)
                .map_err(file_error("NATS_CREDS", path))?;
        }
        if let Some(path) = &self.nats_nkey {
            let seed = tokio::fs::read_to_string(path)
                .await
                .map_err(file_error("NATS_NKEY", path))?;
            let seed = seed.trim();
            if seed.is_empty() {
                return Err(ConnectionError::EmptySeed {
                    path: path.display().to_string(),
                });
            }
            options = options.nkey(seed.to_owned());
        }
        let user = tidings_runtime::secrets::value_or_file(
            "NATS_USER",
            self.nats_user.as_deref(),
            self.nats_user_file.as_deref(),
        )?;
        if let Some(user) = user {
            let password = tidings_runtime::secrets::value_or_file(
                "NATS_PASSWORD",
                self.nats_password.as_deref(),
                self.nats_password_file.as_deref(),
            )?
            .ok_or(ConnectionError::NoPassword)?;
            options = options.user_and_password(user, password);
        }
        if let Some(ca) = &self.nats_ca {
            options = options
                .add_root_certificates(readable("NATS_CA", ca)?)
                .require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&self.nats_cert, &self.nats_key) {
            options = options
                .add_client_certificate(readable("NATS_CERT", cert)?, readable("NATS_KEY", key)?);
        }
        Ok((servers, options))
    }

    /// A client that keeps trying to connect in the background (and reconnects for ever after
    /// that); the caller waits for it with `tidings_runtime::startup`. The servers show the
    /// connection under the process's service name.
    pub async fn connect(&self) -> Result<async_nats::Client, ConnectionError> {
        let (servers, options) = self.options().await?;
        options
            .name(tidings_runtime::telemetry::service_name())
            .connect(servers)
            .await
            .map_err(|source| ConnectionError::Connect {
                servers: self.nats_url.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_separated_url_is_a_server_list() {
        let list = servers("nats://n0:4222, nats://n1:4222,tls://n2:4443,").expect("list");
        let hosts: Vec<(String, u16, bool)> = list
            .iter()
            .map(|s| (s.host().to_owned(), s.port(), s.tls_required()))
            .collect();
        assert_eq!(
            hosts,
            [
                ("n0".into(), 4222, false),
                ("n1".into(), 4222, false),
                ("n2".into(), 4443, true)
            ]
        );
        assert_eq!(servers("127.0.0.1:4222").expect("one").len(), 1);
    }

    #[test]
    fn a_bad_entry_is_named_and_an_empty_list_refused() {
        let err = servers("nats://n0:4222,nats://n1:notaport").expect_err("bad port");
        assert!(err.to_string().contains("\"nats://n1:notaport\""), "{err}");
        assert!(matches!(servers(" , "), Err(ConnectionError::NoServer)));
    }

    #[test]
    fn reconnects_at_once_then_back_off_with_jitter_up_to_five_seconds() {
        assert_eq!(reconnect_delay(1), Duration::ZERO);
        for _ in 0..200 {
            let second = reconnect_delay(2);
            assert!(
                (Duration::from_millis(50)..=Duration::from_millis(150)).contains(&second),
                "{second:?}"
            );
            let late = reconnect_delay(40);
            assert!(
                (Duration::from_millis(2500)..=Duration::from_millis(7500)).contains(&late),
                "{late:?}"
            );
        }
        let draws: std::collections::HashSet<Duration> =
            (0..50).map(|_| reconnect_delay(6)).collect();
        assert!(draws.len() > 10, "jittered, not fixed: {draws:?}");
    }

    #[tokio::test]
    async fn files_named_by_the_flags_must_be_there() {
        let mut args = ConnectionArgs::url("nats://127.0.0.1:4222");
        args.nats_ca = Some("/nonexistent/ca.pem".into());
        let err = args.options().await.expect_err("missing CA");
        assert!(
            err.to_string().starts_with("NATS_CA /nonexistent/ca.pem"),
            "{err}"
        );

        let empty = std::env::temp_dir().join(format!("tidings-empty-seed-{}", std::process::id()));
        std::fs::write(&empty, "\n").expect("write");
        let mut args = ConnectionArgs::url("nats://127.0.0.1:4222");
        args.nats_nkey = Some(empty.clone());
        let err = args.options().await.expect_err("empty seed");
        let _ = std::fs::remove_file(&empty);
        assert!(matches!(err, ConnectionError::EmptySeed { .. }), "{err}");
    }
}
