//! Per-test isolation on a shared Postgres and NATS.
//!
//! Connection URLs come from the environment (`TIDINGS_ADMIN_DATABASE_URL`, `NATS_URL`), which
//! `deploy/local/stack test` sets. When they are missing (plain `cargo test`), the harness asks
//! `deploy/local/stack env`, which starts the stack if needed.
//!
//! Each [`TestDb`] is a new database cloned from a migrated template (one `CREATE DATABASE …
//! TEMPLATE`, ~30 ms, instead of running every migration per test), dropped when the test ends.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection, PgPool};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::OnceLock;
use tidings_domain::subjects::Subjects;
use tidings_store::schema::MIGRATOR;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("could not start the local stack ({script}): {detail}")]
    Stack { script: String, detail: String },
    #[error("Postgres: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("NATS: {0}")]
    Nats(String),
}

/// Where the shared servers are.
#[derive(Clone, Debug)]
pub struct Stack {
    pub admin_database_url: String,
    pub nats_url: String,
    /// The nats-server binary, for tests that run a broker of their own (`crate::brokers`).
    pub nats_server: String,
    /// The password of each service's NATS user on the stack's server, by service name
    /// (`deploy/local/nats-users.conf`); clients without credentials are its admin.
    pub nats_passwords: Vec<(String, String)>,
}

/// `TIDINGS_NATS_<SERVICE>_PASSWORD` of each service that uses NATS, from `get`.
fn nats_passwords(get: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    tidings_bus::permissions::Service::ALL
        .iter()
        .filter_map(|s| {
            let key = format!("TIDINGS_NATS_{}_PASSWORD", s.name().to_uppercase());
            Some((s.name().to_owned(), get(&key)?))
        })
        .collect()
}

fn stack_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local/stack")
}

fn discover() -> Result<Stack, HarnessError> {
    if let (Ok(db), Ok(nats)) = (
        std::env::var("TIDINGS_ADMIN_DATABASE_URL"),
        std::env::var("NATS_URL"),
    ) {
        return Ok(Stack {
            admin_database_url: db,
            nats_url: nats,
            nats_server: std::env::var("TIDINGS_NATS_SERVER")
                .unwrap_or_else(|_| "nats-server".into()),
            nats_passwords: nats_passwords(|key| std::env::var(key).ok()),
        });
    }
    let script = stack_script();
    let err = |detail: String| HarnessError::Stack {
        script: script.display().to_string(),
        detail,
    };
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("env")
        .output()
        .map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
            .ok_or_else(|| err(format!("no {key} in its output: {text}")))
    };
    Ok(Stack {
        admin_database_url: get("TIDINGS_ADMIN_DATABASE_URL")?,
        nats_url: get("NATS_URL")?,
        nats_server: get("TIDINGS_NATS_SERVER")?,
        nats_passwords: nats_passwords(|key| get(key).ok()),
    })
}

/// The stack, discovered once per test process.
pub fn stack() -> Result<&'static Stack, HarnessError> {
    static STACK: OnceLock<Result<Stack, String>> = OnceLock::new();
    STACK
        .get_or_init(|| discover().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|detail| HarnessError::Stack {
            script: stack_script().display().to_string(),
            detail: detail.clone(),
        })
}

/// A pinned checker (openapi-spec-validator, yamllint, kubernetes-validate) from the stack's tools
/// venv: `TIDINGS_TOOLS_BIN` when `deploy/local/stack test` set it, else `stack tools` installs it.
/// Runs `command` to its end and answers its stdout; fails the test, saying `what` and the
/// command's stderr, when it could not start or exited with an error.
pub fn succeeds(command: &mut std::process::Command, what: &str) -> Vec<u8> {
    let out = (command.output()).unwrap_or_else(|e| panic!("{what}: could not start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

pub fn tool(name: &str) -> Result<PathBuf, HarnessError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        if let Ok(dir) = std::env::var("TIDINGS_TOOLS_BIN") {
            return Ok(PathBuf::from(dir));
        }
        let out = std::process::Command::new("bash")
            .arg(stack_script())
            .arg("tools")
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    bin.as_ref()
        .map(|dir| dir.join(name))
        .map_err(|detail| HarnessError::Stack {
            script: format!("{} tools", stack_script().display()),
            detail: detail.clone(),
        })
}

fn database_url(admin_url: &str, name: &str) -> Result<String, HarnessError> {
    let opts = PgConnectOptions::from_str(admin_url)?.database(name);
    Ok(opts.to_url_lossy().to_string())
}

/// The Postgres user each service logs in as, and the role (migration 0008) it is a member of.
/// The pusher has no database.
pub const DB_LOGINS: [(&str, &str, &str); 3] = [
    ("api", "tidings_api_login", "tidings_api"),
    (
        "dispatcher",
        "tidings_dispatcher_login",
        "tidings_dispatcher",
    ),
    ("detector", "tidings_detector_login", "tidings_detector"),
];

/// `url` with its user replaced by the one `service` logs in as; `url` unchanged for a service
/// without a database.
pub fn login_url(url: &str, service: &str) -> String {
    let Some((_, login, _)) = DB_LOGINS.iter().find(|(s, _, _)| *s == service) else {
        return url.to_owned();
    };
    match PgConnectOptions::from_str(url) {
        Ok(opts) => opts.username(login).to_url_lossy().to_string(),
        Err(_) => url.to_owned(),
    }
}

/// Creates the services' login users (as a DBA would, docs/security.md) once the migrations
/// have created their roles. Roles belong to the whole server, so this runs under the
/// template's lock and skips users that exist. Without a password: the stack trusts 127.0.0.1.
async fn ensure_logins(admin: &mut PgConnection) -> Result<(), HarnessError> {
    for (_, login, role) in DB_LOGINS {
        admin
            .execute(
                format!(
                    "DO $$ BEGIN
                        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{login}') THEN
                            CREATE ROLE {login} LOGIN IN ROLE {role};
                        END IF;
                    END $$"
                )
                .as_str(),
            )
            .await?;
    }
    Ok(())
}

/// How templates are built; changed with [`ensure_template`], so a template an older harness
/// built is not taken for one of this build.
const TEMPLATE_RECIPE: &[u8] = b"schema::migrate";

/// Template name from the migrations' checksums: a changed migration gets a new template.
fn template_name() -> String {
    // FNV-1a: stable across builds, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let migrations = MIGRATOR
        .iter()
        .flat_map(|m| (m.version.to_le_bytes().into_iter()).chain(m.checksum.iter().copied()));
    for b in migrations.chain(TEMPLATE_RECIPE.iter().copied()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("tidings_tmpl_{h:016x}")
}

async fn ensure_template(
    admin: &mut PgConnection,
    admin_url: &str,
) -> Result<String, HarnessError> {
    let name = template_name();
    // Serialise template creation across the parallel test processes.
    admin.execute("SELECT pg_advisory_lock(7342001)").await?;
    let result = async {
        let exists: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
                .bind(&name)
                .fetch_optional(&mut *admin)
                .await?;
        if exists.is_none() {
            // Build under a temporary name and rename, so a crash never leaves a half-migrated
            // template behind.
            let building = format!("{name}_building");
            admin
                .execute(format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)").as_str())
                .await?;
            admin
                .execute(format!("CREATE DATABASE {building}").as_str())
                .await?;
            let mut conn = PgConnection::connect(&database_url(admin_url, &building)?).await?;
            // As `tidings-api migrate` does, so tests run on the schema deployments have
            // (sqlx's own run would leave partitioned indexes declared but not built).
            tidings_store::schema::migrate(&mut conn).await?;
            conn.close().await?;
            admin
                .execute(format!("ALTER DATABASE {building} RENAME TO {name}").as_str())
                .await?;
        }
        ensure_logins(admin).await?;
        Ok::<_, HarnessError>(())
    }
    .await;
    admin.execute("SELECT pg_advisory_unlock(7342001)").await?;
    result.map(|()| name)
}

/// A fresh, migrated database that is dropped when the value is dropped (set
/// `TIDINGS_KEEP_TEST_DB=1` to keep it for a look after a failure).
pub struct TestDb {
    pub pool: PgPool,
    pub name: String,
    pub url: String,
    admin_url: String,
}

impl TestDb {
    /// The single number `sql` selects, e.g. `SELECT count(*) FROM baselines`.
    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Asserts that `sql`, a count, counts `expected`.
    pub async fn assert_count(&self, sql: &str, expected: i64) {
        assert_eq!(self.count(sql).await, expected, "{sql}");
    }

    /// Until `sql`, a count, counts `expected`; fails after `secs` with the last count.
    pub async fn wait_for_count(&self, sql: &str, expected: i64, secs: u64) {
        let started = std::time::Instant::now();
        loop {
            let n = self.count(sql).await;
            if n == expected {
                return;
            }
            poll_wait(started, secs, || format!("{sql}: {n}, not {expected}")).await;
        }
    }

    /// The digest time comes for every row held for a digest, as the clock reaching it does.
    pub async fn digest_time(&self) {
        sqlx::query("UPDATE outbox SET next_attempt_at = now() WHERE held = 'digest'")
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("making digests due: {e}"));
    }

    pub async fn new() -> Result<Self, HarnessError> {
        Self::create(true).await
    }

    /// Outbox rows in any of `states` ([`rows_in`]).
    pub async fn rows_in(&self, states: &[tidings_domain::outbox::Status]) -> i64 {
        rows_in(&self.pool, states).await
    }

    /// A database with nothing in it, as before the migration Job has run.
    pub async fn empty() -> Result<Self, HarnessError> {
        Self::create(false).await
    }

    async fn create(migrated: bool) -> Result<Self, HarnessError> {
        let admin_url = stack()?.admin_database_url.clone();
        let mut admin = PgConnection::connect(&admin_url).await?;
        let name = format!("t_{}", Uuid::new_v4().simple());
        // Also for an empty database: the template's migrations create the services' roles,
        // which their login users (used by every test that starts a service) need.
        let template = ensure_template(&mut admin, &admin_url).await?;
        let create = if migrated {
            format!("CREATE DATABASE {name} TEMPLATE {template}")
        } else {
            format!("CREATE DATABASE {name}")
        };
        admin.execute(create.as_str()).await?;
        admin.close().await?;
        let url = database_url(&admin_url, &name)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&url)
            .await?;
        if migrated {
            // The template was migrated on the day it was made, with that day's weeks: make
            // today's, as the dispatcher's retention loop would.
            sqlx::query(
                "SELECT outbox_ensure_partition(d::date)
                 FROM generate_series(current_date - 7, current_date + 35, interval '7 days') d",
            )
            .execute(&pool)
            .await?;
        }
        Ok(TestDb {
            pool,
            name,
            url,
            admin_url,
        })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::env::var_os("TIDINGS_KEEP_TEST_DB").is_some() {
            eprintln!("keeping test database {} ({})", self.name, self.url);
            return;
        }
        let (name, admin_url) = (self.name.clone(), self.admin_url.clone());
        // Drop runs inside the test's runtime, which cannot be blocked on; a short-lived thread
        // with its own runtime does the clean-up. FORCE ends the pool's open connections.
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    if let Ok(mut admin) = PgConnection::connect(&admin_url).await {
                        let _ = admin
                            .execute(
                                format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str(),
                            )
                            .await;
                    }
                });
            }
        });
        let _ = handle.join();
    }
}

/// A unique subject and stream prefix for one test.
/// The streams' settings for a test: the defaults, but for `TIDINGS_PUSH_STORAGE` when the
/// environment sets it, as it does for the services a test starts (so a whole run, or a
/// benchmark, can be made with the push and result streams in memory).
pub fn stream_settings() -> tidings_bus::streams::StreamSettings {
    use tidings_bus::streams::PushStorage;
    let mut settings = tidings_bus::streams::StreamSettings::default();
    match std::env::var("TIDINGS_PUSH_STORAGE").as_deref() {
        Ok("memory") => settings.push_storage = PushStorage::Memory,
        Ok("file") => settings.push_storage = PushStorage::File,
        _ => {}
    }
    settings
}

pub fn test_subjects() -> Subjects {
    let id = Uuid::new_v4().simple().to_string();
    Subjects::new(&format!("t{}", &id[..16])).unwrap_or_else(|e| unreachable!("{e}"))
}

pub async fn nats() -> Result<async_nats::Client, HarnessError> {
    crate::brokers::client_of(&stack()?.nats_url).await
}

/// Deletes every stream (and the delivery log) of a test prefix (best effort), so a long test run does not fill the
/// shared server's storage.
pub async fn delete_streams(js: &async_nats::jetstream::Context, subjects: &Subjects) {
    for kind in tidings_domain::subjects::StreamKind::ALL {
        let _ = js.delete_stream(subjects.stream(kind)).await;
    }
    let _ = js
        .delete_key_value(subjects.bucket(tidings_bus::delivered::BUCKET))
        .await;
}

/// One turn of a polling loop: fails the test with `why` once `limit_secs` have passed since
/// `started`, else waits 50 ms.
pub async fn poll_wait(started: std::time::Instant, limit_secs: u64, why: impl FnOnce() -> String) {
    let limit = std::time::Duration::from_secs(limit_secs);
    assert!(started.elapsed() < limit, "{}", why());
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}

/// Asserts that the checked-in `file` is `expected`, the text `source` generates; with
/// `TIDINGS_BLESS` set it rewrites the file first.
pub fn assert_generated(file: &std::path::Path, expected: &str, source: &str) {
    if std::env::var_os("TIDINGS_BLESS").is_some() {
        std::fs::write(file, expected).unwrap();
    }
    let actual = std::fs::read_to_string(file).unwrap_or_default();
    assert!(
        actual == expected,
        "{} is not what {source} generates; run this test with TIDINGS_BLESS=1",
        file.display()
    );
}

/// Serves `router` on a free local port; returns its base URL.
pub async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// Number of messages stored in a stream of a test prefix.
pub async fn stream_len(
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
    kind: tidings_domain::subjects::StreamKind,
) -> u64 {
    let mut stream = js.get_stream(subjects.stream(kind)).await.expect("stream");
    stream.info().await.expect("stream info").state.messages
}

/// Outbox rows of `pool` in any of `states`, read through the store's typed counts.
pub async fn rows_in(pool: &PgPool, states: &[tidings_domain::outbox::Status]) -> i64 {
    tidings_store::history::by_state_and_reason(pool)
        .await
        .unwrap_or_else(|e| panic!("counting outbox rows: {e}"))
        .into_iter()
        .filter(|(status, _, _)| states.contains(status))
        .map(|(_, _, n)| n)
        .sum()
}
