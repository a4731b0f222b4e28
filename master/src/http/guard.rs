//! The admin and agent APIs' gate: every routed request (except the `Public`
//! `/health`) must carry a live token (401 saying how to get one), and the token
//! must hold the permission its route needs (403 naming the missing permission),
//! before any handler runs. Mutating requests are written to the audit log. With
//! TLS, the agent API takes agents' client certificates instead of tokens. The
//! guard is handed the route table (`Gate`); it knows no handler.

use std::sync::Arc;

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::RequestExt as _;

use super::api::Api;
use super::error::ApiErr;
use crate::auth::{AuthError, Grant, Permission, Principal};
use crate::tls::PeerCert;

/// What a route requires; `guard` checks it before the handler runs. Routes whose
/// permission depends on the body or on stored state (`JobCreate`, `TaskRead`,
/// `JobList`, `AgentRegister`) get any token of the right kind from the guard and
/// finish the check in their handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No token (`/health` and the web UI's files, which hold no data).
    Public,
    /// Any admin, operator or role token; the list is filtered to what it may read.
    JobList,
    /// A token that may write jobs of the body's role.
    JobCreate,
    /// A token that may read jobs of the path's `:role`.
    JobRead,
    /// A token that may write jobs of the path's `:role`.
    JobWrite,
    /// A token that may read jobs of the task's role.
    TaskRead,
    /// A token that may read the services of the path's `:role` (a discovery
    /// token reads every role's).
    ServiceRead,
    /// Any admin, operator, role or discovery token; the list is filtered to
    /// what it may read.
    ServiceList,
    /// An admin or operator token.
    ReadAll,
    /// An admin or operator token (removing and allowing agents).
    Maintenance,
    /// An admin token.
    ManageTokens,
    /// An admin token (overrides: releasing the eviction guard).
    Override,
    /// An admin token (setting role quotas).
    ManageQuotas,
    /// An admin token (granting and revoking the users a role's tasks run as).
    ManageRoles,
    /// An agent token, bound by this registration to the body's `agent_id`.
    AgentRegister,
    /// The agent token bound to the path's `:id`.
    Agent,
}

/// One route: method, path pattern and what it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteDef {
    pub method: &'static str,
    pub path: &'static str,
    pub access: Access,
}

pub(super) const fn route(method: &'static str, path: &'static str, access: Access) -> RouteDef {
    RouteDef {
        method,
        path,
        access,
    }
}

/// What the guard is handed: the shared state and the route table it checks
/// requests against.
#[derive(Clone)]
pub struct Gate {
    pub api: Arc<Api>,
    pub routes: Arc<[RouteDef]>,
}

/// 401 with the reason and how to get a token.
pub fn unauthorized(e: &AuthError) -> Response {
    let mut response = ApiErr::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        e.to_string(),
        Some("authorization"),
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"drover\""),
    );
    response
}

/// 403 naming the permission `who` lacks.
pub fn forbidden(who: &Principal, missing: &Permission) -> ApiErr {
    ApiErr::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "token {} ({}) lacks the permission {missing}",
            who.token_id,
            who.grant.describe()
        ),
        Some("permission"),
    )
}

/// Ok if `who` holds `permission`, else the 403.
pub fn require(who: &Principal, permission: &Permission) -> Result<(), ApiErr> {
    if who.may(permission) {
        Ok(())
    } else {
        Err(forbidden(who, permission))
    }
}

/// The permission a route needs from a token (None: any non-agent token, the
/// handler finishes the check; `AgentRegister` is handled by its handler).
fn permission_of(access: Access, param: impl Fn(&str) -> String) -> Option<Permission> {
    match access {
        Access::Public
        | Access::JobList
        | Access::JobCreate
        | Access::TaskRead
        | Access::ServiceList => None,
        Access::AgentRegister => None,
        Access::JobRead => Some(Permission::ReadJob {
            role: param("role"),
        }),
        Access::ServiceRead => Some(Permission::ReadServices {
            role: param("role"),
        }),
        Access::JobWrite => Some(Permission::WriteJob {
            role: param("role"),
        }),
        Access::ReadAll => Some(Permission::ReadAll),
        Access::Maintenance => Some(Permission::Maintenance),
        Access::ManageTokens => Some(Permission::ManageTokens),
        Access::Override => Some(Permission::Override),
        Access::ManageQuotas => Some(Permission::ManageQuotas),
        Access::ManageRoles => Some(Permission::ManageRoles),
        Access::Agent => Some(Permission::Agent {
            agent_id: param("id"),
        }),
    }
}

/// Checks `who` against `access`; the 403 if it fails.
fn check(who: &Principal, access: Access, params: &[(String, String)]) -> Result<(), ApiErr> {
    let is_agent = matches!(who.grant, Grant::Agent { .. });
    // A discovery token reads services and nothing else.
    let discovery = who.grant == Grant::Discovery;
    match access {
        Access::AgentRegister if !is_agent => Err(ApiErr::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "token {} ({}) lacks the permission agent:register (an agent token; an admin creates one with `drover token create --role agent`)",
                who.token_id,
                who.grant.describe()
            ),
            Some("permission"),
        )),
        Access::JobList | Access::JobCreate | Access::TaskRead if is_agent || discovery => {
            Err(forbidden(who, &Permission::ReadAll))
        }
        Access::ServiceList if is_agent => Err(forbidden(who, &Permission::ReadAll)),
        _ => {
            let param = |name: &str| {
                params
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            match permission_of(access, param) {
                Some(p) => require(who, &p),
                None => Ok(()),
            }
        }
    }
}

/// With TLS, the agent API is for agents' client certificates only: the path's
/// agent id must be the certificate's (`<id>.agent.drover`), and not forbidden.
/// Registration checks the body's id in its handler.
async fn agent_by_cert(
    api: &Api,
    access: Option<Access>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(cert) = request.extensions().get::<PeerCert>().cloned() else {
        return unauthorized(&AuthError::NoCertificate);
    };
    let mut agent_id = None;
    if access == Some(Access::Agent) {
        let id = match request.extract_parts::<RawPathParams>().await {
            Ok(raw) => raw
                .iter()
                .find(|(k, _)| *k == "id")
                .map(|(_, v)| v.to_string())
                .unwrap_or_default(),
            Err(e) => return e.into_response(),
        };
        if !cert.is_agent(&id) || api.tokens.is_forbidden(&id) {
            tracing::warn!(agent_id = %id, uri = %request.uri(), "refused an agent request: the client certificate is not this agent's, or the agent is forbidden");
            let who = Principal {
                token_id: "certificate".to_string(),
                grant: Grant::Agent { agent_id: None },
            };
            return forbidden(&who, &Permission::Agent { agent_id: id }).into_response();
        }
        agent_id = Some(id);
    }
    request.extensions_mut().insert(Principal {
        token_id: "certificate".to_string(),
        grant: Grant::Agent { agent_id },
    });
    next.run(request).await
}

/// The middleware: authenticate, authorize by the route's `Access`, run the
/// handler, audit what changed.
pub async fn guard(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    let api = &gate.api;
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    let method = request.method().clone();
    let def = gate
        .routes
        .iter()
        .find(|d| d.path == path && d.method == method.as_str())
        .copied();
    let access = def.map(|d| d.access);
    if access == Some(Access::Public) {
        return next.run(request).await;
    }
    if api.agent_certs && matches!(access, Some(Access::Agent | Access::AgentRegister)) {
        return agent_by_cert(api, access, request, next).await;
    }
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let who = match api.tokens.authenticate(header) {
        Ok(who) => who,
        Err(e) => return unauthorized(&e),
    };
    let params: Vec<(String, String)> = match request.extract_parts::<RawPathParams>().await {
        Ok(raw) => raw
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        Err(e) => return e.into_response(),
    };
    let audited = method != Method::GET && access != Some(Access::Agent);
    if let Some(access) = access {
        if let Err(e) = check(&who, access, &params) {
            if matches!(who.grant, Grant::Agent { .. }) {
                tracing::warn!(token = %who.token_id, grant = %who.grant.describe(), %method, uri = %request.uri(), "refused an agent request for another agent");
            }
            let response = e.into_response();
            if audited {
                let status = response.status().as_u16();
                api.audit
                    .record(&who, method.as_str(), request.uri().path(), status);
            }
            return response;
        }
    }
    if !matches!(who.grant, Grant::Agent { .. }) && !api.limiter.allow(&who.token_id) {
        let mut response = ApiErr::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            format!(
                "token {} sent more than {} requests per second; slow down",
                who.token_id,
                crate::ratelimit::ADMIN_RATE_PER_SEC
            ),
            None,
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    let uri = request.uri().path().to_string();
    request.extensions_mut().insert(who.clone());
    let response = next.run(request).await;
    if audited {
        api.audit
            .record(&who, method.as_str(), &uri, response.status().as_u16());
    }
    response
}
