//! The api served in-process on a free port, and a browser-like client for it. The api's own
//! tests use it, and so do the cross-service tests (`tidings_tests::api` is this file), so the
//! api's tests build without the other services.

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use aws_lc_rs::agreement::{ECDH_P256, PrivateKey};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::{Method, RequestBuilder, Response};
use serde_json::{Value, json};
use sqlx::PgPool;
use tidings_api::Settings;
use tidings_api_types::devices::DeviceCreated;
use tidings_endpoint_guard::EndpointPolicy;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ADMIN_TOKEN: &str = "operator-token-for-tests-0123456789abcdef";
pub const VAPID_PUBLIC: &str =
    "BEl62iUYgUivxIkv69yViEuiBIa-Ib9-SkvMeAtA3LFgDzkrxZJjSgSnfckjBJuBkr3qBUYIHBQFLXYp5Nksh8U";

/// Settings for tests: endpoints on 127.0.0.1 allowed (the fake push service), a small watch
/// limit so it can be reached, operator token [`ADMIN_TOKEN`].
pub fn test_settings() -> Settings {
    Settings {
        policy: EndpointPolicy {
            allowed_hosts: vec!["127.0.0.1:*".into()],
            private_hosts: vec!["127.0.0.1:*".into()],
            allow_http: false,
        },
        vapid_public_key: Some(VAPID_PUBLIC.into()),
        operators: vec![tidings_api::auth::OperatorToken::named(
            "operator",
            ADMIN_TOKEN,
        )],
        max_watches_per_device: 3,
        // Every client of a test is 127.0.0.1; the limits have a test of their own.
        register_rate: None,
        watch_rate_per_address: None,
        watch_rate_per_device: None,
        hint_rate_per_address: None,
        ..Settings::default()
    }
}

/// A client of an api at `base`.
#[derive(Clone)]
pub struct ApiClient {
    pub base: String,
    pub http: reqwest::Client,
}

/// The api served by this process.
pub struct ApiServer {
    client: ApiClient,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl std::ops::Deref for ApiServer {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.client
    }
}

impl ApiServer {
    /// The api with [`test_settings`] on a fresh database of its own.
    pub async fn on_fresh_db() -> (tidings_testkit::harness::TestDb, Self) {
        let db = tidings_testkit::harness::TestDb::new()
            .await
            .expect("test database");
        let api = Self::start(db.pool.clone(), test_settings()).await;
        (db, api)
    }

    pub async fn start(pool: PgPool, settings: Settings) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let shutdown = CancellationToken::new();
        // One port for every route, and no drain: tests stop at once.
        let listeners = tidings_api::Listeners {
            public: listener,
            ops: None,
        };
        let task = tokio::spawn(tidings_api::serve(
            listeners,
            pool,
            settings,
            std::time::Duration::ZERO,
            shutdown.clone(),
        ));
        ApiServer {
            client: ApiClient::new(base),
            shutdown,
            task,
        }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("api task").expect("api served");
    }
}

impl ApiClient {
    pub fn new(base: String) -> Self {
        ApiClient {
            base,
            http: reqwest::Client::new(),
        }
    }

    pub fn req(&self, method: Method, path: &str, token: Option<&str>) -> RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// `GET path`, answered.
    pub async fn get(&self, path: &str, token: Option<&str>) -> Response {
        self.call(Method::GET, path, token).await
    }

    /// A request without a body, answered.
    pub async fn call(&self, method: Method, path: &str, token: Option<&str>) -> Response {
        let r = self.req(method.clone(), path, token).send().await;
        r.unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A request with a JSON body, answered.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: &impl serde::Serialize,
    ) -> Response {
        let r = self
            .req(method.clone(), path, token)
            .json(body)
            .send()
            .await;
        r.unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Registers a device with a fresh browser-like subscription; returns (device_id, token).
    pub async fn register(&self) -> (String, String) {
        let r = self
            .req(Method::POST, "/v1/devices", None)
            .json(&json!({
                "subscription": browser_subscription("https://127.0.0.1:9/push/test"),
                "time_zone": "Europe/Berlin",
            }))
            .send()
            .await
            .expect("register");
        assert_eq!(r.status(), 201, "{:?}", r.text().await);
        let created: DeviceCreated = r.json().await.expect("a created device");
        (created.device_id.to_string(), created.token)
    }
}

/// A subscription as `PushSubscription.toJSON()` gives it, with a real P-256 key pair.
pub fn browser_subscription(endpoint: &str) -> Value {
    let private = PrivateKey::generate(&ECDH_P256).expect("key");
    let public = private.compute_public_key().expect("public");
    let mut auth = [0u8; 16];
    aws_lc_rs::rand::fill(&mut auth).expect("random");
    json!({
        "endpoint": endpoint,
        "expirationTime": null,
        "keys": {
            "p256dh": URL_SAFE_NO_PAD.encode(public.as_ref()),
            "auth": URL_SAFE_NO_PAD.encode(auth),
        }
    })
}
