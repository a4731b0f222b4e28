//! `GET /metrics` on the agent's HTTP server: the outbox and task gauges read now,
//! with the process-wide counters and histograms (`crate::metrics`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use drover_common::state::now_ms;

use super::{lock, Shared};
use crate::metrics::{render, Gauges};

/// The Prometheus text exposition of the agent's metrics.
pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let (outbox_updates, outbox_bytes, oldest) = {
        let outbox = lock(&shared.outbox);
        (outbox.len(), outbox.bytes(), outbox.oldest_timestamp_ms())
    };
    let outbox_oldest_age_seconds =
        oldest.map_or(0.0, |at| now_ms().saturating_sub(at) as f64 / 1000.0);
    let tasks = lock(&shared.tasks).running();
    let text = render(&Gauges {
        outbox_updates,
        outbox_bytes,
        outbox_oldest_age_seconds,
        tasks,
    });
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
