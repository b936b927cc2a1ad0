//! The routes and their OpenAPI 3.1 description, built together: a handler is served only if it
//! is registered here, and registering it documents it.

use crate::problem::{ApiError, FieldError, Problem};
use crate::{
    AppState, attempts, audit, bulk, dead_letters, deliveries, devices, doctor, endpoints, health,
    history, mailboxes, operators, pages, pause, shown, watches,
};
use axum::Json;
use std::sync::OnceLock;
use tidings_domain::outbox::Status;
use utoipa::openapi::OpenApi as Document;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tidings API",
        description = "Register a device and its Web Push subscription (or, with a client key, a webhook endpoint), watch items, and read the history of every notification: sent, withheld because it stopped being true, or failed.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(Problem, FieldError, Status)),
    modifiers(&Security),
    tags(
        (name = "devices", description = "Anonymous devices and their push subscription"),
        (name = "webhooks", description = "Webhook endpoints: registered with a client key the operator issued, then watched for like a device"),
        (name = "watches", description = "What a device watches"),
        (name = "history", description = "A device's notifications"),
        (name = "sources", description = "Change hints from a source's data owner, signed with Standard Webhooks"),
        (name = "operators", description = "Outbox inspection and replay (admin token), served on the ops port (TIDINGS_OPS_LISTEN, 9090), not the public one"),
        (name = "email", description = "The pages a mail's links open: confirmation, unsubscribe (RFC 8058 one-click), and the notification checked when it is read"),
        (name = "health", description = "Probes"),
    )
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "device_token",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        components.add_security_scheme(
            "client_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The public routes: devices, their watches and history, probes, this document.
fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(devices::create_device))
        .routes(routes!(
            devices::get_device,
            devices::update_device,
            devices::delete_device
        ))
        .routes(routes!(devices::replace_subscription))
        .routes(routes!(devices::vapid_public_key))
        .routes(routes!(endpoints::create_endpoint))
        .routes(routes!(endpoints::get_endpoint))
        .routes(routes!(endpoints::rotate_secret))
        .routes(routes!(deliveries::list_endpoint_attempts))
        .routes(routes!(deliveries::recover_endpoint))
        .routes(routes!(watches::create_watch, watches::list_watches))
        .routes(routes!(
            watches::get_watch,
            watches::update_watch,
            watches::delete_watch
        ))
        .routes(routes!(history::list_notifications))
        .routes(routes!(shown::notification_now))
        .routes(routes!(shown::report_shown))
        .routes(routes!(mailboxes::confirm_page, mailboxes::confirm))
        .routes(routes!(mailboxes::unsubscribe_page, mailboxes::unsubscribe))
        .routes(routes!(pages::notice))
        .routes(routes!(mailboxes::bounces))
        .routes(routes!(crate::hints::items_changed))
        .routes(routes!(health::livez))
        .routes(routes!(health::public_readyz))
        .routes(routes!(openapi_json))
}

/// The operator routes and `/metrics`, served on the ops port (`TIDINGS_OPS_LISTEN`).
fn operators() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(operators::list_outbox))
        .routes(routes!(operators::outbox_stats))
        .routes(routes!(operators::get_outbox_row))
        .routes(routes!(operators::replay))
        .routes(routes!(attempts::list_attempts))
        .routes(routes!(bulk::bulk_replay))
        .routes(routes!(bulk::bulk_cancel))
        .routes(routes!(bulk::cancel))
        .routes(routes!(pause::admin_get_device))
        .routes(routes!(pause::admin_pause_device))
        .routes(routes!(pause::admin_resume_device))
        .routes(routes!(pause::admin_get_watch))
        .routes(routes!(pause::admin_pause_watch))
        .routes(routes!(pause::admin_resume_watch))
        .routes(routes!(dead_letters::list_dead_letters))
        .routes(routes!(dead_letters::get_dead_letter))
        .routes(routes!(dead_letters::redrive_dead_letters))
        .routes(routes!(dead_letters::purge_dead_letters))
        .routes(routes!(doctor::doctor))
        .routes(routes!(endpoints::create_client))
        .routes(routes!(endpoints::list_clients))
        .routes(routes!(endpoints::revoke_client))
        .routes(routes!(audit::list_audit))
        .routes(routes!(health::metrics))
}

/// Which routes a document lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The public port's (`TIDINGS_API_LISTEN`): what a client generated from it can call.
    Public,
    /// The ops port's (`TIDINGS_OPS_LISTEN`): the operator routes and `/metrics`.
    Ops,
    /// Both (`tidings-api openapi`, docs/api.md, and a router serving both on one port).
    All,
}

/// Whether `path` is served on the ops port rather than the public one.
pub fn on_ops_port(path: &str) -> bool {
    path.starts_with("/v1/admin/") || path == "/v1/admin" || path == "/metrics"
}

/// The document of `scope`: [`document`] cut to the routes its port serves, with the tags and
/// credentials those use, and a `servers` entry saying which port it is.
pub fn document_for(scope: Scope) -> &'static serde_json::Value {
    static PUBLIC: OnceLock<serde_json::Value> = OnceLock::new();
    static OPS: OnceLock<serde_json::Value> = OnceLock::new();
    let (slot, ops) = match scope {
        Scope::All => return document(),
        Scope::Public => (&PUBLIC, false),
        Scope::Ops => (&OPS, true),
    };
    slot.get_or_init(|| {
        let mut doc = document().clone();
        if let Some(paths) = doc["paths"].as_object_mut() {
            paths.retain(|path, _| on_ops_port(path) == ops || path == "/openapi.json");
        }
        let used_tags: std::collections::BTreeSet<String> = doc["paths"]
            .as_object()
            .into_iter()
            .flatten()
            .flat_map(|(_, item)| item.as_object().into_iter().flatten())
            .filter_map(|(_, op)| op["tags"][0].as_str().map(str::to_owned))
            .collect();
        if let Some(tags) = doc["tags"].as_array_mut() {
            tags.retain(|t| t["name"].as_str().is_some_and(|n| used_tags.contains(n)));
        }
        if let Some(schemes) = doc["components"]["securitySchemes"].as_object_mut() {
            schemes.retain(|name, _| (name == "admin_token") == ops);
        }
        let (port, setting) = if ops {
            ("ops", "TIDINGS_OPS_LISTEN")
        } else {
            ("public", "TIDINGS_API_LISTEN")
        };
        doc["servers"] = serde_json::json!([{
            "url": "/",
            "description": format!("the api's {port} port ({setting}); the other port serves its own document")
        }]);
        doc
    })
}

/// The OpenAPI document of this build: every route, public and operator.
pub fn document() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let (_, doc) = public().merge(operators()).split_for_parts();
        let mut doc = serde_json::to_value(doc).unwrap_or_default();
        // Each (kind, parameters) at most once; utoipa has no attribute for `uniqueItems`.
        let triggers = &mut doc["components"]["schemas"]["CreateWatch"]["properties"]["triggers"];
        if triggers.is_object() {
            triggers["uniqueItems"] = true.into();
        }
        // A trigger is one of its variants, each with no other field (`deny_unknown_fields`).
        let variants = &mut doc["components"]["schemas"]["TriggerSpec"]["oneOf"];
        for variant in variants.as_array_mut().into_iter().flatten() {
            variant["additionalProperties"] = false.into();
        }
        doc
    })
}

/// The public router and the operator router (without probes; see `crate::routers`).
pub fn routers() -> (axum::Router<AppState>, axum::Router<AppState>) {
    let (public, _) = public().split_for_parts();
    let (ops, _) = operators().split_for_parts();
    (public, ops)
}

#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json")))]
pub async fn openapi_json(
    scope: Option<axum::Extension<Scope>>,
) -> Result<Json<&'static serde_json::Value>, ApiError> {
    Ok(Json(document_for(
        scope.map_or(Scope::All, |axum::Extension(s)| s),
    )))
}
