//! Service discovery's API (issue 28, docs/api.md "Services"): `GET /v1/services`
//! and `GET /v1/services/{role}/{env}/{name}`, each a long poll with
//! `?index=N&wait_ms=M` on the commit notifier the change stream uses; and the IP
//! an agent's announced tasks are published at, resolved once at registration.

use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use drover_common::wire::{self, ApiErrorBody, RegisterRequest, ServiceView};
use utoipa::IntoParams;

use super::api::Shared;
use super::body::{json, query_u64};
use super::error::ApiErr;
use super::longpoll::{until_news, wait_ms};
use crate::auth::{Grant, Permission, Principal};
use crate::runtime::Master;

/// How long registration waits for a host name's address.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// A service in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct ServicePath {
    /// The service's role.
    role: String,
    /// The service's environment.
    env: String,
    /// The announced name (`announce.name`, else the job's name).
    name: String,
}

/// The long poll of a service read.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ServiceQuery {
    /// Answer when the service's `index` is past this one (absent: at once).
    #[param(minimum = 0)]
    index: Option<u64>,
    /// How long to wait for that, in milliseconds (default 30000, at most
    /// 120000); at the deadline the current view is answered.
    #[param(minimum = 0)]
    wait_ms: Option<u64>,
}

/// GET /v1/services: every announced service the token may read (a discovery,
/// operator or admin token: all; a role token: its roles'), by role, environment
/// and name. With `index=N`, waits until some listed service's index passes N.
#[utoipa::path(
    get,
    path = "/v1/services",
    tag = "services",
    params(ServiceQuery),
    responses(
        (status = 200, description = "The announced services (docs/api.md, Services).", body = Vec<wire::ServiceView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let roles: Option<Vec<String>> = match &who.grant {
        Grant::Roles { roles } => Some(roles.clone()),
        Grant::Agent { .. } => return Err(super::guard::forbidden(&who, &Permission::ReadAll)),
        _ => None,
    };
    let views = wait_for(&api.master, &q, |c| {
        let views: Vec<ServiceView> = c
            .service_views()
            .into_iter()
            .filter(|v| roles.as_ref().is_none_or(|r| r.contains(&v.role)))
            .collect();
        let index = views.iter().map(|v| v.index).max().unwrap_or(0);
        let index = index.max(c.services_gone_index());
        Some((index, (index, views)))
    })
    .await?;
    let (index, views) = views.unwrap_or_default();
    Ok(with_index(json(StatusCode::OK, &views), index))
}

/// The `X-Drover-Index` header: the answer's index, to long-poll from next.
fn with_index(mut response: Response, index: u64) -> Response {
    response
        .headers_mut()
        .insert(wire::INDEX_HEADER, axum::http::HeaderValue::from(index));
    response
}

/// GET /v1/services/{role}/{env}/{name}: the service's announced instances. With
/// `index=N`, waits until its index passes N (docs/api.md, Services).
#[utoipa::path(
    get,
    path = "/v1/services/{role}/{env}/{name}",
    tag = "services",
    params(ServicePath, ServiceQuery),
    responses(
        (status = 200, description = "The service's announced instances.", body = wire::ServiceView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn show(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let view = wait_for(&api.master, &q, |c| {
        c.service_view(&role, &env, &name).map(|v| (v.index, v))
    })
    .await?;
    match view {
        Some(v) => Ok(with_index(json(StatusCode::OK, &v), v.index)),
        None => Err(ApiErr::not_found(
            &format!("service {role}/{env}/{name}: no job of role {role} and environment {env} announces it (`drover service list`)"),
            "name",
        )),
    }
}

/// Reads `read` (its index and answer; None: not found) at once, or with
/// `index=N` once its index passes N and is committed, re-reading after each
/// commit; at `wait_ms` (or when it is not found) answers what it reads then.
async fn wait_for<T>(
    m: &Master,
    q: &HashMap<String, String>,
    read: impl Fn(&crate::core::Core) -> Option<(u64, T)>,
) -> Result<Option<T>, ApiErr> {
    let after = query_u64(q, "index")?;
    until_news(m, wait_ms(q)?, |committed| {
        let Some((index, answer)) = m.read(&read) else {
            return ControlFlow::Break(None);
        };
        // An index past the committed one is a change being committed: wait for
        // it, so nothing uncommitted is answered as new. A client ahead of this
        // master (after a restore) gets the view at once.
        let fresh = after.is_none_or(|n| (index > n && index <= committed) || n > committed);
        if fresh {
            ControlFlow::Break(Some(answer))
        } else {
            ControlFlow::Continue(Some(answer))
        }
    })
    .await
}

/// Registration: the IP the agent's announced tasks are published at, when the
/// agent gave none and its `address` names a host rather than an IP: resolved
/// here, once (an IPv4 address preferred); left out if that fails, which is
/// logged (its endpoints then have an empty `ip`).
pub(super) async fn resolve_agent_ip(req: &mut RegisterRequest) {
    if req.ip.is_some() {
        return;
    }
    let Some(host) = crate::core::address_host(&req.address).map(str::to_string) else {
        return;
    };
    if host.parse::<IpAddr>().is_ok() {
        return;
    }
    let found =
        tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host.as_str(), 0))).await;
    match found {
        Ok(Ok(addrs)) => {
            let addrs: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            let ip = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first());
            req.ip = ip.map(IpAddr::to_string);
        }
        Ok(Err(e)) => {
            tracing::warn!(agent_id = %req.agent_id, %host, error = %e, "cannot resolve the agent's host; its announced tasks have no ip");
        }
        Err(_) => {
            tracing::warn!(agent_id = %req.agent_id, %host, "resolving the agent's host timed out; its announced tasks have no ip");
        }
    }
}
