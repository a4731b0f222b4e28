//! A task's log, read through the master from its agent's log server (the key or,
//! over TLS, the master's certificate is the credential; the agent's certificate is
//! checked before its answer is relayed).

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use drover_common::wire::{ApiErrorBody, LOG_SIZE_HEADER};

use super::api::Shared;
use super::body::query_u64;
use super::error::ApiErr;
use super::guard::require;
use super::params;
use crate::auth::{Permission, Principal};

/// How long the master waits for an agent's log server.
const LOG_PROXY_TIMEOUT: Duration = Duration::from_secs(30);

/// GET /v1/tasks/{id}/logs/{process}/{stream}?offset=N: the task's log, read from
/// its agent's log server with the key the agent gave at registration (the log
/// server answers nobody else). Status, body and `x-drover-log-size` are passed on.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/logs/{process}/{stream}",
    tag = "tasks",
    params(params::LogPath, params::LogQuery),
    responses(
        (status = 200, description = "Up to 4 MiB of the log from `offset`, as the agent sent it.", content_type = "application/octet-stream", body = String, headers(("x-drover-log-size" = u64, description = "The log file's size in bytes."))),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn task_log(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path((id, process, stream)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let view = api
        .master
        .read(|c| c.task_view(&id))
        .ok_or_else(|| ApiErr::not_found(&format!("task {id}"), "task_id"))?;
    let role = view.job.split('/').next().unwrap_or_default().to_string();
    require(&who, &Permission::ReadJob { role })?;
    for (field, value) in [("process", &process), ("stream", &stream)] {
        if !drover_common::spec::is_valid_name(value) {
            return Err(ApiErr::new(
                StatusCode::BAD_REQUEST,
                "invalid_name",
                format!("`{value}` is not a valid {field}"),
                Some(field),
            ));
        }
    }
    let offset = query_u64(&q, "offset")?.unwrap_or(0);
    let agent_id = view.agent_id.clone().ok_or_else(|| {
        ApiErr::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "task {id} is {} and not placed on an agent: no logs yet",
                view.state
            ),
            Some("task_id"),
        )
    })?;
    let address = api
        .master
        .read(|c| {
            c.agent_views()
                .into_iter()
                .find(|a| a.agent_id == agent_id)
                .map(|a| a.address)
        })
        .ok_or_else(|| ApiErr::not_found(&format!("agent {agent_id}"), "agent_id"))?;
    let unreachable = |message: String| {
        ApiErr::new(
            StatusCode::BAD_GATEWAY,
            "agent_unreachable",
            message,
            Some("agent_id"),
        )
    };
    let url = format!(
        "{}/v1/tasks/{id}/logs/{process}/{stream}?offset={offset}",
        address.trim_end_matches('/')
    );
    let mut request = api.http.get(&url).timeout(LOG_PROXY_TIMEOUT);
    // Over TLS the master's certificate is its credential (crate::tls::log_client).
    let tls = address.starts_with("https://");
    if let Some(key) = api.tokens.log_key(&agent_id).filter(|_| !tls) {
        request = request.bearer_auth(key);
    }
    let answer = request.send().await.map_err(|e| {
        let hint = if tls && !api.agent_certs {
            " (the agent serves TLS: a master reads it with tls_cert, tls_key and tls_client_ca set)"
        } else {
            ""
        };
        let cause = super::error::with_causes(&e);
        unreachable(format!(
            "cannot read the log from agent {agent_id} at {address}: {cause}{hint}"
        ))
    })?;
    if tls && !crate::tls::answered_by(&answer, &agent_id) {
        return Err(unreachable(format!(
            "the log server at {address} did not present agent {agent_id}'s certificate ({agent_id}.{}); its answer is not relayed",
            crate::tls::AGENT_NAME_SUFFIX
        )));
    }
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let size = answer.headers().get(LOG_SIZE_HEADER).cloned();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| unreachable(format!("reading the log from agent {agent_id}: {e}")))?;
    let mut response = (status, bytes).into_response();
    if let Some(size) = size {
        response.headers_mut().insert(LOG_SIZE_HEADER, size);
    }
    // The agent's JSON errors stay JSON; a log is bytes.
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    Ok(response)
}
