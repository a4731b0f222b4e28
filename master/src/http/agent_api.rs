//! The agents' API: registration, heartbeats, status batches, the self-drain at
//! host shutdown, and the assignment long poll that only serves committed sets.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use drover_common::wire::{
    self, ApiErrorBody, HeartbeatRequest, RegisterRequest, SelfDrainRequest, StatusUpdateBatch,
};

use super::api::Shared;
use super::body::{json, ok_reply, query_u64, read_json, DEFAULT_WAIT_MS, MAX_WAIT_MS};
use super::error::{shutting_down, ApiErr};
use super::hosts::maintain;
use super::params;
use crate::auth::{may_register_as, AgentProof, Principal};
use crate::core::{poll_step, Event, MaintenanceOp, PollStep};
use crate::runtime::ApplyError;
use crate::tokens::TokenError;

#[utoipa::path(
    post,
    path = "/v1/agents/register",
    tag = "agent API",
    request_body = RegisterRequest,
    responses(
        (status = 200, description = "Registered.", body = wire::RegisterResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn register(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    cert: Option<Extension<crate::tls::PeerCert>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, ApiErr> {
    let mut req: RegisterRequest = read_json(body).await?;
    super::services::resolve_agent_ip(&mut req).await;
    if !drover_common::spec::is_valid_name(&req.agent_id) {
        return Err(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "agent_id must be 1-64 of A-Z a-z 0-9 _ . -, not starting with -",
            Some("agent_id"),
        ));
    }
    let bound = match cert {
        Some(Extension(cert)) => {
            let proof = AgentProof::Certificate {
                names_agent: cert.is_agent(&req.agent_id),
            };
            let forbidden = api.tokens.is_forbidden(&req.agent_id);
            may_register_as(&req.agent_id, proof, forbidden)
                .map(|_| ())
                .map_err(|refused| TokenError::registration(refused, &req.agent_id))
        }
        None => api.tokens.bind_agent(&who, &req.agent_id),
    };
    if let Err(e) = bound {
        tracing::warn!(token = %who.token_id, grant = %who.grant.describe(), agent_id = %req.agent_id, error = %e, "refused an agent registration");
        return Err(e.into());
    }
    if let Some(key) = headers
        .get(wire::LOGS_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|k| k.len() <= 128 && k.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        api.tokens.set_log_key(&req.agent_id, key)?;
    }
    ok_reply(api.master.apply(Event::Register(Box::new(req))).await?)
}

#[utoipa::path(
    post,
    path = "/v1/agents/{id}/heartbeat",
    tag = "agent API",
    params(params::AgentPath),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "What the agent should do next.", body = wire::HeartbeatResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn heartbeat(
    State(api): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    let request: HeartbeatRequest = read_json(body).await?;
    ok_reply(
        api.master
            .apply(Event::Heartbeat { agent: id, request })
            .await?,
    )
}

#[utoipa::path(
    post,
    path = "/v1/agents/{id}/updates",
    tag = "agent API",
    params(params::AgentPath),
    request_body = StatusUpdateBatch,
    responses(
        (status = 200, description = "What was committed.", body = wire::StatusAck),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn updates(
    State(api): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    let batch: StatusUpdateBatch = read_json(body).await?;
    crate::metrics::METRICS
        .update_batch
        .observe(batch.updates.len() as f64);
    let event = Event::StatusReports {
        agent: id,
        reports: batch.updates,
    };
    ok_reply(api.master.apply(event).await?)
}

/// The agent's host is shutting down: drain it.
#[utoipa::path(
    post,
    path = "/v1/agents/{id}/drain",
    tag = "agent API",
    params(params::AgentPath),
    request_body = SelfDrainRequest,
    responses(
        (status = 200, description = "The agent's host after the change.", body = Vec<wire::HostView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn agent_drain(
    State(api): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    let req: SelfDrainRequest = read_json(body).await?;
    if api.master.read(|c| c.agent_version(&id).is_none()) {
        return Err(ApiErr::not_found(
            &format!("agent {id}: register first"),
            "agent_id",
        ));
    }
    let op = MaintenanceOp::Drain {
        deadline_ms: req.deadline_ms,
    };
    maintain(&api.master, op, vec![id]).await
}

#[utoipa::path(
    get,
    path = "/v1/agents/{id}/assignments",
    tag = "agent API",
    params(params::AgentPath, params::AssignmentsQuery),
    responses(
        (status = 200, description = "The tasks the agent should hold.", content_type = "application/json", body = wire::AssignmentSet, headers(("x-drover-held-ms" = u64, description = "How long the master held the poll."))),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn assignments(
    State(api): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let after = query_u64(&q, "after_version")?;
    let wait_ms = query_u64(&q, "wait_ms")?
        .unwrap_or(DEFAULT_WAIT_MS)
        .min(MAX_WAIT_MS);
    let m = &api.master;
    let received = tokio::time::Instant::now();
    let deadline = received + Duration::from_millis(wait_ms);
    let mut rx = m.notifier().subscribe(&id);
    let mut commits = m.commit_state().subscribe();
    let mut stopping = m.stopping();
    loop {
        if *stopping.borrow_and_update() {
            return Err(shutting_down("poll again after it restarted"));
        }
        rx.borrow_and_update();
        commits.borrow_and_update();
        let committed = m.commit_state().committed();
        let mut awaits_commit = false;
        let ready = m.read(|c| {
            let (version, change_seq) = c.agent_version(&id).ok_or_else(|| {
                ApiErr::not_found(&format!("agent {id}: register first"), "agent_id")
            })?;
            let notified = c.agent_notified_version(&id).unwrap_or(version);
            let timed_out = tokio::time::Instant::now() >= deadline;
            match poll_step(after, version, notified, change_seq, committed, timed_out) {
                PollStep::Answer => Ok::<_, ApiErr>(c.assignment_set(&id)),
                PollStep::Wait { on_commit } => {
                    awaits_commit = on_commit;
                    Ok(None)
                }
            }
        })?;
        if let Some(set) = ready {
            crate::metrics::METRICS
                .assignment_set
                .observe(set.assignments.len() as f64);
            // How long the poll was held, so the agent can tell an answer a
            // partition delayed (seed 000) from one that waited for a change.
            let held_ms = received.elapsed().as_millis() as u64;
            let mut response = json(StatusCode::OK, &set);
            response.headers_mut().insert(
                wire::ASSIGNMENTS_HELD_MS_HEADER,
                axum::http::HeaderValue::from(held_ms),
            );
            return Ok(response);
        }
        if m.commit_state().failed() {
            return Err(ApplyError::StoreFailed.into());
        }
        tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    return Err(ApplyError::StoreFailed.into());
                }
            }
            r = commits.changed(), if awaits_commit => {
                if r.is_err() {
                    return Err(ApplyError::StoreFailed.into());
                }
            }
            _ = tokio::time::sleep_until(deadline), if tokio::time::Instant::now() < deadline => {}
            _ = stopping.changed() => {}
        }
    }
}
