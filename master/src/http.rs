//! The admin and agent HTTP APIs (axum), as documented in docs/api.md: bounded JSON
//! bodies, JSON errors with codes, and the agents' assignment long poll that only
//! ever serves committed placements.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use drover_common::parse::parse_job_json;
use drover_common::wire::{
    self, ApiError, ApiErrorBody, FieldError, HeartbeatRequest, InstancesRequest, RegisterRequest,
    StatusUpdateBatch,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::{CoreError, Event, Reply, UpdateAction};
use crate::runtime::{ApplyError, Master};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Largest accepted body on the agent API (full task sets and update batches of big
/// agents).
pub const MAX_AGENT_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Deepest accepted JSON nesting.
pub const MAX_JSON_DEPTH: usize = 64;
/// Default and largest long-poll wait.
const DEFAULT_WAIT_MS: u64 = 30_000;
const MAX_WAIT_MS: u64 = 120_000;

type Shared = Arc<Master>;

/// An API error response.
#[derive(Debug)]
pub struct ApiErr {
    status: StatusCode,
    body: ApiErrorBody,
}

impl ApiErr {
    fn new(
        status: StatusCode,
        code: &str,
        message: impl Into<String>,
        field: Option<&str>,
    ) -> ApiErr {
        ApiErr {
            status,
            body: ApiErrorBody {
                error: ApiError {
                    code: code.to_string(),
                    message: message.into(),
                    field: field.map(str::to_string),
                    details: Vec::new(),
                },
            },
        }
    }

    fn not_found(what: &str, field: &str) -> ApiErr {
        ApiErr::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what}"),
            Some(field),
        )
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<ApplyError> for ApiErr {
    fn from(e: ApplyError) -> ApiErr {
        match e {
            ApplyError::StoreFailed => ApiErr::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_failed",
                e.to_string(),
                None,
            ),
            ApplyError::Core(c) => c.into(),
        }
    }
}

impl From<CoreError> for ApiErr {
    fn from(e: CoreError) -> ApiErr {
        let msg = e.to_string();
        match e {
            CoreError::JobExists(_) => {
                ApiErr::new(StatusCode::CONFLICT, "job_exists", msg, Some("name"))
            }
            CoreError::NoJob(_) => {
                ApiErr::new(StatusCode::NOT_FOUND, "not_found", msg, Some("job"))
            }
            CoreError::BadInstances { .. } => ApiErr::new(
                StatusCode::BAD_REQUEST,
                "invalid_instances",
                msg,
                Some("instances"),
            ),
            CoreError::UnknownAgent(_) => {
                ApiErr::new(StatusCode::NOT_FOUND, "not_found", msg, Some("agent_id"))
            }
            CoreError::Protocol { .. } => ApiErr::new(
                StatusCode::BAD_REQUEST,
                "unsupported_protocol",
                msg,
                Some("protocol_version"),
            ),
            CoreError::BadConstraint { ref attribute, .. } => {
                let field = format!("constraints.{attribute}");
                ApiErr::new(StatusCode::BAD_REQUEST, "invalid_spec", msg, Some(&field))
            }
            CoreError::UpdateRunning { .. } => {
                ApiErr::new(StatusCode::CONFLICT, "update_running", msg, Some("job"))
            }
            CoreError::NoActiveUpdate(_) => {
                ApiErr::new(StatusCode::CONFLICT, "no_active_update", msg, Some("job"))
            }
            CoreError::BadUpdate { .. } => {
                ApiErr::new(StatusCode::BAD_REQUEST, "invalid_update", msg, None)
            }
        }
    }
}

/// Every route of the master.
pub fn router(master: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/health", get(|| async { "ok" }))
        .route("/v1/jobs", post(create_job).get(list_jobs))
        .route("/v1/jobs/:role/:env/:name", get(get_job))
        .route("/v1/jobs/:role/:env/:name/kill", post(kill_job))
        .route("/v1/jobs/:role/:env/:name/restart", post(restart_job))
        .route(
            "/v1/jobs/:role/:env/:name/update",
            post(start_update).get(get_update),
        )
        .route(
            "/v1/jobs/:role/:env/:name/update/:action",
            post(update_action),
        )
        .route("/v1/tasks/:id", get(get_task))
        .route("/v1/agents", get(list_agents))
        .route("/v1/agents/register", post(register))
        .route("/v1/agents/:id/heartbeat", post(heartbeat))
        .route("/v1/agents/:id/assignments", get(assignments))
        .route("/v1/agents/:id/updates", post(updates))
        .fallback(|| async {
            ApiErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such path; see docs/api.md for the API",
                None,
            )
        })
        .with_state(master)
}

/// Reads a bounded body as text, rejecting deep nesting.
async fn read_body(body: Body, limit: usize) -> Result<String, ApiErr> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiErr::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than {limit} bytes; send less at once"),
            None,
        )
    })?;
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body is not UTF-8",
            None,
        )
    })?;
    check_depth(&text)?;
    Ok(text)
}

/// Rejects JSON nested deeper than `MAX_JSON_DEPTH`.
pub fn check_depth(text: &str) -> Result<(), ApiErr> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(ApiErr::new(
                        StatusCode::BAD_REQUEST,
                        "too_deep",
                        format!("the JSON nests deeper than {MAX_JSON_DEPTH} levels; flatten it"),
                        None,
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

async fn read_json<T: DeserializeOwned>(body: Body) -> Result<T, ApiErr> {
    let text = read_body(body, MAX_AGENT_BODY_BYTES).await?;
    serde_json::from_str(&text).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not the expected JSON: {e}"),
            None,
        )
    })
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (status, Json(value)).into_response()
}

async fn create_job(State(m): State<Shared>, body: Body) -> Result<Response, ApiErr> {
    let text = read_body(body, MAX_BODY_BYTES).await?;
    let spec = parse_spec(&text)?;
    match m.apply(Event::CreateJob(Box::new(spec))).await? {
        Reply::JobCreated { job, tasks } => Ok(json(
            StatusCode::CREATED,
            &serde_json::json!({ "job": job, "tasks": tasks }),
        )),
        other => Err(unexpected(other)),
    }
}

/// Parses and validates a job spec (all errors at once, the first one's field).
fn parse_spec(text: &str) -> Result<drover_common::JobSpec, ApiErr> {
    parse_job_json(text).map_err(|errs| {
        let first = errs.errors.first().cloned().unwrap_or(FieldError {
            field: String::new(),
            message: "invalid job spec".to_string(),
        });
        ApiErr {
            status: StatusCode::BAD_REQUEST,
            body: ApiErrorBody {
                error: ApiError {
                    code: "invalid_spec".to_string(),
                    message: errs.to_string(),
                    field: (!first.field.is_empty()).then_some(first.field),
                    details: errs.errors,
                },
            },
        }
    })
}

/// POST /v1/jobs/{key}/update: an `UpdateRequest`, read field by field so the spec
/// is validated like POST /v1/jobs (all errors, with paths).
async fn start_update(
    State(m): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiErr> {
    let text = read_body(body, MAX_BODY_BYTES).await?;
    let raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not {{\"spec\": {{...}}, \"instances\": \"0-3\"}}: {e}"),
            None,
        )
    })?;
    let spec_text = raw.get("spec").map(|s| s.to_string()).ok_or_else(|| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body has no `spec`: send {\"spec\": JOB_SPEC}",
            Some("spec"),
        )
    })?;
    let spec = parse_spec(&spec_text)?;
    let text_field = |name: &str| raw.get(name).and_then(|v| v.as_str()).map(str::to_string);
    let instances = match text_field("instances") {
        None => None,
        Some(text) => Some(wire::parse_instance_set(&text).map_err(|e| {
            ApiErr::new(
                StatusCode::BAD_REQUEST,
                "invalid_instances",
                e,
                Some("instances"),
            )
        })?),
    };
    let event = Event::StartUpdate {
        job: key_of(&role, &env, &name),
        spec: Box::new(spec),
        instances,
        user: text_field("user").unwrap_or_else(|| "unknown".to_string()),
    };
    match m.apply(event).await? {
        Reply::Update(view) => Ok(json(StatusCode::CREATED, &view)),
        other => Err(unexpected(other)),
    }
}

/// GET /v1/jobs/{key}/update: the job's latest update.
async fn get_update(
    State(m): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let key = key_of(&role, &env, &name);
    m.read(|c| c.update_view(&key))
        .map(|v| json(StatusCode::OK, &v))
        .ok_or_else(|| ApiErr::not_found(&format!("update of job {key}"), "job"))
}

/// POST /v1/jobs/{key}/update/{pause,resume,abort,rollback}.
async fn update_action(
    State(m): State<Shared>,
    Path((role, env, name, action)): Path<(String, String, String, String)>,
) -> Result<Response, ApiErr> {
    let action = match action.as_str() {
        "pause" => UpdateAction::Pause,
        "resume" => UpdateAction::Resume,
        "abort" => UpdateAction::Abort,
        "rollback" => UpdateAction::Rollback,
        other => {
            return Err(ApiErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no update action `{other}`: pause, resume, abort or rollback"),
                Some("action"),
            ))
        }
    };
    let job = key_of(&role, &env, &name);
    match m.apply(Event::UpdateAction { job, action }).await? {
        Reply::Update(view) => Ok(json(StatusCode::OK, &view)),
        other => Err(unexpected(other)),
    }
}

/// 200 with the body of a reply that carries one; a reply without one is a bug.
fn ok_reply(reply: Reply) -> Result<Response, ApiErr> {
    match reply {
        Reply::Action(a) => Ok(json(StatusCode::OK, &a)),
        Reply::Registered(r) => Ok(json(StatusCode::OK, &r)),
        Reply::Heartbeat(r) => Ok(json(StatusCode::OK, &r)),
        Reply::Ack(a) => Ok(json(StatusCode::OK, &a)),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Reply) -> ApiErr {
    ApiErr::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("unexpected core reply {reply:?}; this is a bug"),
        None,
    )
}

async fn list_jobs(State(m): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Response {
    let role = q.get("role").map(String::as_str);
    json(StatusCode::OK, &m.read(|c| c.job_summaries(role)))
}

fn key_of(role: &str, env: &str, name: &str) -> String {
    format!("{role}/{env}/{name}")
}

async fn get_job(
    State(m): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let key = key_of(&role, &env, &name);
    m.read(|c| c.job_view(&key))
        .map(|v| json(StatusCode::OK, &v))
        .ok_or_else(|| ApiErr::not_found(&format!("job {key}"), "job"))
}

async fn instances_from(body: Body) -> Result<Option<Vec<u32>>, ApiErr> {
    let text = read_body(body, MAX_BODY_BYTES).await?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let req: Option<InstancesRequest> = serde_json::from_str(&text).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not {{\"instances\": \"0-3,7\"}}: {e}"),
            None,
        )
    })?;
    match req.and_then(|r| r.instances) {
        None => Ok(None),
        Some(text) => wire::parse_instance_set(&text).map(Some).map_err(|e| {
            ApiErr::new(
                StatusCode::BAD_REQUEST,
                "invalid_instances",
                e,
                Some("instances"),
            )
        }),
    }
}

async fn kill_job(
    State(m): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiErr> {
    let instances = instances_from(body).await?;
    let job = key_of(&role, &env, &name);
    ok_reply(m.apply(Event::Kill { job, instances }).await?)
}

async fn restart_job(
    State(m): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiErr> {
    let instances = instances_from(body).await?;
    let job = key_of(&role, &env, &name);
    ok_reply(m.apply(Event::Restart { job, instances }).await?)
}

async fn get_task(State(m): State<Shared>, Path(id): Path<String>) -> Result<Response, ApiErr> {
    m.read(|c| c.task_view(&id))
        .map(|v| json(StatusCode::OK, &v))
        .ok_or_else(|| ApiErr::not_found(&format!("task {id}"), "task_id"))
}

async fn list_agents(State(m): State<Shared>) -> Response {
    json(StatusCode::OK, &m.read(|c| c.agent_views()))
}

async fn register(State(m): State<Shared>, body: Body) -> Result<Response, ApiErr> {
    let req: RegisterRequest = read_json(body).await?;
    if !drover_common::spec::is_valid_name(&req.agent_id) {
        return Err(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "agent_id must be 1-64 of A-Z a-z 0-9 _ . -",
            Some("agent_id"),
        ));
    }
    ok_reply(m.apply(Event::Register(Box::new(req))).await?)
}

async fn heartbeat(
    State(m): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    let request: HeartbeatRequest = read_json(body).await?;
    ok_reply(m.apply(Event::Heartbeat { agent: id, request }).await?)
}

async fn updates(
    State(m): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    let batch: StatusUpdateBatch = read_json(body).await?;
    let event = Event::StatusReports {
        agent: id,
        reports: batch.updates,
    };
    ok_reply(m.apply(event).await?)
}

fn query_u64(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, ApiErr> {
    match q.get(name) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiErr::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("{name} must be a whole number, got `{v}`"),
                Some(name),
            )
        }),
    }
}

/// What an assignment long poll does next.
#[derive(Debug, PartialEq, Eq)]
enum PollStep {
    /// Answer with the current set.
    Answer,
    /// Wait for the agent's wake-up (or the deadline); with `on_commit`, also for
    /// the store's next commit.
    Wait { on_commit: bool },
}

/// Decides a long poll's next step (pure). `after` is the agent's version (None:
/// answer at once), `version`/`change_seq` the set's current version and the batch
/// that last changed it, `notified` the version of its latest change that wakes the
/// agent (tasks the agent reported ending leave the set without waking it: a poll
/// that has seen every other change waits and gets them later). Nothing is served
/// before it is committed. A change to answer that is not committed yet may never
/// wake the poll: only commits of changes that notify the agent do, and a later
/// non-notifying change may have moved `change_seq` past the notifying one; so the
/// poll then also waits for commit progress (without that it slept until `wait_ms`,
/// 30 s stalls at the end of a burst of tasks).
fn poll_step(
    after: Option<u64>,
    version: u64,
    notified: u64,
    change_seq: u64,
    committed: u64,
    timed_out: bool,
) -> PollStep {
    let changed = match after {
        Some(a) => a < notified || a > version,
        None => true,
    };
    if !(changed || timed_out) {
        PollStep::Wait { on_commit: false }
    } else if change_seq <= committed {
        PollStep::Answer
    } else {
        PollStep::Wait { on_commit: true }
    }
}

async fn assignments(
    State(m): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let after = query_u64(&q, "after_version")?;
    let wait_ms = query_u64(&q, "wait_ms")?
        .unwrap_or(DEFAULT_WAIT_MS)
        .min(MAX_WAIT_MS);
    let received = tokio::time::Instant::now();
    let deadline = received + Duration::from_millis(wait_ms);
    let mut rx = m.notifier().subscribe(&id);
    let mut commits = m.commit_state().subscribe();
    let mut stopping = m.stopping();
    loop {
        if *stopping.borrow_and_update() {
            return Err(ApiErr::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the master is stopping; poll again after it restarted",
                None,
            ));
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

async fn index(State(m): State<Shared>) -> Response {
    let (jobs, agents, updates) =
        m.read(|c| (c.job_summaries(None), c.agent_views(), c.update_views()));
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Drover</title>\
         <style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head><body>\
         <h1>Drover</h1><h2>Jobs</h2><table><tr><th>job</th><th>instances</th><th>kind</th><th>states</th></tr>",
    );
    for j in &jobs {
        let states: Vec<String> = j
            .state_counts
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        let _ = write!(
            html,
            "<tr><td><a href=\"/v1/jobs/{k}\">{k}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            j.instances,
            if j.service { "service" } else { "batch" },
            escape(&states.join(", ")),
            k = escape(&j.key),
        );
    }
    html.push_str("</table><h2>Updates</h2><table><tr><th>job</th><th>update</th><th>by</th><th>state</th><th>instances</th><th>last event</th></tr>");
    for u in &updates {
        let done = u
            .instances
            .iter()
            .filter(|p| {
                matches!(
                    p.state,
                    wire::InstanceUpdateState::Updated | wire::InstanceUpdateState::RolledBack
                )
            })
            .count();
        let _ = write!(
            html,
            "<tr><td><a href=\"/v1/jobs/{k}/update\">{k}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{done}/{} done</td><td>{}</td></tr>",
            escape(&u.id),
            escape(&u.user),
            u.state,
            u.instances.len(),
            escape(u.events.last().map_or("", |e| e.message.as_str())),
            k = escape(&u.job),
        );
    }
    html.push_str("</table><h2>Agents</h2><table><tr><th>agent</th><th>host</th><th>reachable</th><th>free cpu</th><th>free ram</th><th>tasks</th></tr>");
    for a in &agents {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{} MiB</td><td>{}</td></tr>",
            escape(&a.agent_id),
            escape(&a.hostname),
            a.reachable,
            a.free.cpu,
            a.free.ram_bytes / (1024 * 1024),
            a.tasks.len()
        );
    }
    html.push_str("</table></body></html>");
    ([(header::CACHE_CONTROL, "no-store")], Html(html)).into_response()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_with_an_uncommitted_change_to_answer_waits_for_the_commit() {
        // The agent is at version 5; version 6 (batch 10) wakes it, then a task it
        // reported ending made version 7 (batch 11) without waking it.
        let step = |committed, timed_out| poll_step(Some(5), 7, 6, 11, committed, timed_out);
        assert_eq!(step(10, false), PollStep::Wait { on_commit: true });
        assert_eq!(step(11, false), PollStep::Answer);
        assert_eq!(step(10, true), PollStep::Wait { on_commit: true });
    }

    #[test]
    fn a_poll_that_saw_every_waking_change_waits_for_the_next_or_its_deadline() {
        // At the notified version; only an ending left the set since.
        assert_eq!(
            poll_step(Some(6), 7, 6, 11, 11, false),
            PollStep::Wait { on_commit: false }
        );
        assert_eq!(poll_step(Some(6), 7, 6, 11, 11, true), PollStep::Answer);
        assert_eq!(poll_step(None, 7, 6, 11, 11, false), PollStep::Answer);
        // A version from the future (a restarted master) is answered at once.
        assert_eq!(poll_step(Some(9), 7, 6, 11, 11, false), PollStep::Answer);
    }

    #[test]
    fn nesting_beyond_the_limit_is_rejected_but_brackets_in_strings_are_not() {
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(check_depth(&deep).unwrap_err().body.error.code, "too_deep");
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(check_depth(&ok).is_ok());
        let s = format!("\"{}\"", "[".repeat(100));
        assert!(check_depth(&s).is_ok());
        assert!(check_depth(r#"{"a":"\"[[[["}"#).is_ok());
    }
}
