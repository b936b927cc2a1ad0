//! The Tidings HTTP API: anonymous devices with a push subscription, their watches, their
//! notification history, and operator endpoints over the outbox. Postgres is the only state;
//! any number of replicas can serve.
//!
//! - [`devices`]: register a device (token shown once), replace its subscription, remove it.
//! - [`watches`]: create (idempotent with `Idempotency-Key`), list, read, pause/resume, delete.
//! - [`history`]: a device's own outbox rows, newest first, including what was withheld and why.
//! - [`operators`]: outbox rows by state and reason, counts, replay of a terminal row.
//! - [`health`]: `/livez`, `/readyz`. [`openapi`]: the OpenAPI 3.1 document, from this code.
//! - [`web`]: the browser client, service worker and demo page (`TIDINGS_API_WEB`); [`cors`]:
//!   which other origins' pages may call the public routes (`TIDINGS_API_CORS_ORIGINS`).

mod attempts;
mod audit;
pub mod auth;
mod bulk;
pub mod coalesce;
mod config;
pub mod cors;
mod dead_letters;
mod deliveries;
mod devices;
mod doctor;
mod endpoints;
mod extract;
pub mod health;
pub mod hints;
mod history;
pub mod limits;
pub mod mailboxes;
pub mod metrics;
mod openapi;
mod operators;
mod pages;
mod pause;
pub mod problem;
pub mod reseal;
mod shown;
mod watches;
mod web;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidings_endpoint_guard::EndpointPolicy;
use tidings_runtime::metrics::{HttpLabels, RouteLabels};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use config::Config;
use problem::ApiError;

/// What the api needs besides the database.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Push endpoints a subscription may use (the pusher's guard, applied at registration).
    pub policy: EndpointPolicy,
    /// Base64url VAPID public key browsers pass to `pushManager.subscribe`.
    pub vapid_public_key: Option<String>,
    /// The operator tokens accepted (none: the operator routes are off).
    pub operators: Vec<auth::OperatorToken>,
    pub max_watches_per_device: i32,
    pub max_endpoints_per_client: u32,
    pub max_triggers_per_watch: usize,
    pub max_body_bytes: usize,
    /// Most watch creates inserted by one statement (see [`coalesce`]); 1 sends each alone.
    pub create_batch: usize,
    /// Abuse limits (see [`limits`]); `None` is no limit.
    pub register_rate: Option<limits::Rate>,
    pub watch_rate_per_address: Option<limits::Rate>,
    pub watch_rate_per_device: Option<limits::Rate>,
    pub hint_rate_per_address: Option<limits::Rate>,
    pub trusted_proxies: usize,
    /// Replicas that share the rate limits (`TIDINGS_API_REPLICAS`).
    pub replicas: u32,
    /// Origins whose pages may call the public routes (see [`cors`]).
    pub cors_origins: cors::Origins,
    /// Serve the browser client and demo page under `/web/` (see [`web`]).
    pub web: bool,
    /// The subjects and streams of this deployment, as the workers name and configure them.
    pub subjects: tidings_domain::subjects::Subjects,
    pub streams: tidings_bus::streams::StreamSettings,
    /// NATS for the operator routes that need it (`TIDINGS_API_NATS`); `None` without it.
    pub bus: Option<async_nats::Client>,
    /// The catalog show-time checks read (the workers' `TIDINGS_SOURCE_URL`); `None`: the check
    /// answers 503 and devices show notifications "as of" their time.
    pub catalog: Option<tidings_source::SourceConfig>,
    /// How long an item's current value serves show-time checks.
    pub check_cache: std::time::Duration,
    /// Where webhook endpoints may point (see [`endpoints`]).
    pub webhook_policy: tidings_endpoint_guard::EndpointPolicy,
    /// How long a rotated-out webhook secret keeps signing.
    pub webhook_secret_overlap: std::time::Duration,
    /// Keys that seal webhook secrets before they are stored; none: stored as they are.
    pub webhook_secret_keys: Option<Arc<tidings_sealing::SecretKeys>>,
    /// Each source's change-hint secrets (see [`hints`]); none: every hint is refused.
    pub hint_keys: hints::Keys,
    /// The relay and the sender of confirmation mails (see [`mailboxes`]); `None`: email
    /// devices are refused.
    pub mail: Option<Arc<mailboxes::Mailer>>,
}

/// What the flags give when none is set (no operator token, no VAPID key).
impl Default for Settings {
    fn default() -> Self {
        let placeholders = ["--database-url", "-"];
        let config = tidings_runtime::flags::parsed_defaults::<config::Config>(&placeholders);
        // Unreachable while the defaults are valid, which the api's tests check.
        config
            .settings()
            .unwrap_or_else(|e| panic!("the api flags' defaults are not valid: {e}"))
    }
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub creates: coalesce::CreateQueue,
    /// Whether the database has the schema this build needs (see [`require_schema`]).
    pub schema: tidings_store::schema::Gate,
    /// Cancelled at SIGTERM: `/readyz` answers 503 while the api drains (see [`serve`]).
    pub stopping: CancellationToken,
    pub limits: Arc<limits::Limits>,
    /// What the last readiness check found, for the public listener's `/readyz` (see
    /// [`health::public_readyz`]); `None` on the one-router form, which checks per request.
    pub last_ready: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The catalog as show-time checks read it (see [`shown`]).
    pub catalog: Option<Arc<shown::Catalog>>,
    /// Change hints' ids taken lately (a replay is refused).
    pub hints_seen: Arc<hints::Seen>,
}

/// Create statements that may run at once: enough to keep two cores' worth of Postgres busy
/// while others are on the wire; creates arriving meanwhile wait and go together.
const CREATE_STATEMENTS: usize = 4;

/// Every route on one router (what tests serve); see [`routers`].
pub fn app(pool: PgPool, settings: Settings) -> axum::Router {
    one_router(pool, settings, CancellationToken::new())
}

fn one_router(pool: PgPool, settings: Settings, stopping: CancellationToken) -> axum::Router {
    let (public, ops, state) = parts(pool, settings, stopping);
    let public = with_web(public, &state);
    with_cors(
        finish(public.merge(ops), state.clone(), Listener::Public),
        &state,
    )
}

/// The public router and the operator router (`/v1/admin/*`, `/metrics`, and the probes), which
/// [`serve`] puts on separate ports. Starts the create queue's task, so it must be called
/// within a Tokio runtime. `stopping` makes `/readyz` answer 503 once cancelled.
pub fn routers(
    pool: PgPool,
    settings: Settings,
    stopping: CancellationToken,
) -> (axum::Router, axum::Router) {
    let (public, ops, mut state) = parts(pool, settings, stopping);
    let last_ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    state.last_ready = Some(last_ready);
    tokio::spawn(health::refresh_readiness(state.clone()));
    // Each port serves the document of the routes it serves.
    let ops = ops
        .route("/livez", axum::routing::get(health::livez))
        .route("/readyz", axum::routing::get(health::readyz))
        .route("/openapi.json", axum::routing::get(openapi::openapi_json))
        .layer(axum::Extension(openapi::Scope::Ops));
    let public = with_web(public, &state).layer(axum::Extension(openapi::Scope::Public));
    (
        with_cors(finish(public, state.clone(), Listener::Public), &state),
        finish(ops, state, Listener::Ops),
    )
}

fn with_web(router: axum::Router<AppState>, state: &AppState) -> axum::Router<AppState> {
    if state.settings.web {
        router.merge(web::router())
    } else {
        router
    }
}

/// Outermost, so every answer (a 401 or a 429 too) is readable by a listed origin's page.
fn with_cors(router: axum::Router, state: &AppState) -> axum::Router {
    if state.settings.cors_origins.is_empty() {
        return router;
    }
    let origins = Arc::new(state.settings.cors_origins.clone());
    router.layer(axum::middleware::from_fn_with_state(origins, cors::cors))
}

fn parts(
    pool: PgPool,
    settings: Settings,
    stopping: CancellationToken,
) -> (axum::Router<AppState>, axum::Router<AppState>, AppState) {
    let creates = coalesce::CreateQueue::start(
        pool.clone(),
        settings.max_watches_per_device,
        settings.create_batch,
        CREATE_STATEMENTS,
    );
    // The settings were checked at start (`Config::settings`); a test that gives a bad source
    // gets no catalog, as one without a source does.
    let catalog = settings.catalog.clone().and_then(|c| {
        shown::Catalog::new(c, settings.check_cache)
            .inspect_err(|e| tracing::error!(error = %e, "no show-time checks"))
            .ok()
            .map(Arc::new)
    });
    let state = AppState {
        catalog,
        hints_seen: Arc::default(),
        limits: Arc::new(limits::Limits::new(&settings)),
        schema: tidings_store::schema::Gate::new(pool.clone()),
        pool,
        settings: Arc::new(settings),
        creates,
        stopping,
        last_ready: None,
    };
    let (public, ops) = openapi::routers();
    (public, ops, state)
}

/// Which port a router serves: strangers reach the public one, operators and the monitoring
/// stack the ops one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listener {
    Public,
    Ops,
}

fn finish(router: axum::Router<AppState>, state: AppState, listener: Listener) -> axum::Router {
    let max_body = state.settings.max_body_bytes;
    router
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            audit::record,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_schema,
        ))
        .with_state(state)
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(problem::problems_everywhere))
        .layer(axum::middleware::from_fn_with_state(
            listener,
            trace_request,
        ))
}

/// The `/v1` routes answer 503 until the database has the schema this build needs (before
/// `tidings-api migrate` has run, say), rather than 500 on a missing table; health, metrics and the
/// OpenAPI document answer regardless.
async fn require_schema(
    axum::extract::State(app): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if request.uri().path().starts_with("/v1/") {
        app.schema.pass().await.map_err(|e| {
            // Operators read why in the log and on the ops port's /readyz; a stranger on the
            // public port learns nothing of the database.
            tracing::debug!(error = %tidings_runtime::telemetry::with_causes(&e), "a /v1 request waits for the schema");
            ApiError::Unavailable(
                "not ready: the service is starting or its database is not ready; try again shortly"
                    .into(),
            )
        })?;
    }
    Ok(next.run(request).await)
}

async fn no_route() -> ApiError {
    ApiError::NotFound("route")
}

/// One span per request, named by its route template (low cardinality), with the outcome.
async fn trace_request(State(listener): State<Listener>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = request.method().clone();
    // Probes come every few seconds from the kubelet: counted, but no trace of their own.
    let probe = matches!(route.as_str(), "/livez" | "/readyz");
    let span = if probe {
        tracing::Span::none()
    } else {
        tracing::info_span!(
        "http.request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        )
    };
    // A client's W3C traceparent makes this request part of its trace. On the public port its
    // sampled flag is not obeyed: a stranger could otherwise have every request exported.
    let incoming = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok());
    match listener {
        Listener::Public => tidings_runtime::telemetry::set_untrusted_parent(&span, incoming),
        Listener::Ops => tidings_runtime::telemetry::set_parent(&span, incoming),
    }
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    // i64: tracing-opentelemetry exports unsigned fields as strings.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let m = metrics::metrics();
    m.http_requests
        .get_or_create(&HttpLabels {
            route: route.clone(),
            method: method.as_str().to_owned(),
            status: status.to_string(),
        })
        .inc();
    m.http_duration
        .get_or_create(&RouteLabels { route })
        .observe(
            elapsed,
            tidings_runtime::metrics::exemplar(tidings_runtime::telemetry::trace_id(&span)),
            None,
        );
    let elapsed_ms = elapsed * 1000.0;
    if status >= 500 {
        tracing::warn!(parent: &span, status, elapsed_ms, "request failed");
    } else {
        tracing::debug!(parent: &span, status, elapsed_ms, "request");
    }
    response
}

/// What `tidings-api` does, by subcommand.
#[derive(clap::Parser)]
#[command(name = "tidings-api", version, about)]
pub enum Command {
    /// Serve the HTTP API.
    Serve(Box<Config>),
    /// Apply pending database migrations and exit.
    Migrate {
        #[command(flatten)]
        database: tidings_runtime::secrets::DatabaseArgs,
        #[command(flatten)]
        limits: MigrateLimits,
    },
    /// Print the OpenAPI document and exit.
    Openapi,
    /// Print a new Ed25519 DKIM signing key (PKCS#8 PEM) for TIDINGS_DKIM_KEY_FILE, and exit;
    /// `doctor` prints the DNS record that publishes it.
    DkimKeygen,
    /// Print a new operator token for NAME, then its line for TIDINGS_ADMIN_TOKENS_FILE (the
    /// file keeps only the token's SHA-256), and exit.
    OperatorToken {
        /// Who holds it: the audit trail's name for their actions.
        name: String,
    },
    /// Seal every stored webhook secret under the first of TIDINGS_WEBHOOK_SECRET_KEYS, and
    /// exit (after adding a key, before dropping the old one).
    Reseal {
        #[command(flatten)]
        database: tidings_runtime::secrets::DatabaseArgs,
        #[command(flatten)]
        keys: tidings_sealing::SecretKeyArgs,
    },
}

/// How long `migrate` may wait ([`tidings_store::schema::Limits`]).
#[derive(clap::Args, Debug)]
pub struct MigrateLimits {
    /// The longest a migration's statement waits for a lock before it is rolled back and tried
    /// again, so queries queued behind it go on.
    #[arg(long, env = "TIDINGS_MIGRATE_LOCK_TIMEOUT", default_value = "5s", value_parser = tidings_domain::duration::parse_duration)]
    pub lock_timeout: Duration,
    /// The longest one statement of a migration runs.
    #[arg(long, env = "TIDINGS_MIGRATE_STATEMENT_TIMEOUT", default_value = "1h", value_parser = tidings_domain::duration::parse_duration)]
    pub statement_timeout: Duration,
    /// When `migrate` gives up (exit 1; the pod's init container starts again).
    #[arg(long, env = "TIDINGS_MIGRATE_DEADLINE", default_value = "10m", value_parser = tidings_domain::duration::parse_duration)]
    pub deadline: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(#[from] config::ConfigError),
    #[error("{0:?} cannot name an operator: 1 to 64 of A–Z, a–z, 0–9, `.`, `_`, `@`, `-`")]
    OperatorName(String),
    #[error("making a token: {0}")]
    Token(#[source] problem::ApiError),
    #[error("making a DKIM key")]
    Keygen(#[source] tidings_email::dkim::DkimError),
    #[error("DATABASE_URL: {0}")]
    Database(#[source] sqlx::Error),
    #[error("listening on {listen}: {source}")]
    Listen {
        listen: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving HTTP: {0}")]
    Serve(#[source] std::io::Error),
    #[error("connecting to Postgres to apply migrations: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("applying migrations: {0}")]
    Migrate(#[from] tidings_store::schema::MigrateFailed),
    #[error("reseal needs TIDINGS_WEBHOOK_SECRET_KEYS (or _FILE): the keys to seal under")]
    NoSealingKeys,
    #[error(transparent)]
    Reseal(#[from] reseal::ResealError),
    #[error(transparent)]
    Nats(#[from] tidings_bus::connection::ConnectionError),
}

async fn bind(listen: std::net::SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Listen { listen, source })
}

/// Runs one subcommand until it is done or `shutdown`.
pub async fn run(command: Command, shutdown: CancellationToken) -> Result<(), StartError> {
    match command {
        Command::Serve(config) => {
            let mut settings = config.settings()?;
            if config.operator_nats {
                // Connects in the background: the api serves without NATS, and the routes
                // that need it say so until it is there.
                settings.bus = Some(config.nats.connection.connect().await?);
            }
            // Connects on first use: the api serves (and answers /readyz 503) while Postgres
            // is not there yet, instead of exiting into a crash loop.
            let url = config.database.url().map_err(config::ConfigError::from)?;
            let pool =
                tidings_store::postgres(&url, config.db_pool).map_err(StartError::Database)?;
            let listeners = Listeners {
                public: bind(config.listen).await?,
                ops: Some(bind(config.ops_listen).await?),
            };
            tracing::info!(listen = %config.listen, ops_listen = %config.ops_listen, "api serving");
            serve(listeners, pool, settings, config.drain, shutdown)
                .await
                .map_err(StartError::Serve)?;
            tracing::info!("api stopped");
        }
        Command::Migrate { database, limits } => {
            let url = database.url().map_err(config::ConfigError::from)?;
            let pool = tidings_store::postgres(&url, 1).map_err(StartError::Database)?;
            let mut conn = pool.acquire().await.map_err(StartError::Connect)?;
            let limits = tidings_store::schema::Limits {
                lock_timeout: limits.lock_timeout,
                statement_timeout: limits.statement_timeout,
                deadline: limits.deadline,
            };
            let migrated = tidings_store::schema::migrate_within(&mut conn, limits).await?;
            if !migrated.newer.is_empty() {
                tracing::warn!(
                    schema_version = migrated.version,
                    newer = ?migrated.newer,
                    "the database has migrations this build does not know: a newer release \
                     applied them and this one is a rollback; they stay, and this build runs on them"
                );
            }
            tracing::info!(schema_version = migrated.version, "schema is up to date");
        }
        Command::Reseal { database, keys } => {
            let keys = keys.keys().map_err(config::ConfigError::from)?;
            let keys = keys.ok_or(StartError::NoSealingKeys)?;
            let url = database.url().map_err(config::ConfigError::from)?;
            let pool = tidings_store::postgres(&url, 2).map_err(StartError::Database)?;
            let done = reseal::reseal(&pool, &keys).await?;
            tracing::info!(
                resealed = done.resealed,
                unchanged = done.unchanged,
                "webhook secrets sealed under the first key"
            );
        }
        Command::OperatorToken { name } => {
            if !auth::valid_operator_name(&name) {
                return Err(StartError::OperatorName(name));
            }
            let (token, line) = auth::new_operator_token(&name).map_err(StartError::Token)?;
            println!("{token}\n{line}");
        }
        Command::DkimKeygen => {
            let pem = tidings_email::dkim::generate_ed25519_pem().map_err(StartError::Keygen)?;
            print!("{pem}");
        }
        Command::Openapi => {
            let document = serde_json::to_string_pretty(openapi::document()).unwrap_or_default();
            println!("{document}");
        }
    }
    Ok(())
}

/// The OpenAPI document of this build (`tidings-api openapi` prints it; docs/api.md is made
/// from it).
pub fn openapi_document() -> &'static serde_json::Value {
    openapi::document()
}

/// The router with each connection's peer address, which the abuse limits key on.
fn with_peer(
    router: axum::Router,
) -> axum::extract::connect_info::IntoMakeServiceWithConnectInfo<axum::Router, std::net::SocketAddr>
{
    router.into_make_service_with_connect_info::<std::net::SocketAddr>()
}

/// Where [`serve`] listens.
pub struct Listeners {
    pub public: tokio::net::TcpListener,
    /// The operator routes and `/metrics`; `None` serves them on `public` too (tests).
    pub ops: Option<tokio::net::TcpListener>,
}

/// Serves until `shutdown`, then drains: `/readyz` answers 503 at once while requests are
/// still served for `drain` (load balancers and Kubernetes endpoints take a few seconds to stop
/// routing to a pod that is going away; closing at once would refuse what they still send),
/// then the listeners close and in-flight requests finish. Also expires old idempotency records.
pub async fn serve(
    listeners: Listeners,
    pool: PgPool,
    settings: Settings,
    drain: Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // Operators' cancels move rows through the store: their transitions count from 0.
    tidings_store::transition::init_metrics();
    let sweeper = tokio::spawn(watches::expire_idempotency_keys(
        pool.clone(),
        Duration::from_secs(600),
        shutdown.clone(),
    ));
    // `/readyz` answers 503 once `shutdown` is cancelled; the listeners close `drain` later.
    let stopping = shutdown.clone();
    let closing = CancellationToken::new();
    let drainer = {
        let (shutdown, closing) = (shutdown.clone(), closing.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            tracing::info!(
                drain_ms = drain.as_millis() as u64,
                "draining before closing the listeners"
            );
            tokio::time::sleep(drain).await;
            closing.cancel();
        })
    };
    let result = match listeners.ops {
        Some(ops_listener) => {
            let (public, ops) = routers(pool, settings, stopping);
            let public = axum::serve(listeners.public, with_peer(public))
                .with_graceful_shutdown(closing.clone().cancelled_owned());
            let ops = axum::serve(ops_listener, ops)
                .with_graceful_shutdown(closing.clone().cancelled_owned());
            let (a, b) = tokio::join!(async { public.await }, async { ops.await });
            a.and(b)
        }
        None => {
            axum::serve(
                listeners.public,
                with_peer(one_router(pool, settings, stopping)),
            )
            .with_graceful_shutdown(closing.clone().cancelled_owned())
            .await
        }
    };
    shutdown.cancel();
    closing.cancel();
    let _ = drainer.await;
    let _ = sweeper.await;
    result
}
