//! What the master says about itself: `/health` and `/metrics`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use drover_common::wire::ApiErrorBody;

use super::api::Shared;

/// Whether the master is up (no token).
#[utoipa::path(
    get,
    path = "/health",
    tag = "meta",
    responses(
        (status = 200, description = "The master is up: `ok`, or `read-only: WHY` while its store's disk is full (reads are served, writes answer 507 `read_only`; a restart would not help, so this stays 200).", content_type = "text/plain", body = String),
    ),
)]
pub(super) async fn health(State(api): State<Shared>) -> String {
    match api.master.read_only() {
        Some(why) => format!("read-only: {why}"),
        None => "ok".to_string(),
    }
}

/// GET /metrics: Prometheus text exposition (docs/master.md, "Metrics").
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    responses(
        (status = 200, description = "Prometheus metrics (docs/master.md, Metrics).", content_type = "application/openmetrics-text", body = String),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn metrics(State(api): State<Shared>) -> Response {
    let state = api.master.read(|c| c.metrics_state());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&state),
    )
        .into_response()
}
