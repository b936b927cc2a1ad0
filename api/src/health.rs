//! Liveness (the process answers) and readiness (it can reach Postgres).

use crate::AppState;
use crate::problem::{ApiError, Problem};
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use utoipa::ToSchema;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[utoipa::path(get, path = "/livez", tag = "health",
    responses((status = 200, description = "The process is serving", body = Health)))]
pub async fn livez() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// The operator port's `/readyz` (where the kubelet probes): checks Postgres and the schema
/// now, and says what is wrong.
pub async fn readyz(State(app): State<AppState>) -> Result<Json<Health>, ApiError> {
    ready(&app).await.map_err(ApiError::Unavailable)?;
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// How often the public `/readyz`'s answer is refreshed.
pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "The api was ready at its last check (at most 2 s ago)", body = Health),
        (status = 503, description = "Not ready (the reason is on the operator port's /readyz), or shutting down", body = Problem, content_type = "application/problem+json"),
    ))]
/// The public listener's `/readyz`: the last check's answer, refreshed every [`REFRESH`] by
/// [`refresh_readiness`]. Anyone on the internet may call it, so it never runs a query per
/// request and never says why it is not ready (a database's error text names hosts and users).
pub async fn public_readyz(State(app): State<AppState>) -> Result<Json<Health>, ApiError> {
    let ready_now = match &app.last_ready {
        Some(seen) => !app.stopping.is_cancelled() && seen.load(Ordering::Relaxed),
        None => ready(&app).await.is_ok(),
    };
    if !ready_now {
        return Err(ApiError::Unavailable("not ready".to_owned()));
    }
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// Checks readiness every [`REFRESH`] until the api stops, for [`public_readyz`].
pub async fn refresh_readiness(app: AppState) {
    loop {
        let _ = ready(&app).await;
        tokio::select! {
            () = app.stopping.cancelled() => return,
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}

/// What `/readyz` answers; also sets `tidings_ready`.
async fn ready(app: &AppState) -> Result<(), String> {
    if app.stopping.is_cancelled() {
        tidings_runtime::metrics::metrics().ready.set(0);
        return Err("shutting down: draining before the listener closes".to_owned());
    }
    let result = tidings_runtime::ops::Probes::default()
        .with_check(tidings_store::readiness(app.pool.clone()))
        .ready()
        .await;
    if let Some(seen) = &app.last_ready {
        seen.store(result.is_ok(), Ordering::Relaxed);
    }
    result
}

#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus metrics (OpenMetrics text)", content_type = "application/openmetrics-text")))]
pub async fn metrics(State(app): State<AppState>) -> impl axum::response::IntoResponse {
    // A scrape sees readiness as a probe would (`tidings_ready`).
    let _ = ready(&app).await;
    tidings_runtime::ops::metrics_text().await
}
