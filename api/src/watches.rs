//! Watches: an item, the triggers that make it worth a notification, and the channel.
//!
//! A watch's item, triggers and channel never change after creation: baselines and outbox rows
//! are keyed by (watch, trigger), so a changed trigger would make history unexplainable. To watch
//! differently, delete and create. Pause and resume are the one change (PATCH).

use crate::AppState;
use crate::auth::{Device, DeviceToken};
use crate::devices::checked;
use crate::extract::{ApiQuery, ClientAddr, JsonBody, cursor, limit, page, resource_id, within};
use crate::problem::{ApiError, BodyRejected, NoSuchDevicesWatch, Problem, Unauthorized};
use crate::shown::Catalog;
use aws_lc_rs::digest::{SHA256, digest};
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sqlx::PgConnection;
use std::collections::HashSet;
use std::time::Duration;
pub use tidings_api_types::objects::{Watch, WatchList};
pub use tidings_api_types::triggers::TriggerSpec;
use tidings_domain::preferences::PreferencesSpec;
use tidings_domain::trigger::Trigger;
use tidings_domain::{Channel, ItemCode, WatchId};
use tidings_source::{OfferSelector, Unwatchable};
use tidings_store::db;
use tidings_store::watch_creates::{self, Admission, NewWatch};
use tidings_store::{endpoints, idempotency, watches};
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The trigger `spec` asks for, checked; a problem names `at`, its place in the body.
fn trigger_of(spec: &TriggerSpec, at: &str) -> Result<Trigger, ApiError> {
    let trigger = match *spec {
        TriggerSpec::PriceBelow { threshold } => Trigger::PriceBelow { threshold },
        TriggerSpec::PriceDrop { percent } => Trigger::PriceDrop {
            percent: u8::try_from(percent).map_err(|_| {
                ApiError::invalid(
                    format!("{at}/percent"),
                    format!("price_drop percent must be between 1 and 99, got {percent}"),
                )
            })?,
        },
        TriggerSpec::BackInStock {} => Trigger::BackInStock,
    };
    trigger.validate().map_err(|e| {
        let field = match spec {
            TriggerSpec::PriceBelow { .. } => "threshold",
            _ => "percent",
        };
        ApiError::invalid(format!("{at}/{field}"), e)
    })?;
    Ok(trigger)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWatch {
    /// The item's code in the catalog: 1–128 characters of letters, digits, `-`, `_`, `.`, `:`,
    /// not only dots.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*$"
    )]
    pub item_code: String,
    /// One or more triggers (at most `TIDINGS_MAX_TRIGGERS_PER_WATCH`, 8 by default); each
    /// (kind, parameters) at most once.
    #[schema(min_items = 1, max_items = 8)]
    pub triggers: Vec<TriggerSpec>,
    /// Delivery channel: a watch notifies on its device's (`web_push` for a browser, `webhook`
    /// for an endpoint); naming another is refused.
    #[serde(default)]
    #[schema(value_type = Option<Channel>)]
    pub channel: Option<String>,
    /// Follow a sent notification that stops holding before its validity ends with one that
    /// says what changed, in its place (default true).
    #[serde(default)]
    pub withdraw: Option<bool>,
    /// Its notifications go at once, past quiet hours and caps, never in a
    /// digest (default false).
    #[serde(default)]
    pub urgent: Option<bool>,
    /// Its own preferences (quiet hours, cap), in place of its device's whole; left out
    /// or null: the device's.
    #[serde(default, deserialize_with = "tidings_domain::strict::object_or_null")]
    pub preferences: Option<PreferencesSpec>,
    /// The source (by name, docs/sources.md) that reads the item: its prefix is put in front
    /// of `item_code`. Left out: the source whose prefix `item_code` has.
    #[serde(default)]
    pub source: Option<String>,
    /// Which offer of a product page (a `schema.org` source) the watch means, when the page
    /// has several at different prices. Written into the item code (`<code>::sku:<sku>`).
    #[serde(default)]
    pub offer: Option<OfferSpec>,
}

/// One offer of a product page: by its SKU, its GTIN, or its `url` as the page writes it.
/// Exactly one.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OfferSpec {
    pub sku: Option<String>,
    /// 8 to 14 digits.
    pub gtin: Option<String>,
    pub url: Option<String>,
}

impl OfferSpec {
    fn selector(&self) -> Result<OfferSelector, ApiError> {
        let invalid = |detail: String| ApiError::invalid("/offer", detail);
        match (&self.sku, &self.gtin, &self.url) {
            (Some(sku), None, None) => Ok(OfferSelector::Sku(sku.clone())),
            (None, Some(gtin), None) => {
                OfferSelector::gtin(gtin).map_err(|e| invalid(e.to_string()))
            }
            (None, None, Some(url)) => Ok(OfferSelector::for_url(url)),
            _ => Err(invalid(
                "name the offer by exactly one of sku, gtin, url".into(),
            )),
        }
    }
}

/// What a watch's device may change of it; each field left out stays as it is. Its item,
/// triggers and channel never change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateWatch {
    /// Pause (true) or resume (false) the watch. A paused watch is not scanned, and notifications
    /// already on their way are withheld (`watch_paused`).
    #[serde(default)]
    pub paused: Option<bool>,
    /// Follow a sent notification that stops holding with a withdrawal.
    #[serde(default)]
    pub withdraw: Option<bool>,
    /// Its notifications go at once, whatever the preferences.
    #[serde(default)]
    pub urgent: Option<bool>,
    /// Its own preferences; null: back to its device's.
    #[serde(default, deserialize_with = "tidings_domain::strict::change_of_object")]
    #[schema(value_type = Option<PreferencesSpec>)]
    pub preferences: Option<Option<PreferencesSpec>>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListWatches {
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<Uuid>)]
    pub cursor: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// Watch `r` as the api shows it.
pub(crate) fn watch_of(r: watches::Watch) -> Watch {
    Watch {
        id: r.id.0,
        item_code: r.item_code,
        triggers: r.triggers.0.iter().map(TriggerSpec::from_trigger).collect(),
        channel: r.channel,
        paused: r.paused,
        reference_price: r.reference_price,
        withdraw: r.withdraw,
        urgent: r.urgent,
        preferences: r.preferences.map(|p| p.0),
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

/// The item the watch means (docs/sources.md), refused when no source could answer for it. An
/// api that knows no source takes every code as written: the workers' settings decide.
fn item_of(req: &CreateWatch, catalog: Option<&Catalog>) -> Result<ItemCode, ApiError> {
    let offer = req.offer.as_ref().map(OfferSpec::selector).transpose()?;
    let Some(catalog) = catalog else {
        if req.source.is_some() || offer.is_some() {
            return Err(ApiError::invalid(
                if offer.is_some() { "/offer" } else { "/source" },
                "this api reads no source settings (TIDINGS_SOURCE_URL, TIDINGS_SOURCES_FILE): write the item code in full",
            ));
        }
        return ItemCode::parse(&req.item_code).map_err(|e| ApiError::invalid("/item_code", e));
    };
    catalog
        .sources()
        .watched_item(&req.item_code, req.source.as_deref(), offer.as_ref())
        .map_err(|e| {
            let at = match e {
                Unwatchable::UnknownSource(_) | Unwatchable::Claimed { .. } => "/source",
                Unwatchable::OfferOutsidePages(..) if offer.is_some() => "/offer",
                _ => "/item_code",
            };
            ApiError::invalid(at, e)
        })
}

fn validate(
    req: &CreateWatch,
    max_triggers: usize,
    catalog: Option<&Catalog>,
) -> Result<NewWatch, ApiError> {
    let item = item_of(req, catalog)?;
    if req.triggers.is_empty() {
        return Err(ApiError::invalid(
            "/triggers",
            "at least one trigger is needed",
        ));
    }
    if req.triggers.len() > max_triggers {
        return Err(ApiError::invalid(
            "/triggers",
            format!(
                "at most {max_triggers} triggers per watch, got {}",
                req.triggers.len()
            ),
        ));
    }
    let mut seen = HashSet::new();
    let mut triggers = Vec::with_capacity(req.triggers.len());
    for (i, spec) in req.triggers.iter().enumerate() {
        let at = format!("/triggers/{i}");
        let trigger = trigger_of(spec, &at)?;
        if !seen.insert(trigger.key()) {
            return Err(ApiError::invalid(
                at,
                format!("trigger {trigger} is listed twice"),
            ));
        }
        triggers.push(trigger);
    }
    if let Some(c) = req.channel.as_deref() {
        c.parse::<Channel>()
            .map_err(|e| ApiError::invalid("/channel", e))?;
    }
    if let Some(p) = &req.preferences {
        checked(p, "/preferences")?;
    }
    Ok(NewWatch {
        item,
        triggers,
        withdraw: req.withdraw.unwrap_or(true),
        urgent: req.urgent.unwrap_or(false),
        preferences: req.preferences.clone(),
    })
}

/// Inserts the watch for an authenticated device if it is under its limit, inside the
/// Idempotency-Key's transaction. Creates without a key go through
/// [`CreateQueue`](crate::coalesce::CreateQueue) instead.
async fn insert_watch(
    conn: &mut PgConnection,
    app: &AppState,
    device: &Device,
    new: &NewWatch,
) -> Result<Watch, ApiError> {
    let id = WatchId::new();
    let max = app.settings.max_watches_per_device;
    let row = watch_creates::for_device(conn, device.id, id, new, max)
        .await
        .map_err(db("creating a watch"))?;
    let row = row.ok_or_else(|| at_limit(max))?;
    tracing::info!(device_id = %device.id, watch_id = %id, item = new.item.as_str(), "watch created");
    Ok(watch_of(row))
}

fn at_limit(max: i32) -> ApiError {
    ApiError::Conflict {
        kind: "watch-limit",
        detail: format!("this device already has the maximum of {max} watches"),
    }
}

/// A create without an Idempotency-Key: through the shared queue, which authenticates the token
/// and applies the limit in the same statement as the insert.
async fn create_queued(
    app: &AppState,
    token: &DeviceToken,
    new: &NewWatch,
) -> Result<Watch, ApiError> {
    let id = WatchId::new();
    match app.creates.create(token.hash.clone(), id, new).await? {
        Admission::Created {
            device_id,
            at,
            channel,
        } => {
            tracing::info!(%device_id, watch_id = %id, item = new.item.as_str(), "watch created");
            Ok(Watch {
                id: id.0,
                item_code: new.item.as_str().to_owned(),
                triggers: new.triggers.iter().map(TriggerSpec::from_trigger).collect(),
                channel,
                paused: false,
                reference_price: None,
                withdraw: new.withdraw,
                urgent: new.urgent,
                preferences: new.preferences.clone(),
                created_at: at,
                updated_at: at,
            })
        }
        Admission::AtLimit => Err(at_limit(app.settings.max_watches_per_device)),
        Admission::UnknownToken => Err(ApiError::Unauthorized("invalid device token")),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY_LEN)
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "Idempotency-Key must be 1–{MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
            ))
        })?;
    Ok(Some(key.to_owned()))
}

fn created(watch: &Watch) -> Result<Response, ApiError> {
    let body = serde_json::to_value(watch).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(answer(StatusCode::CREATED, body))
}

/// A create's answer, with the `Location` of the watch it names (a replayed answer too).
fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    let location = body
        .get("id")
        .and_then(|id| id.as_str())
        .and_then(|id| HeaderValue::from_str(&format!("/v1/watches/{id}")).ok());
    let mut response = (status, Json(body)).into_response();
    if let Some(location) = location {
        response
            .headers_mut()
            .insert(axum::http::header::LOCATION, location);
    }
    response
}

#[utoipa::path(
    post, path = "/v1/watches", tag = "watches",
    request_body = CreateWatch,
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "Retrying with the same key (within 24 h) returns the first response and creates nothing new")),
    security(("device_token" = [])),
    responses(
        (status = 201, description = "Watch created (or, with a replayed Idempotency-Key, the first response)", body = Watch,
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same Idempotency-Key"),
                    ("Location" = String, description = "The watch: `/v1/watches/{id}`"))),
        BodyRejected,
        (status = 400, description = "Body is not JSON, or a bad Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
        (status = 409, description = "Watch limit reached; or the watch this Idempotency-Key created has since been deleted", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many watch creations from this device or address (`Retry-After` says when to try again)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid item code, trigger or channel; or an Idempotency-Key reused with a different body", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_watch(
    State(app): State<AppState>,
    token: DeviceToken,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    body: Result<JsonBody<CreateWatch>, ApiError>,
) -> Result<Response, ApiError> {
    within(
        &app.limits.watches_per_address,
        &client,
        "watches_per_address",
    )?;
    within(
        &app.limits.watches_per_device,
        &token.hash,
        "watches_per_device",
    )?;
    let checked = body.and_then(|body| {
        let key = idempotency_key(&headers)?;
        let new = validate(
            &body.value,
            app.settings.max_triggers_per_watch,
            app.catalog.as_deref(),
        )?;
        Ok((body, key, new))
    });
    // Authentication answers before the body does: an unknown token is 401 whatever it sent.
    // A good request checks its token inside the insert; only a refused one pays a lookup.
    let (body, key, new) = match checked {
        Ok(checked) => checked,
        Err(refused) => {
            token.device(&app).await?;
            return Err(refused);
        }
    };
    if let Some(named) = body.value.channel.as_deref() {
        same_channel(&app, &token, named).await?;
    }
    let Some(key) = key else {
        return created(&create_queued(&app, &token, &new).await?);
    };
    let device = token.device(&app).await?;
    create_with_key(&app, &device, &key, &body.raw, &new).await
}

/// Refuses a create that names a channel other than its device's (only such a create pays this
/// lookup: most name none).
async fn same_channel(app: &AppState, token: &DeviceToken, named: &str) -> Result<(), ApiError> {
    let found = endpoints::channel_of(&app.pool, &token.hash)
        .await
        .map_err(db("reading a device's channel"))?;
    match found {
        None => Err(ApiError::Unauthorized("invalid device token")),
        Some(c) if c.as_str() == named => Ok(()),
        Some(c) => Err(ApiError::invalid(
            "/channel",
            format!("this device's watches notify on {c}, not {named}"),
        )),
    }
}

/// A create with an Idempotency-Key. The key's record and the watch commit together; a
/// concurrent retry with the same key waits on the key's unique index until then, and finds the
/// stored response.
async fn create_with_key(
    app: &AppState,
    device: &Device,
    key: &str,
    raw: &[u8],
    new: &NewWatch,
) -> Result<Response, ApiError> {
    let request_hash = digest(&SHA256, raw).as_ref().to_vec();
    let mut tx = app.pool.begin().await.map_err(db("creating a watch"))?;
    let claimed = idempotency::claim(&mut tx, device.id, key, &request_hash)
        .await
        .map_err(db("recording an idempotency key"))?;
    if claimed {
        let watch = insert_watch(&mut tx, app, device, new).await?;
        let response =
            serde_json::to_value(&watch).map_err(|e| ApiError::Internal(e.to_string()))?;
        idempotency::record(&mut tx, device.id, key, 201, &response)
            .await
            .map_err(db("recording an idempotent response"))?;
        tx.commit().await.map_err(db("creating a watch"))?;
        return created(&watch);
    }
    tx.rollback().await.map_err(db("creating a watch"))?;
    replay(app, device, key, &request_hash).await
}

/// The stored answer to the first request with `key`, if this one is the same request.
async fn replay(
    app: &AppState,
    device: &Device,
    key: &str,
    request_hash: &[u8],
) -> Result<Response, ApiError> {
    let idempotency::Stored {
        request_hash: stored_hash,
        status,
        response,
    } = idempotency::read(&app.pool, device.id, key)
        .await
        .map_err(db("reading an idempotency key"))?;
    if stored_hash != request_hash {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "this key was already used with a different request body",
        ));
    }
    // A replay answers with the watch the key created; if that watch has been deleted since,
    // the answer would name a watch that is not there (and its Location a 404): say so instead.
    if let Some(id) = response
        .get("id")
        .and_then(|id| id.as_str())
        .and_then(|id| Uuid::parse_str(id).ok())
    {
        let removed = watches::is_removed(&app.pool, WatchId(id), device.id)
            .await
            .map_err(db("reading an idempotent create's watch"))?;
        if removed {
            return Err(ApiError::Conflict {
                kind: "idempotency-key-spent",
                detail: format!(
                    "this Idempotency-Key created watch {id}, which has since been deleted; \
                     send a new key to create another"
                ),
            });
        }
    }
    let status = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut response = answer(status, response);
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(response)
}

/// Deletes idempotency records older than a day, every `every`, until `shutdown`.
pub async fn expire_idempotency_keys(
    pool: sqlx::PgPool,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let delete = idempotency::expire(&pool);
        // While Postgres is away the delete waits for a connection; shutdown must not.
        let result = tokio::select! {
            () = shutdown.cancelled() => return,
            r = delete => r,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "expiring idempotency keys failed; trying again later");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[utoipa::path(
    get, path = "/v1/watches", tag = "watches",
    params(ListWatches),
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The device's watches, oldest first", body = WatchList),
        (status = 400, description = "Bad cursor or limit", body = Problem, content_type = "application/problem+json"),
        Unauthorized,
    )
)]
pub async fn list_watches(
    State(app): State<AppState>,
    device: Device,
    ApiQuery(q): ApiQuery<ListWatches>,
) -> Result<Json<WatchList>, ApiError> {
    let after = cursor(q.cursor.as_deref())?;
    let limit = limit(q.limit)?;
    let rows = watches::list(&app.pool, device.id, after.map(WatchId), limit + 1)
        .await
        .map_err(db("listing watches"))?;
    let (items, next_cursor) = page(rows, limit, |r| r.id.0.to_string(), watch_of);
    Ok(Json(WatchList { items, next_cursor }))
}

#[utoipa::path(
    get, path = "/v1/watches/{id}", tag = "watches",
    params(("id" = Uuid, Path, description = "Watch id")),
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The watch", body = Watch),
        Unauthorized,
        NoSuchDevicesWatch,
    )
)]
pub async fn get_watch(
    State(app): State<AppState>,
    device: Device,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Watch>, ApiError> {
    let id = resource_id(id, "watch")?;
    let row = watches::get(&app.pool, WatchId(id), device.id)
        .await
        .map_err(db("reading a watch"))?;
    row.map(|r| Json(watch_of(r)))
        .ok_or(ApiError::NotFound("watch"))
}

#[utoipa::path(
    patch, path = "/v1/watches/{id}", tag = "watches",
    params(("id" = Uuid, Path, description = "Watch id")),
    request_body = UpdateWatch,
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The updated watch", body = Watch),
        BodyRejected,
        Unauthorized,
        NoSuchDevicesWatch,
        (status = 422, description = "Unknown or invalid field (`paused`, `withdraw`, `urgent` and `preferences` can change), or invalid preferences", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn update_watch(
    State(app): State<AppState>,
    device: Device,
    id: Result<Path<String>, PathRejection>,
    body: JsonBody<UpdateWatch>,
) -> Result<Json<Watch>, ApiError> {
    let id = resource_id(id, "watch")?;
    let req = body.value;
    if let Some(Some(p)) = &req.preferences {
        checked(p, "/preferences")?;
    }
    let change = watches::WatchChange {
        paused: req.paused,
        withdraw: req.withdraw,
        urgent: req.urgent,
        preferences: req.preferences,
    };
    let row = watches::change_for_device(&app.pool, WatchId(id), device.id, &change)
        .await
        .map_err(db("updating a watch"))?;
    let row = row.ok_or(ApiError::NotFound("watch"))?;
    if change.preferences.is_some() || change.urgent.is_some() {
        crate::devices::release_held(&app, device.id, Some(WatchId(id))).await?;
    }
    tracing::info!(device_id = %device.id, watch_id = %id, paused = row.paused,
        urgent = row.urgent, "watch updated");
    Ok(Json(watch_of(row)))
}

#[utoipa::path(
    delete, path = "/v1/watches/{id}", tag = "watches",
    params(("id" = Uuid, Path, description = "Watch id")),
    security(("device_token" = [])),
    responses(
        (status = 204, description = "Watch removed; its pending notifications will be dropped"),
        Unauthorized,
        NoSuchDevicesWatch,
    )
)]
pub async fn delete_watch(
    State(app): State<AppState>,
    device: Device,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = resource_id(id, "watch")?;
    let removed = watches::remove(&app.pool, WatchId(id), device.id)
        .await
        .map_err(db("removing a watch"))?;
    if !removed {
        return Err(ApiError::NotFound("watch"));
    }
    tracing::info!(device_id = %device.id, watch_id = %id, "watch removed");
    Ok(StatusCode::NO_CONTENT)
}
