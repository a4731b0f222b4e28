//! Host maintenance: the hosts, cordon, drain (or what a drain would do) and
//! activate.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use drover_common::wire::{self, ApiErrorBody, HostsRequest};

use super::api::Shared;
use super::body::{json, ok_reply, read_body, MAX_BODY_BYTES};
use super::error::ApiErr;
use super::params;
use crate::core::{Event, MaintenanceOp};
use crate::runtime::Master;

#[utoipa::path(
    get,
    path = "/v1/hosts",
    tag = "hosts",
    responses(
        (status = 200, description = "Every host, sorted by name.", body = Vec<wire::HostView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list_hosts(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.host_views()))
}

#[utoipa::path(
    get,
    path = "/v1/hosts/{host}",
    tag = "hosts",
    params(params::HostPath),
    responses(
        (status = 200, description = "The host.", body = wire::HostView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn get_host(
    State(api): State<Shared>,
    Path(host): Path<String>,
) -> Result<Response, ApiErr> {
    let mut views = api
        .master
        .read(|c| c.host_views_named(std::slice::from_ref(&host)))?;
    match views.pop() {
        Some(v) => Ok(json(StatusCode::OK, &v)),
        None => Err(ApiErr::not_found(&format!("host {host}"), "host")),
    }
}

/// Reads a maintenance request; `deadline_ms` is for drains only.
pub(super) async fn hosts_request(body: Body, drain: bool) -> Result<HostsRequest, ApiErr> {
    let text = read_body(body, MAX_BODY_BYTES).await?;
    let req: HostsRequest = serde_json::from_str(&text).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not {{\"hosts\": [\"HOST\", ...]}}: {e}"),
            None,
        )
    })?;
    for (set, field) in [
        (req.deadline_ms.is_some(), "deadline_ms"),
        (req.start_at_ms.is_some(), "start_at_ms"),
        (req.dry_run, "dry_run"),
    ] {
        if set && !drain {
            return Err(ApiErr::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("{field} applies to drains only; remove it"),
                Some(field),
            ));
        }
    }
    Ok(req)
}

/// Applies a maintenance request to the hosts it names.
pub(super) async fn maintain(
    m: &Master,
    op: MaintenanceOp,
    hosts: Vec<String>,
) -> Result<Response, ApiErr> {
    ok_reply(m.apply(Event::Maintenance { op, hosts }).await?)
}

#[utoipa::path(
    post,
    path = "/v1/hosts/cordon",
    tag = "hosts",
    request_body = HostsRequest,
    responses(
        (status = 200, description = "The hosts after the change.", body = Vec<wire::HostView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn cordon_hosts(
    State(api): State<Shared>,
    body: Body,
) -> Result<Response, ApiErr> {
    let req = hosts_request(body, false).await?;
    maintain(&api.master, MaintenanceOp::Cordon, req.hosts).await
}

#[utoipa::path(
    post,
    path = "/v1/hosts/drain",
    tag = "hosts",
    request_body = HostsRequest,
    responses(
        (status = 200, description = "The hosts after the change, or with `dry_run` what a drain would do.", body = params::DrainAnswer),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn drain_hosts(State(api): State<Shared>, body: Body) -> Result<Response, ApiErr> {
    let req = hosts_request(body, true).await?;
    if req.dry_run && req.start_at_ms.is_some() {
        return Err(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "dry_run predicts a drain starting now; remove start_at_ms".to_string(),
            Some("start_at_ms"),
        ));
    }
    if req.dry_run {
        let probe = api
            .master
            .read(|c| c.drain_probe(&req.hosts, crate::runtime::now()))?;
        return Ok(json(StatusCode::OK, &probe));
    }
    let op = match req.start_at_ms {
        Some(at_ms) => MaintenanceOp::DrainAt {
            at_ms,
            deadline_ms: req.deadline_ms,
        },
        None => MaintenanceOp::Drain {
            deadline_ms: req.deadline_ms,
        },
    };
    maintain(&api.master, op, req.hosts).await
}

#[utoipa::path(
    post,
    path = "/v1/hosts/activate",
    tag = "hosts",
    request_body = HostsRequest,
    responses(
        (status = 200, description = "The hosts after the change.", body = Vec<wire::HostView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn activate_hosts(
    State(api): State<Shared>,
    body: Body,
) -> Result<Response, ApiErr> {
    let req = hosts_request(body, false).await?;
    maintain(&api.master, MaintenanceOp::Activate, req.hosts).await
}
