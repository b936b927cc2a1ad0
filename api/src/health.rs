//! Liveness (the process answers) and readiness (it can reach Postgres).

use crate::AppState;
use crate::problem::{ApiError, Problem};
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
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

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Postgres answers", body = Health),
        (status = 503, description = "Postgres does not answer, the schema this build needs is not there yet, or the api is shutting down", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn readyz(State(app): State<AppState>) -> Result<Json<Health>, ApiError> {
    ready(&app).await.map_err(ApiError::Unavailable)?;
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// What `/readyz` answers; also sets `tidings_ready`.
async fn ready(app: &AppState) -> Result<(), String> {
    if app.stopping.is_cancelled() {
        tidings_runtime::metrics::metrics().ready.set(0);
        return Err("shutting down: draining before the listener closes".to_owned());
    }
    tidings_runtime::ops::Probes::default()
        .with_check(tidings_store::readiness(app.pool.clone()))
        .ready()
        .await
}

#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus metrics (OpenMetrics text)", content_type = "application/openmetrics-text")))]
pub async fn metrics(State(app): State<AppState>) -> impl axum::response::IntoResponse {
    // A scrape sees readiness as a probe would (`tidings_ready`).
    let _ = ready(&app).await;
    tidings_runtime::ops::metrics_text().await
}
