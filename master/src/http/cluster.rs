//! The cluster as a whole: its summary and the eviction guard, role quotas, the
//! users a role's tasks may run as, the agents and forbidding or allowing one.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use drover_common::wire::{self, ApiErrorBody};

use super::api::Shared;
use super::body::{json, ok_reply, read_json};
use super::error::ApiErr;
use super::params;
use crate::core::Event;

#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "cluster",
    responses(
        (status = 200, description = "The fleet at a glance and the eviction guard.", body = wire::ClusterView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn cluster(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.cluster_view()))
}

#[utoipa::path(
    post,
    path = "/v1/cluster/eviction-guard/release",
    tag = "cluster",
    responses(
        (status = 200, description = "The cluster after the release.", body = wire::ClusterView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn release_guard(State(api): State<Shared>) -> Result<Response, ApiErr> {
    ok_reply(api.master.apply(Event::ReleaseEvictionGuard).await?)
}

#[utoipa::path(
    get,
    path = "/v1/quotas",
    tag = "quotas",
    responses(
        (status = 200, description = "Every role with a quota or a production job.", body = Vec<wire::QuotaView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list_quotas(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.quota_views()))
}

#[utoipa::path(
    get,
    path = "/v1/quotas/{role}",
    tag = "quotas",
    params(params::RolePath),
    responses(
        (status = 200, description = "The role's quota and use.", body = wire::QuotaView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn get_quota(State(api): State<Shared>, Path(role): Path<String>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.quota_view(&role)))
}

#[utoipa::path(
    post,
    path = "/v1/quotas/{role}",
    tag = "quotas",
    params(params::RolePath),
    request_body = wire::SetQuotaRequest,
    responses(
        (status = 200, description = "The role's quota now.", body = wire::QuotaView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn set_quota(
    State(api): State<Shared>,
    Path(role): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    if !drover_common::spec::is_valid_name(&role) {
        return Err(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            format!("`{role}` is not a role name (1-64 of A-Z a-z 0-9 _ . -)"),
            Some("role"),
        ));
    }
    let req: wire::SetQuotaRequest = read_json(body).await?;
    let quota = drover_common::validate::quota_request(&req).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_quota",
            e.message,
            Some(&e.field),
        )
    })?;
    let quota = quota.map(|q| crate::core::Usage::from_wire(&q));
    ok_reply(api.master.apply(Event::SetQuota { role, quota }).await?)
}

#[utoipa::path(
    get,
    path = "/v1/roles/{role}",
    tag = "roles",
    params(params::RolePath),
    responses(
        (status = 200, description = "The users the role's tasks may run as, and its jobs running as a user no longer granted.", body = wire::RoleView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn get_role(State(api): State<Shared>, Path(role): Path<String>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.role_view(&role)))
}

/// The role and user of a grant or revocation, checked: both valid names, and the
/// user not the role's own (which its tasks may always run as).
pub(super) async fn role_user(role: &str, body: Body) -> Result<String, ApiErr> {
    let bad = |field: &str, message: String| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            message,
            Some(field),
        )
    };
    if !drover_common::spec::is_valid_name(role) {
        return Err(bad(
            "role",
            format!("`{role}` is not a role name (1-64 of A-Z a-z 0-9 _ . -)"),
        ));
    }
    let req: wire::RoleUserRequest = read_json(body).await?;
    if !drover_common::spec::is_valid_name(&req.user) {
        return Err(bad(
            "user",
            format!(
                "`{}` is not a user name (1-64 of A-Z a-z 0-9 _ . -), e.g. backup",
                req.user
            ),
        ));
    }
    if req.user == role {
        return Err(bad(
            "user",
            format!("`{role}` is role {role}'s own user: its tasks may always run as it"),
        ));
    }
    Ok(req.user)
}

/// Grants (`granted`) or revokes the user named in `body` for `role`.
pub(super) async fn set_user_grant(
    api: Shared,
    role: String,
    body: Body,
    granted: bool,
) -> Result<Response, ApiErr> {
    let user = role_user(&role, body).await?;
    let event = Event::SetUserGrant {
        role,
        user,
        granted,
    };
    ok_reply(api.master.apply(event).await?)
}

/// Lets the role's tasks run as another user (`task.user`).
#[utoipa::path(
    post,
    path = "/v1/roles/{role}/grant-user",
    tag = "roles",
    params(params::RolePath),
    request_body = wire::RoleUserRequest,
    responses(
        (status = 200, description = "The role's users now (granting a user twice changes nothing).", body = wire::RoleView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn grant_user(
    State(api): State<Shared>,
    Path(role): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    set_user_grant(api, role, body, true).await
}

/// Takes a user back from the role: its jobs running as it run on, flagged, and
/// their next update, restart or rollback is refused.
#[utoipa::path(
    post,
    path = "/v1/roles/{role}/revoke-user",
    tag = "roles",
    params(params::RolePath),
    request_body = wire::RoleUserRequest,
    responses(
        (status = 200, description = "The role's users now, with the jobs flagged (revoking a user not granted changes nothing).", body = wire::RoleView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn revoke_user(
    State(api): State<Shared>,
    Path(role): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    set_user_grant(api, role, body, false).await
}

#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "agents",
    responses(
        (status = 200, description = "Every agent, sorted by id.", body = Vec<wire::AgentView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list_agents(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.agent_views()))
}

#[utoipa::path(
    post,
    path = "/v1/agents/{id}/forbid",
    tag = "agents",
    params(params::AgentPath),
    responses(
        (status = 200, description = "The agent id is refused from now on.", body = wire::AgentAccessResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn forbid_agent(
    State(api): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    let revoked_tokens = api
        .tokens
        .forbid_agent(&id, drover_common::state::now_ms())?;
    tracing::warn!(agent_id = %id, ?revoked_tokens, "agent forbidden: its requests are refused from now on");
    Ok(json(
        StatusCode::OK,
        &wire::AgentAccessResponse {
            agent_id: id,
            forbidden: true,
            revoked_tokens,
        },
    ))
}

#[utoipa::path(
    post,
    path = "/v1/agents/{id}/allow",
    tag = "agents",
    params(params::AgentPath),
    responses(
        (status = 200, description = "The agent id may register again.", body = wire::AgentAccessResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn allow_agent(
    State(api): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    api.tokens.allow_agent(&id)?;
    Ok(json(
        StatusCode::OK,
        &wire::AgentAccessResponse {
            agent_id: id,
            forbidden: false,
            revoked_tokens: Vec::new(),
        },
    ))
}
