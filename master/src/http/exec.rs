//! `GET /v1/jobs/{role}/{env}/{name}/instances/{instance}/exec`: `drover task exec`.
//! Authorized as `jobs:write` for the role (the route table), the instance's current
//! task must be RUNNING; the master then opens the same upgrade on the task's agent
//! (`GET /v1/tasks/{task_id}/exec` on its log server, over mTLS when the agent serves
//! TLS), and once the agent switched protocols, answers the caller's upgrade and
//! splices the two streams. An agent's refusal (its JSON error) is passed on. Every
//! attempt that passed authorization is in the audit log with its command line.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use drover_common::state::TaskState;
use drover_common::wire::{ApiErrorBody, ExecQuery, EXEC_PROTOCOL};

use super::api::Shared;
use super::body::key_of;
use super::error::ApiErr;
use crate::auth::Principal;

/// How long the master waits for the agent to switch protocols.
const AGENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs a command in the instance's running task (docs/api.md, "Exec").
#[utoipa::path(
    get,
    path = "/v1/jobs/{role}/{env}/{name}/instances/{instance}/exec",
    tag = "tasks",
    params(
        ("role" = String, Path, description = "The job's role."),
        ("env" = String, Path, description = "The job's environment."),
        ("name" = String, Path, description = "The job's name."),
        ("instance" = u32, Path, description = "The instance."),
        ExecQuery,
    ),
    responses(
        (status = 101, description = "Switched to the `drover-exec` protocol (`Upgrade: drover-exec`): frames both ways, the command's exit status last (docs/api.md, \"Exec\")."),
        (status = 409, description = "The instance's task is not RUNNING (the message names its state), or the process named is not running.", body = ApiErrorBody),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn exec_task(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path((role, env, name, instance)): Path<(String, String, String, String)>,
    q: Result<Query<ExecQuery>, QueryRejection>,
    mut request: Request,
) -> Result<Response, ApiErr> {
    let path = request.uri().path().to_string();
    let Query(q) = q.map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_command",
            format!("{e}: exec takes command=[\"CMD\",\"ARG\",...] (a JSON array) and optionally process, tty, stdin, rows, cols"),
            Some("command"),
        )
    })?;
    let argv = q.argv().map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_command",
            e,
            Some("command"),
        )
    })?;
    let audit = |status: u16| {
        api.audit
            .record_command(&who, "GET", &path, status, Some(&argv));
    };
    let result = forward(&api, &role, &env, &name, &instance, &q, &mut request).await;
    let (agent_upgrade, agent_id) = match result {
        Ok(pair) => pair,
        Err(e) => {
            let response = e.into_response();
            audit(response.status().as_u16());
            return Ok(response);
        }
    };
    audit(StatusCode::SWITCHING_PROTOCOLS.as_u16());
    tracing::info!(token = %who.token_id, %agent_id, ?argv, "exec");
    let client_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(client) = client_upgrade.await else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut agent = agent_upgrade;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut agent).await;
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response
        .headers_mut()
        .insert(header::UPGRADE, HeaderValue::from_static(EXEC_PROTOCOL));
    Ok(response)
}

/// Checks the task and opens the upgrade on its agent: the agent's stream and id.
async fn forward(
    api: &Shared,
    role: &str,
    env: &str,
    name: &str,
    instance: &str,
    q: &ExecQuery,
    request: &mut Request,
) -> Result<(reqwest::Upgraded, String), ApiErr> {
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok());
    if upgrade != Some(EXEC_PROTOCOL) {
        return Err(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "upgrade_required",
            format!("exec needs an HTTP/1.1 upgrade: `Connection: upgrade`, `Upgrade: {EXEC_PROTOCOL}` (use `drover task exec`)"),
            None,
        ));
    }
    let key = key_of(role, env, name);
    let index: u32 = instance.parse().map_err(|_| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_instance",
            format!("`{instance}` is not an instance number"),
            Some("instance"),
        )
    })?;
    // Just that instance: a job of 10,000 instances is not viewed whole.
    let one = crate::core::InstancePage {
        after: index.checked_sub(1),
        limit: Some(1),
        state: None,
    };
    let view = api
        .master
        .read(|c| c.job_view_page(&key, &one))
        .ok_or_else(|| {
            ApiErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no job {key}"),
                Some("job"),
            )
        })?;
    let task = view
        .instances
        .first()
        .filter(|i| i.instance == index)
        .and_then(|i| i.current.clone())
        .ok_or_else(|| {
            ApiErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("job {key} has no instance {index} with a task"),
                Some("instance"),
            )
        })?;
    if task.state != TaskState::Running {
        return Err(ApiErr::new(
            StatusCode::CONFLICT,
            "task_not_running",
            format!(
                "task {} ({key}/{index}) is {}, not RUNNING: exec needs a running task",
                task.task_id, task.state
            ),
            Some("instance"),
        ));
    }
    let agent_id = task.agent_id.clone().unwrap_or_default();
    let address = api
        .master
        .read(|c| {
            c.agent_views()
                .into_iter()
                .find(|a| a.agent_id == agent_id)
                .map(|a| a.address)
        })
        .ok_or_else(|| {
            ApiErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no agent {agent_id}"),
                Some("agent_id"),
            )
        })?;
    let unreachable = |message: String| {
        ApiErr::new(
            StatusCode::BAD_GATEWAY,
            "agent_unreachable",
            message,
            Some("agent_id"),
        )
    };
    let query = exec_query(q);
    let url = format!(
        "{}/v1/tasks/{}/exec?{query}",
        address.trim_end_matches('/'),
        task.task_id
    );
    let mut forwarded = api
        .http
        .get(&url)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, EXEC_PROTOCOL)
        .timeout(AGENT_TIMEOUT);
    let tls = address.starts_with("https://");
    if let Some(key) = api.tokens.log_key(&agent_id).filter(|_| !tls) {
        forwarded = forwarded.bearer_auth(key);
    }
    let answer = forwarded.send().await.map_err(|e| {
        let cause = super::error::with_causes(&e);
        unreachable(format!(
            "cannot reach agent {agent_id} at {address}: {cause}"
        ))
    })?;
    if tls && !crate::tls::answered_by(&answer, &agent_id) {
        return Err(unreachable(format!(
            "the log server at {address} did not present agent {agent_id}'s certificate ({agent_id}.{})",
            crate::tls::AGENT_NAME_SUFFIX
        )));
    }
    if answer.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let status =
            StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let text = answer.text().await.unwrap_or_default();
        let body: Option<ApiErrorBody> = serde_json::from_str(&text).ok();
        return Err(match body {
            Some(b) => ApiErr::new(
                status,
                &b.error.code,
                b.error.message,
                b.error.field.as_deref(),
            ),
            None => unreachable(format!(
                "agent {agent_id} refused the exec: HTTP {status}: {text}"
            )),
        });
    }
    let upgraded = answer
        .upgrade()
        .await
        .map_err(|e| unreachable(format!("agent {agent_id} did not switch protocols: {e}")))?;
    Ok((upgraded, agent_id))
}

/// The exec query in URL form, for the agent.
fn exec_query(q: &ExecQuery) -> String {
    let Ok(mut url) = reqwest::Url::parse("http://x/") else {
        return String::new();
    };
    {
        let mut pairs = url.query_pairs_mut();
        pairs.append_pair("command", &q.command);
        if let Some(p) = &q.process {
            pairs.append_pair("process", p);
        }
        pairs.append_pair("tty", if q.tty { "true" } else { "false" });
        pairs.append_pair("stdin", if q.stdin { "true" } else { "false" });
        if let Some(r) = q.rows {
            pairs.append_pair("rows", &r.to_string());
        }
        if let Some(c) = q.cols {
            pairs.append_pair("cols", &c.to_string());
        }
    }
    url.query().unwrap_or_default().to_string()
}
