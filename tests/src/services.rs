//! The real service binaries, started by a test against the test's database, subject prefix and
//! fakes. The binaries are built (debug) by the first test that needs them, so a test always
//! runs the current code.

use crate::fake_push::CERT_PEM;
use crate::harness::poll_wait;
use crate::scenario::Scenario;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tidings_domain::outbox::Status;
pub use tidings_testkit::binaries::{CliRun, SERVICES, binary, cli, cli_binary, endpoint_cli};

pub const ADMIN_TOKEN: &str = "end-to-end-operator-token-0123456789abcdef";

/// The Standard Webhooks secrets that sign change hints for every named source of a
/// [`Pipeline`]: the current one and one being rotated out.
pub const HINT_SECRETS: [&str; 2] = [
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "whsec_dGlkaW5ncy1lMmUtcm90YXRlZC1vdXQtc2VjcmV0",
];

/// The four services, running.
pub struct Pipeline {
    env: Vec<(String, String)>,
    children: HashMap<&'static str, Child>,
    ports: HashMap<&'static str, u16>,
    /// The api's ops port (operator routes, `/metrics`).
    api_ops: u16,
    logs: PathBuf,
}

impl Pipeline {
    /// Starts every service against `s`'s database, prefix and catalog, pushing to a fake push
    /// service on 127.0.0.1 (TLS with the fixture certificate). `extra` env wins.
    pub async fn start(s: &Scenario, extra: &[(&str, &str)]) -> Pipeline {
        Self::start_only(s, &SERVICES, extra).await
    }

    /// Starts only `services` (e.g. a benchmark's naive mode runs no dispatcher).
    pub async fn start_only(
        s: &Scenario,
        services: &[&'static str],
        extra: &[(&str, &str)],
    ) -> Pipeline {
        let logs = std::env::temp_dir().join(format!("tidings-e2e-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&logs).expect("log dir");
        let ca = logs.join("ca.pem");
        std::fs::write(&ca, CERT_PEM).expect("ca file");
        let sources = logs.join("sources.json");
        // Every named source takes change hints signed with either of HINT_SECRETS (a rotation).
        let secrets = logs.join("hint-secrets");
        std::fs::write(&secrets, HINT_SECRETS.join("\n")).expect("hint secrets file");
        let mut file = s.catalog.sources_file();
        for source in file["sources"].as_array_mut().into_iter().flatten() {
            source["hint_secrets_file"] = secrets.display().to_string().into();
        }
        std::fs::write(&sources, file.to_string()).expect("sources file");
        let (vapid_private, vapid_public) =
            tidings_webpush::vapid::VapidKey::generate().expect("vapid key");
        let mut env: Vec<(String, String)> = [
            ("DATABASE_URL", s.db.url.clone()),
            (
                "NATS_URL",
                crate::harness::stack().expect("stack").nats_url.clone(),
            ),
            ("TIDINGS_PREFIX", s.subjects.prefix().to_owned()),
            ("TIDINGS_SOURCE_URL", s.catalog.item_url()),
            ("TIDINGS_SOURCE_BATCH_URL", s.catalog.batch_url()),
            // Items `shop:<code>` are read from the catalog's JSON API (docs/sources.md).
            ("TIDINGS_SOURCES_FILE", sources.display().to_string()),
            ("TIDINGS_SOURCE_TIMEOUT", "2s".into()),
            ("TIDINGS_PUSH_ALLOWED_HOSTS", "127.0.0.1:*".into()),
            ("TIDINGS_PUSH_ALLOW_PRIVATE", "127.0.0.1:*".into()),
            ("TIDINGS_PUSH_EXTRA_CA_FILE", ca.display().to_string()),
            // Webhook receivers of the tests are on 127.0.0.1 too.
            (
                "TIDINGS_WEBHOOK_ALLOW_PRIVATE",
                "127.0.0.1:*,localhost:*".into(),
            ),
            ("TIDINGS_VAPID_PRIVATE_KEY", vapid_private),
            ("TIDINGS_VAPID_PUBLIC_KEY", vapid_public),
            ("TIDINGS_VAPID_SUBJECT", "mailto:e2e@tidings.invalid".into()),
            ("TIDINGS_ADMIN_TOKEN", ADMIN_TOKEN.into()),
            // Tests stop the api at once; the drain has a test of its own.
            ("TIDINGS_API_DRAIN", "0s".into()),
            // The operator routes on dead letters and `doctor` (as the `api` NATS user).
            ("TIDINGS_API_NATS", "true".into()),
            // Every client of a test is 127.0.0.1; the limits have a test of their own.
            ("TIDINGS_API_REGISTER_RATE", "off".into()),
            ("TIDINGS_API_WATCH_RATE_PER_ADDRESS", "off".into()),
            ("TIDINGS_API_WATCH_RATE_PER_DEVICE", "off".into()),
            ("TIDINGS_API_HINT_RATE_PER_ADDRESS", "off".into()),
            ("TIDINGS_SCAN_INTERVAL", "500ms".into()),
            ("TIDINGS_RETRY_BASE", "500ms".into()),
            ("TIDINGS_POLL_INTERVAL", "20ms".into()),
            ("RUST_LOG", "info".into()),
            ("RUST_BACKTRACE", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (k, v) in extra {
            env.retain(|(key, _)| key != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        // A test's own NATS is one server unless the test says otherwise, whatever replica
        // count the stack's (`stack test --nats-cluster`) asks for.
        let named = |key: &str| extra.iter().any(|(k, _)| *k == key);
        if named("NATS_URL") && !named("TIDINGS_STREAM_REPLICAS") {
            env.push(("TIDINGS_STREAM_REPLICAS".to_owned(), "1".to_owned()));
        }
        let ports: HashMap<&'static str, u16> = SERVICES
            .iter()
            .map(|s| (*s, crate::brokers::free_port().expect("free port")))
            .collect();
        // The links in mails lead to this api (read only where email is on).
        let public_url = format!("http://127.0.0.1:{}", ports["api"]);
        if !env.iter().any(|(k, _)| k == "TIDINGS_PUBLIC_URL") {
            env.push(("TIDINGS_PUBLIC_URL".to_owned(), public_url));
        }
        let mut p = Pipeline {
            env,
            children: HashMap::new(),
            ports,
            api_ops: crate::brokers::free_port().expect("free port"),
            logs,
        };
        for name in services {
            p.spawn(name);
        }
        for name in services {
            p.wait_ready(name).await;
        }
        p
    }

    /// Sets `key` for the services spawned from now on (a restart with another setting).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// The process id of a running service.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.get(name).map(Child::id)
    }

    /// Starts (or restarts) one service; its log goes to `<logs>/<name>.log` (appended).
    pub fn spawn(&mut self, name: &'static str) {
        let port = self.ports[name];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{name}.log")))
            .expect("log file");
        let mut cmd = Command::new(binary(name));
        if name == "api" {
            cmd.arg("serve")
                .env("TIDINGS_API_LISTEN", format!("127.0.0.1:{port}"))
                .env("TIDINGS_OPS_LISTEN", format!("127.0.0.1:{}", self.api_ops));
        } else {
            cmd.env("TIDINGS_OPS_LISTEN", format!("127.0.0.1:{port}"));
        }
        // Traces are exported only where a test asks for them.
        cmd.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // Each service logs in as its own user, with only its role's grants.
            .envs(
                self.env
                    .iter()
                    .filter(|(k, _)| k == "DATABASE_URL")
                    .map(|(k, url)| (k, crate::harness::login_url(url, name))),
            );
        // On the stack's server each service is its own NATS user, with only its permissions;
        // a test's own server ignores the login unless it is configured with these users.
        let logins = &crate::harness::stack().expect("stack").nats_passwords;
        if let Some((user, password)) = logins.iter().find(|(s, _)| s == name) {
            cmd.env("NATS_USER", user).env("NATS_PASSWORD", password);
        }
        cmd.stdout(Stdio::null())
            .stderr(log.try_clone().map(Stdio::from).unwrap_or(Stdio::null()));
        let child = cmd.spawn().expect("spawn service");
        self.children.insert(name, child);
    }

    /// Where a service serves `/metrics` (and the api its operator routes).
    pub fn ops_url(&self, name: &str) -> String {
        if name == "api" {
            format!("http://127.0.0.1:{}", self.api_ops)
        } else {
            self.url(name)
        }
    }

    /// Service `name`'s `/metrics` text.
    pub async fn metrics(&self, name: &str) -> String {
        let url = format!("{}/metrics", self.ops_url(name));
        let answer = reqwest::get(url).await.expect("/metrics answers");
        answer.text().await.expect("/metrics text")
    }

    /// `http://127.0.0.1:<port>`: the api, or a worker's ops endpoint.
    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}", self.ports[name])
    }

    /// Waits (at most `limit_secs`) until at least `n` outbox rows are in any of `states`; on
    /// time-out, fails with the dispatcher's log.
    pub async fn wait_for_rows(&self, s: &Scenario, states: &[Status], n: i64, limit_secs: u64) {
        let started = Instant::now();
        loop {
            let now = s.db.rows_in(states).await;
            if now >= n {
                return;
            }
            poll_wait(started, limit_secs, || {
                format!(
                    "{now} of {n} rows in {states:?}:\n{}",
                    self.log("dispatcher")
                )
            })
            .await;
        }
    }

    /// The folder holding the services' logs and the files handed to them.
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Until `name`'s `/readyz` answers 200 on the port the manifests probe (the api's ops port).
    pub async fn wait_ready(&mut self, name: &'static str) {
        let url = format!("{}/readyz", self.ops_url(name));
        let started = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                return;
            }
            if let Some(child) = self.children.get_mut(name)
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("{name} exited ({status}):\n{}", self.log(name));
            }
            poll_wait(started, 30, || {
                format!("{name} not ready within 30 s:\n{}", self.log(name))
            })
            .await;
        }
    }

    /// `kill -9`, as a crash or an OOM kill would.
    pub fn kill(&mut self, name: &'static str) {
        if let Some(mut child) = self.children.remove(name) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Services that exited by themselves since the last look, with their exit status (a
    /// supervisor's view: the caller may start them again).
    pub fn exited(&mut self) -> Vec<(&'static str, ExitStatus)> {
        let mut out = Vec::new();
        for (name, child) in self.children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                out.push((*name, status));
            }
        }
        for (name, _) in &out {
            self.children.remove(name);
        }
        out
    }

    /// Sends SIGTERM and waits (up to `grace`) for the exit status.
    pub async fn terminate(&mut self, name: &'static str, grace: Duration) -> ExitStatus {
        let mut child = self.children.remove(name).expect("running service");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if started.elapsed() > grace {
                let _ = child.kill();
                panic!(
                    "{name} did not exit within {grace:?} of SIGTERM:\n{}",
                    self.log(name)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM to every service; each must exit 0 within 20 s.
    pub async fn stop(mut self) {
        for name in SERVICES {
            if self.children.contains_key(name) {
                let status = self.terminate(name, Duration::from_secs(20)).await;
                assert!(
                    status.success(),
                    "{name} exited with {status}:\n{}",
                    self.log(name)
                );
            }
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test keeps its services' logs to be read; a pipeline dropped without stop()
        // (a test that ran one service alone, or a benchmark) leaves nothing behind.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

/// `method` `url` with `token` as the bearer and `body` as JSON: the status and the JSON answer
/// (null when there is none).
pub async fn call(
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let resp = request.send().await.expect("the api answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// A watch on `item` for a price below `threshold` (minor units), made with `token`: the api's
/// answer, which must be a 201.
pub async fn watch_below(
    p: &Pipeline,
    token: &str,
    item: &str,
    threshold: i64,
) -> serde_json::Value {
    let trigger = serde_json::json!({"kind": "price_below", "threshold": threshold});
    let body = serde_json::json!({"item_code": item, "triggers": [trigger]});
    let url = format!("{}/v1/watches", p.url("api"));
    let (status, watch) = call(reqwest::Method::POST, url, Some(token), Some(body)).await;
    assert_eq!(status, 201, "{watch}");
    watch
}
