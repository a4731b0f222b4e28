//! The admin and agent HTTP APIs (axum), as documented in docs/api.md: one route
//! table with the access each route needs (checked by `guard` before any handler
//! runs), bounded JSON bodies, JSON errors with codes, and the agents' assignment
//! long poll that only ever serves committed placements.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Json, Router};
use drover_common::parse::parse_job_json_with;
use drover_common::wire::{
    self, ApiError, ApiErrorBody, FieldError, HeartbeatRequest, HostsRequest, InstancesRequest,
    RegisterRequest, SelfDrainRequest, StatusUpdateBatch,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::audit::Audit;
use crate::auth::{Grant, Permission, Principal};
use crate::core::{ChangeFilter, CoreError, Event, MaintenanceOp, Reply, UpdateAction};
use crate::runtime::{ApplyError, Master};
use crate::tokens::{TokenError, TokenInfo, Tokens};

pub mod openapi;
mod services;

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

/// What every handler shares: the master, the token registry and the audit log.
pub struct Api {
    pub master: Arc<Master>,
    pub tokens: Arc<Tokens>,
    pub audit: Audit,
    /// The listener is TLS with the cluster CA: the agent API takes agents'
    /// client certificates only (no tokens).
    pub agent_certs: bool,
    /// The client of the agents' log servers.
    pub http: reqwest::Client,
    /// The admin API's per-token request rate bound.
    pub limiter: crate::ratelimit::RateLimiter,
}

type Shared = Arc<Api>;

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
    /// A token that may read the services of the path's `:role` (a discovery
    /// token reads every role's).
    ServiceRead,
    /// Any admin, operator, role or discovery token; the list is filtered to
    /// what it may read.
    ServiceList,
    /// A token that may read jobs of the task's role.
    TaskRead,
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

const fn route(method: &'static str, path: &'static str, access: Access) -> RouteDef {
    RouteDef {
        method,
        path,
        access,
    }
}

/// Every route of the master with the handler serving it. `router` is built from
/// this table only, so a route cannot exist without its access rule.
fn routes() -> Vec<(RouteDef, MethodRouter<Shared>)> {
    use Access::*;
    vec![
        // The web UI's files (master/src/ui.rs): no data, so no token; the pages
        // read the API with the user's token.
        (route("GET", "/", Public), get(crate::ui::root)),
        (route("GET", "/ui", Public), get(crate::ui::ui)),
        (route("GET", "/ui/", Public), get(crate::ui::ui_slash)),
        (route("GET", "/ui/*path", Public), get(crate::ui::path)),
        (route("GET", "/health", Public), get(health)),
        (route("GET", "/v1/openapi.json", Public), get(openapi_json)),
        (route("GET", "/metrics", ReadAll), get(metrics)),
        (route("POST", "/v1/jobs", JobCreate), post(create_job)),
        (route("GET", "/v1/jobs", JobList), get(list_jobs)),
        (
            route("GET", "/v1/jobs/:role/:env/:name", JobRead),
            get(get_job),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/kill", JobWrite),
            post(kill_job),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/restart", JobWrite),
            post(restart_job),
        ),
        // master/tests/auth.rs walks the update routes in this order: start, read,
        // pause, resume, roll back, abort (each 2xx with the right token).
        (
            route("POST", "/v1/jobs/:role/:env/:name/update", JobWrite),
            post(start_update),
        ),
        (
            route("GET", "/v1/jobs/:role/:env/:name/update", JobRead),
            get(get_update),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/update/pause", JobWrite),
            post(update_pause),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/update/resume", JobWrite),
            post(update_resume),
        ),
        (
            route(
                "POST",
                "/v1/jobs/:role/:env/:name/update/rollback",
                JobWrite,
            ),
            post(update_rollback),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/update/abort", JobWrite),
            post(update_abort),
        ),
        (route("GET", "/v1/tasks/:id", TaskRead), get(get_task)),
        (
            route("GET", "/v1/tasks/:id/logs/:process/:stream", TaskRead),
            get(task_log),
        ),
        (route("GET", "/v1/cluster", ReadAll), get(cluster)),
        (
            route("POST", "/v1/cluster/eviction-guard/release", Override),
            post(release_guard),
        ),
        (route("GET", "/v1/agents", ReadAll), get(list_agents)),
        // Any reader; a role-scoped token gets its roles' changes only (changes()).
        (route("GET", "/v1/changes", JobList), get(changes)),
        (
            route("GET", "/v1/services", ServiceList),
            get(services::list),
        ),
        (
            route("GET", "/v1/services/:role/:env/:name", ServiceRead),
            get(services::show),
        ),
        (route("GET", "/v1/hosts", ReadAll), get(list_hosts)),
        (
            route("POST", "/v1/hosts/cordon", Maintenance),
            post(cordon_hosts),
        ),
        (
            route("POST", "/v1/hosts/drain", Maintenance),
            post(drain_hosts),
        ),
        (
            route("POST", "/v1/hosts/activate", Maintenance),
            post(activate_hosts),
        ),
        (route("GET", "/v1/hosts/:host", ReadAll), get(get_host)),
        (
            route("POST", "/v1/agents/register", AgentRegister),
            post(register),
        ),
        (
            route("POST", "/v1/agents/:id/heartbeat", Agent),
            post(heartbeat),
        ),
        (
            route("GET", "/v1/agents/:id/assignments", Agent),
            get(assignments),
        ),
        (
            route("POST", "/v1/agents/:id/updates", Agent),
            post(updates),
        ),
        (
            route("POST", "/v1/agents/:id/drain", Agent),
            post(agent_drain),
        ),
        (
            route("POST", "/v1/agents/:id/forbid", Maintenance),
            post(forbid_agent),
        ),
        (
            route("POST", "/v1/agents/:id/allow", Maintenance),
            post(allow_agent),
        ),
        (route("GET", "/v1/quotas", ReadAll), get(list_quotas)),
        (route("GET", "/v1/quotas/:role", ReadAll), get(get_quota)),
        (
            route("POST", "/v1/quotas/:role", ManageQuotas),
            post(set_quota),
        ),
        (route("GET", "/v1/roles/:role", JobRead), get(get_role)),
        (
            route("POST", "/v1/roles/:role/grant-user", ManageRoles),
            post(grant_user),
        ),
        (
            route("POST", "/v1/roles/:role/revoke-user", ManageRoles),
            post(revoke_user),
        ),
        (route("GET", "/v1/cron", ReadAll), get(list_cron)),
        (
            route("POST", "/v1/cron/:role/:env/:name/start", JobWrite),
            post(cron_start),
        ),
        (
            route("POST", "/v1/cron/:role/:env/:name/deschedule", JobWrite),
            post(cron_deschedule),
        ),
        (route("GET", "/v1/tokens", ManageTokens), get(list_tokens)),
        (
            route("POST", "/v1/tokens", ManageTokens),
            post(create_token),
        ),
        (
            route("POST", "/v1/tokens/:id/revoke", ManageTokens),
            post(revoke_token),
        ),
    ]
}

/// The route table: every route's method, path and access (tests enumerate it).
pub fn route_table() -> Vec<RouteDef> {
    routes().into_iter().map(|(def, _)| def).collect()
}

/// An API error response.
#[derive(Debug)]
pub struct ApiErr {
    status: StatusCode,
    body: ApiErrorBody,
}

impl ApiErr {
    /// An error with a status, a code, a message and the field at fault.
    pub fn new(
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
            ApplyError::ReadOnly(_) => ApiErr::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "read_only",
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
            CoreError::QuotaExceeded { .. } => {
                ApiErr::new(StatusCode::FORBIDDEN, "quota_exceeded", msg, Some("quota"))
            }
            CoreError::UserNotGranted { .. } => ApiErr::new(
                StatusCode::FORBIDDEN,
                "user_not_granted",
                msg,
                Some("task.user"),
            ),
            CoreError::BadCron(ref e) => {
                ApiErr::new(StatusCode::BAD_REQUEST, "invalid_spec", msg, Some(e.field))
            }
            CoreError::NotCron(_) => {
                ApiErr::new(StatusCode::CONFLICT, "not_cron", msg, Some("job"))
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
            CoreError::NoHosts => {
                ApiErr::new(StatusCode::BAD_REQUEST, "invalid_hosts", msg, Some("hosts"))
            }
            CoreError::UnknownHosts(_) => {
                ApiErr::new(StatusCode::NOT_FOUND, "not_found", msg, Some("hosts"))
            }
            CoreError::AmbiguousHost { .. } => {
                ApiErr::new(StatusCode::CONFLICT, "ambiguous_host", msg, Some("hosts"))
            }
            CoreError::HostConflict { .. } => ApiErr::new(
                StatusCode::CONFLICT,
                "maintenance_conflict",
                msg,
                Some("hosts"),
            ),
        }
    }
}

/// Every route of the master (from `routes`), each behind `guard`.
pub fn router(api: Shared) -> Router {
    let mut router = Router::new();
    for (def, handler) in routes() {
        router = router.route(def.path, handler);
    }
    router
        .route_layer(axum::middleware::from_fn_with_state(
            api.clone(),
            crate::guard::guard,
        ))
        .fallback(|| async {
            ApiErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such path; see docs/api.md for the API",
                None,
            )
        })
        .with_state(api)
}

/// How long a client may take to send a request's body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads a bounded body as text (within `BODY_READ_TIMEOUT`), rejecting deep
/// nesting.
async fn read_body(body: Body, limit: usize) -> Result<String, ApiErr> {
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, limit));
    let bytes = read.await.map_err(|_| {
        ApiErr::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the body did not arrive within {} s",
                BODY_READ_TIMEOUT.as_secs()
            ),
            None,
        )
    })?;
    let bytes = bytes.map_err(|_| {
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

#[utoipa::path(
    post,
    path = "/v1/jobs",
    tag = "jobs",
    request_body = drover_common::JobSpec,
    responses(
        (status = 201, description = "Created and committed: the job key and its task ids in instance order.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn create_job(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    body: Body,
) -> Result<Response, ApiErr> {
    let text = read_body(body, MAX_BODY_BYTES).await?;
    let spec = parse_spec(&api, &text)?;
    crate::guard::require(
        &who,
        &Permission::WriteJob {
            role: spec.role.clone(),
        },
    )?;
    match api.master.apply(Event::CreateJob(Box::new(spec))).await? {
        Reply::JobCreated { job, tasks } => Ok(json(
            StatusCode::CREATED,
            &wire::ActionResponse { job, tasks },
        )),
        other => Err(unexpected(other)),
    }
}

/// Who started an update, for its record: the name the client gave (if any), the
/// token's id and its description (`alice (token 3f2a, bootstrap admin token)`,
/// `bootstrap admin token (token 3f2a)`).
fn started_by(name: Option<&str>, token_id: &str, description: Option<&str>) -> String {
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    let description = description.map(str::trim).filter(|d| !d.is_empty());
    match (name, description) {
        (Some(name), Some(d)) => format!("{name} (token {token_id}, {d})"),
        (Some(name), None) => format!("{name} (token {token_id})"),
        (None, Some(d)) => format!("{d} (token {token_id})"),
        (None, None) => format!("token {token_id}"),
    }
}

/// Parses and validates a job spec (all errors at once, the first one's field),
/// with the master's `cron_seconds` switch.
fn parse_spec(api: &Shared, text: &str) -> Result<drover_common::JobSpec, ApiErr> {
    let cron_seconds = api.master.read(|core| core.config().cron_seconds);
    parse_job_json_with(text, cron_seconds).map_err(|errs| {
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
#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/update",
    tag = "updates",
    params(openapi::JobPath),
    request_body = wire::UpdateRequest,
    responses(
        (status = 201, description = "The update, started.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn start_update(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
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
    let spec = parse_spec(&api, &spec_text)?;
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
    // Who asked, as the token proves it (its id and description); the name the
    // client gives is shown beside.
    let description = api
        .tokens
        .list()
        .into_iter()
        .find(|t| t.id == who.token_id)
        .map(|t| t.description);
    let user = started_by(
        text_field("user").as_deref(),
        &who.token_id,
        description.as_deref(),
    );
    let event = Event::StartUpdate {
        job: key_of(&role, &env, &name),
        spec: Box::new(spec),
        instances,
        user,
    };
    match api.master.apply(event).await? {
        Reply::Update(view) => Ok(json(StatusCode::CREATED, &view)),
        other => Err(unexpected(other)),
    }
}

/// GET /v1/jobs/{key}/update: the job's latest update.
#[utoipa::path(
    get,
    path = "/v1/jobs/{role}/{env}/{name}/update",
    tag = "updates",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The job's latest update.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn get_update(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let key = key_of(&role, &env, &name);
    api.master
        .read(|c| c.update_view(&key))
        .map(|v| json(StatusCode::OK, &v))
        .ok_or_else(|| ApiErr::not_found(&format!("update of job {key}"), "job"))
}

/// POST /v1/jobs/{key}/update/{pause,resume,abort,rollback}: one route each, so
/// the route table names every one with its access.
async fn update_action(
    api: Shared,
    (role, env, name): (String, String, String),
    action: UpdateAction,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    match api
        .master
        .apply(Event::UpdateAction { job, action })
        .await?
    {
        Reply::Update(view) => Ok(json(StatusCode::OK, &view)),
        other => Err(unexpected(other)),
    }
}

/// Pauses the running update: no new batch starts.
#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/update/pause",
    tag = "updates",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The update, paused.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn update_pause(
    State(api): State<Shared>,
    Path(key): Path<JobKeyPath>,
) -> Result<Response, ApiErr> {
    update_action(api, key, UpdateAction::Pause).await
}

/// Resumes a paused update in the direction it was going.
#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/update/resume",
    tag = "updates",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The update, going on.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn update_resume(
    State(api): State<Shared>,
    Path(key): Path<JobKeyPath>,
) -> Result<Response, ApiErr> {
    update_action(api, key, UpdateAction::Resume).await
}

/// Rolls the running update back, the last started instance first.
#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/update/rollback",
    tag = "updates",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The update, rolling back.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn update_rollback(
    State(api): State<Shared>,
    Path(key): Path<JobKeyPath>,
) -> Result<Response, ApiErr> {
    update_action(api, key, UpdateAction::Rollback).await
}

/// Ends the running update as ABORTED; every instance stays on its config.
#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/update/abort",
    tag = "updates",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The update, aborted.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn update_abort(
    State(api): State<Shared>,
    Path(key): Path<JobKeyPath>,
) -> Result<Response, ApiErr> {
    update_action(api, key, UpdateAction::Abort).await
}

/// A job key from the path: role, environment, name.
type JobKeyPath = (String, String, String);

/// Whether the master is up (no token).
#[utoipa::path(
    get,
    path = "/health",
    tag = "meta",
    responses(
        (status = 200, description = "The master is up: `ok`, or `read-only: WHY` while its store's disk is full (reads are served, writes answer 507 `read_only`; a restart would not help, so this stays 200).", content_type = "text/plain", body = String),
    ),
)]
async fn health(State(api): State<Shared>) -> String {
    match api.master.read_only() {
        Some(why) => format!("read-only: {why}"),
        None => "ok".to_string(),
    }
}

/// This API's OpenAPI 3 contract (no token): the same document as docs/openapi.json.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "This contract (OpenAPI 3.1).", body = Object),
    ),
)]
async fn openapi_json() -> Response {
    static CONTRACT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = CONTRACT.get_or_init(openapi::contract_json);
    ([(header::CONTENT_TYPE, "application/json")], text.as_str()).into_response()
}

/// 200 with the body of a reply that carries one; a reply without one is a bug.
fn ok_reply(reply: Reply) -> Result<Response, ApiErr> {
    match reply {
        Reply::Action(a) => Ok(json(StatusCode::OK, &a)),
        Reply::Registered(r) => Ok(json(StatusCode::OK, &r)),
        Reply::Heartbeat(r) => Ok(json(StatusCode::OK, &r)),
        Reply::Ack(a) => Ok(json(StatusCode::OK, &a)),
        Reply::Hosts(h) => Ok(json(StatusCode::OK, &h)),
        Reply::Cluster(c) => Ok(json(StatusCode::OK, &c)),
        Reply::Quota(q) => Ok(json(StatusCode::OK, &q)),
        Reply::Role(r) => Ok(json(StatusCode::OK, &r)),
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

#[utoipa::path(
    get,
    path = "/v1/jobs",
    tag = "jobs",
    params(openapi::JobListQuery),
    responses(
        (status = 200, description = "Job summaries, sorted by key.", body = Vec<wire::JobSummary>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn list_jobs(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let role = q.get("role").map(String::as_str);
    if who.reads_all() {
        return Ok(json(
            StatusCode::OK,
            &api.master.read(|c| c.job_summaries(role)),
        ));
    }
    let Grant::Roles { roles } = &who.grant else {
        return Err(crate::guard::forbidden(&who, &Permission::ReadAll));
    };
    if let Some(role) = role {
        crate::guard::require(&who, &Permission::ReadJob { role: role.into() })?;
    }
    let mine: Vec<_> = api.master.read(|c| {
        roles
            .iter()
            .filter(|r| role.is_none_or(|want| want == r.as_str()))
            .flat_map(|r| c.job_summaries(Some(r)))
            .collect()
    });
    Ok(json(StatusCode::OK, &mine))
}

fn key_of(role: &str, env: &str, name: &str) -> String {
    format!("{role}/{env}/{name}")
}

/// The text that replaces `task.env` values for callers not of the job's role.
pub const HIDDEN_SECRET: &str = "(hidden)";

#[utoipa::path(
    get,
    path = "/v1/jobs/{role}/{env}/{name}",
    tag = "jobs",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The job, its instances and configs.", body = wire::JobView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn get_job(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let key = key_of(&role, &env, &name);
    let mut view = api
        .master
        .read(|c| c.job_view(&key))
        .ok_or_else(|| ApiErr::not_found(&format!("job {key}"), "job"))?;
    if !who.sees_secrets_of(&role) {
        let specs = std::iter::once(&mut view.spec).chain(view.configs.values_mut());
        for value in specs.flat_map(|s| s.task.env.values_mut()) {
            *value = HIDDEN_SECRET.to_string();
        }
    }
    Ok(json(StatusCode::OK, &view))
}

/// The instances a kill or restart names (None: all), checked against the job's
/// instance count before the core sees them: the work is bounded by the number of
/// ranges, and an error names the first instance the job does not have.
async fn instances_from(
    api: &Api,
    job: &str,
    role: &str,
    body: Body,
) -> Result<Option<Vec<u32>>, ApiErr> {
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
    let Some(text) = req.and_then(|r| r.instances) else {
        return Ok(None);
    };
    let bad = |message: String| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_instances",
            message,
            Some("instances"),
        )
    };
    let ranges = wire::parse_instance_ranges(&text).map_err(bad)?;
    let count = api
        .master
        .read(|c| {
            c.job_summaries(Some(role))
                .into_iter()
                .find(|j| j.key == job)
                .map(|j| j.instances)
        })
        .ok_or_else(|| ApiErr::not_found(&format!("job {job}"), "job"))?;
    if let Some(&(_, hi)) = ranges.last() {
        if hi >= count {
            let first = ranges
                .iter()
                .map(|&(lo, hi)| lo.max(count).min(hi))
                .find(|&i| i >= count)
                .unwrap_or(hi);
            return Err(bad(format!(
                "job {job} has no instance {first}: its instances are 0-{}",
                count.saturating_sub(1)
            )));
        }
    }
    Ok(Some(
        ranges.into_iter().flat_map(|(lo, hi)| lo..=hi).collect(),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/kill",
    tag = "jobs",
    params(openapi::JobPath),
    request_body = Option<InstancesRequest>,
    responses(
        (status = 200, description = "The tasks touched.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn kill_job(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    let instances = instances_from(&api, &job, &role, body).await?;
    ok_reply(api.master.apply(Event::Kill { job, instances }).await?)
}

#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/restart",
    tag = "jobs",
    params(openapi::JobPath),
    request_body = Option<InstancesRequest>,
    responses(
        (status = 200, description = "The replacement tasks.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn restart_job(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    let instances = instances_from(&api, &job, &role, body).await?;
    ok_reply(api.master.apply(Event::Restart { job, instances }).await?)
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    tag = "tasks",
    params(openapi::TaskPath),
    responses(
        (status = 200, description = "The task.", body = wire::TaskView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn get_task(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    let view = api
        .master
        .read(|c| c.task_view(&id))
        .ok_or_else(|| ApiErr::not_found(&format!("task {id}"), "task_id"))?;
    let role = view.job.split('/').next().unwrap_or_default().to_string();
    crate::guard::require(&who, &Permission::ReadJob { role })?;
    Ok(json(StatusCode::OK, &view))
}

#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "cluster",
    responses(
        (status = 200, description = "The fleet at a glance and the eviction guard.", body = wire::ClusterView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn cluster(State(api): State<Shared>) -> Response {
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
async fn release_guard(State(api): State<Shared>) -> Result<Response, ApiErr> {
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
async fn list_quotas(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.quota_views()))
}

#[utoipa::path(
    get,
    path = "/v1/quotas/{role}",
    tag = "quotas",
    params(openapi::RolePath),
    responses(
        (status = 200, description = "The role's quota and use.", body = wire::QuotaView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn get_quota(State(api): State<Shared>, Path(role): Path<String>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.quota_view(&role)))
}

/// Body of POST /v1/quotas/{role}: the production resources the role may hold
/// (`{"cpu": 4, "ram_bytes": ..., "disk_bytes": ...}`), or `{"remove": true}`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SetQuotaRequest {
    #[serde(default)]
    cpu: Option<f64>,
    #[serde(default)]
    ram_bytes: Option<u64>,
    #[serde(default)]
    disk_bytes: Option<u64>,
    #[serde(default)]
    remove: bool,
}

#[utoipa::path(
    post,
    path = "/v1/quotas/{role}",
    tag = "quotas",
    params(openapi::RolePath),
    request_body = SetQuotaRequest,
    responses(
        (status = 200, description = "The role's quota now.", body = wire::QuotaView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn set_quota(
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
    let req: SetQuotaRequest = read_json(body).await?;
    let bad = |field: &str, message: String| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_quota",
            message,
            Some(field),
        )
    };
    let quota = if req.remove {
        if req.cpu.is_some() || req.ram_bytes.is_some() || req.disk_bytes.is_some() {
            return Err(bad(
                "remove",
                "remove goes alone; send either remove or cpu, ram_bytes and disk_bytes"
                    .to_string(),
            ));
        }
        None
    } else {
        let cpu = req.cpu.unwrap_or(0.0);
        if !cpu.is_finite() || cpu < 0.0 {
            return Err(bad(
                "cpu",
                format!("is {cpu}; use 0 or more cores, e.g. 4 or 0.5"),
            ));
        }
        Some(crate::core::Usage::from_wire(&wire::QuotaResources {
            cpu,
            ram_bytes: req.ram_bytes.unwrap_or(0),
            disk_bytes: req.disk_bytes.unwrap_or(0),
        }))
    };
    ok_reply(api.master.apply(Event::SetQuota { role, quota }).await?)
}

#[utoipa::path(
    get,
    path = "/v1/roles/{role}",
    tag = "roles",
    params(openapi::RolePath),
    responses(
        (status = 200, description = "The users the role's tasks may run as, and its jobs running as a user no longer granted.", body = wire::RoleView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn get_role(State(api): State<Shared>, Path(role): Path<String>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.role_view(&role)))
}

/// The role and user of a grant or revocation, checked: both valid names, and the
/// user not the role's own (which its tasks may always run as).
async fn role_user(role: &str, body: Body) -> Result<String, ApiErr> {
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
async fn set_user_grant(
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
    params(openapi::RolePath),
    request_body = wire::RoleUserRequest,
    responses(
        (status = 200, description = "The role's users now (granting a user twice changes nothing).", body = wire::RoleView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn grant_user(
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
    params(openapi::RolePath),
    request_body = wire::RoleUserRequest,
    responses(
        (status = 200, description = "The role's users now, with the jobs flagged (revoking a user not granted changes nothing).", body = wire::RoleView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn revoke_user(
    State(api): State<Shared>,
    Path(role): Path<String>,
    body: Body,
) -> Result<Response, ApiErr> {
    set_user_grant(api, role, body, false).await
}

#[utoipa::path(
    get,
    path = "/v1/cron",
    tag = "cron",
    responses(
        (status = 200, description = "Every cron job, sorted by key.", body = Vec<wire::CronView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn list_cron(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.cron_views()))
}

#[utoipa::path(
    post,
    path = "/v1/cron/{role}/{env}/{name}/start",
    tag = "cron",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "The tasks started.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn cron_start(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    ok_reply(api.master.apply(Event::CronStart { job }).await?)
}

#[utoipa::path(
    post,
    path = "/v1/cron/{role}/{env}/{name}/deschedule",
    tag = "cron",
    params(openapi::JobPath),
    responses(
        (status = 200, description = "Descheduled.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn cron_deschedule(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    ok_reply(api.master.apply(Event::CronDeschedule { job }).await?)
}

/// How long the master waits for an agent's log server.
const LOG_PROXY_TIMEOUT: Duration = Duration::from_secs(30);

/// GET /v1/tasks/{id}/logs/{process}/{stream}?offset=N: the task's log, read from
/// its agent's log server with the key the agent gave at registration (the log
/// server answers nobody else). Status, body and `x-drover-log-size` are passed on.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/logs/{process}/{stream}",
    tag = "tasks",
    params(openapi::LogPath, openapi::LogQuery),
    responses(
        (status = 200, description = "Up to 4 MiB of the log from `offset`, as the agent sent it.", content_type = "application/octet-stream", body = String, headers(("x-drover-log-size" = u64, description = "The log file's size in bytes."))),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn task_log(
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
    crate::guard::require(&who, &Permission::ReadJob { role })?;
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
        // reqwest's own text hides the cause (refused, a certificate not trusted).
        let mut cause = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            cause = format!("{cause}: {s}");
            source = s.source();
        }
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

/// The header the agents' log servers send with a log's total size.
const LOG_SIZE_HEADER: &str = "x-drover-log-size";

#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "agents",
    responses(
        (status = 200, description = "Every agent, sorted by id.", body = Vec<wire::AgentView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn list_agents(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.agent_views()))
}

#[utoipa::path(
    get,
    path = "/v1/hosts",
    tag = "hosts",
    responses(
        (status = 200, description = "Every host, sorted by name.", body = Vec<wire::HostView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn list_hosts(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.host_views()))
}

#[utoipa::path(
    get,
    path = "/v1/hosts/{host}",
    tag = "hosts",
    params(openapi::HostPath),
    responses(
        (status = 200, description = "The host.", body = wire::HostView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn get_host(State(api): State<Shared>, Path(host): Path<String>) -> Result<Response, ApiErr> {
    let mut views = api
        .master
        .read(|c| c.host_views_named(std::slice::from_ref(&host)))?;
    match views.pop() {
        Some(v) => Ok(json(StatusCode::OK, &v)),
        None => Err(ApiErr::not_found(&format!("host {host}"), "host")),
    }
}

/// Reads a maintenance request; `deadline_ms` is for drains only.
async fn hosts_request(body: Body, drain: bool) -> Result<HostsRequest, ApiErr> {
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
async fn maintain(m: &Master, op: MaintenanceOp, hosts: Vec<String>) -> Result<Response, ApiErr> {
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
async fn cordon_hosts(State(api): State<Shared>, body: Body) -> Result<Response, ApiErr> {
    let req = hosts_request(body, false).await?;
    maintain(&api.master, MaintenanceOp::Cordon, req.hosts).await
}

#[utoipa::path(
    post,
    path = "/v1/hosts/drain",
    tag = "hosts",
    request_body = HostsRequest,
    responses(
        (status = 200, description = "The hosts after the change, or with `dry_run` what a drain would do.", body = openapi::DrainAnswer),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn drain_hosts(State(api): State<Shared>, body: Body) -> Result<Response, ApiErr> {
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
async fn activate_hosts(State(api): State<Shared>, body: Body) -> Result<Response, ApiErr> {
    let req = hosts_request(body, false).await?;
    maintain(&api.master, MaintenanceOp::Activate, req.hosts).await
}

impl From<TokenError> for ApiErr {
    fn from(e: TokenError) -> ApiErr {
        let msg = e.to_string();
        match e {
            TokenError::NoToken(_) => {
                ApiErr::new(StatusCode::NOT_FOUND, "not_found", msg, Some("token_id"))
            }
            TokenError::AgentTaken { .. } | TokenError::Forbidden(_) => {
                ApiErr::new(StatusCode::FORBIDDEN, "forbidden", msg, Some("agent_id"))
            }
            TokenError::Sql { source, .. } if crate::store::sqlite_no_space(&source) => {
                ApiErr::from(ApplyError::ReadOnly(format!(
                    "{msg}; the master's disk is full: free space in its data dir"
                )))
            }
            _ => ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, "store_failed", msg, None),
        }
    }
}

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
async fn register(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    cert: Option<Extension<crate::tls::PeerCert>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, ApiErr> {
    let mut req: RegisterRequest = read_json(body).await?;
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
            if !cert.is_agent(&req.agent_id) {
                Err(TokenError::AgentTaken {
                    agent_id: req.agent_id.clone(),
                })
            } else if api.tokens.is_forbidden(&req.agent_id) {
                Err(TokenError::Forbidden(req.agent_id.clone()))
            } else {
                Ok(())
            }
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
    services::resolve_agent_ip(&mut req).await;
    ok_reply(api.master.apply(Event::Register(Box::new(req))).await?)
}

#[utoipa::path(
    post,
    path = "/v1/agents/{id}/heartbeat",
    tag = "agent API",
    params(openapi::AgentPath),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "What the agent should do next.", body = wire::HeartbeatResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn heartbeat(
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
    params(openapi::AgentPath),
    request_body = StatusUpdateBatch,
    responses(
        (status = 200, description = "What was committed.", body = wire::StatusAck),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn updates(
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

/// Answer of POST /v1/agents/{id}/forbid and /allow.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AgentAccessResponse {
    agent_id: String,
    forbidden: bool,
    /// Tokens revoked because they were bound to the agent.
    revoked_tokens: Vec<String>,
}

#[utoipa::path(
    post,
    path = "/v1/agents/{id}/forbid",
    tag = "agents",
    params(openapi::AgentPath),
    responses(
        (status = 200, description = "The agent id is refused from now on.", body = AgentAccessResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn forbid_agent(
    State(api): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    let revoked_tokens = api
        .tokens
        .forbid_agent(&id, drover_common::state::now_ms())?;
    tracing::warn!(agent_id = %id, ?revoked_tokens, "agent forbidden: its requests are refused from now on");
    Ok(json(
        StatusCode::OK,
        &AgentAccessResponse {
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
    params(openapi::AgentPath),
    responses(
        (status = 200, description = "The agent id may register again.", body = AgentAccessResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn allow_agent(
    State(api): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    api.tokens.allow_agent(&id)?;
    Ok(json(
        StatusCode::OK,
        &AgentAccessResponse {
            agent_id: id,
            forbidden: false,
            revoked_tokens: Vec::new(),
        },
    ))
}

#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "tokens",
    responses(
        (status = 200, description = "Every token, oldest first, without secrets.", body = Vec<TokenInfo>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn list_tokens(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.tokens.list())
}

/// Body of POST /v1/tokens: `{"kind": "admin" | "operator" | "agent" | "discovery"}` (an agent
/// token may name its `agent_id`) or `{"kind": "roles", "roles": ["www-data"]}`,
/// and an optional description.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateTokenRequest {
    kind: String,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    description: String,
}

fn bad_token_request(message: String, field: &str) -> ApiErr {
    ApiErr::new(
        StatusCode::BAD_REQUEST,
        "invalid_token_request",
        message,
        Some(field),
    )
}

impl CreateTokenRequest {
    /// The grant asked for, checked.
    fn grant(self) -> Result<(Grant, String), ApiErr> {
        if self.description.len() > 200 {
            return Err(bad_token_request(
                "description is longer than 200 bytes".to_string(),
                "description",
            ));
        }
        if !self.roles.is_empty() && self.kind != "roles" {
            return Err(bad_token_request(
                format!("roles go with kind \"roles\", not \"{}\"", self.kind),
                "roles",
            ));
        }
        if self.agent_id.is_some() && self.kind != "agent" {
            return Err(bad_token_request(
                "agent_id goes with kind \"agent\"".to_string(),
                "agent_id",
            ));
        }
        let grant = match self.kind.as_str() {
            "admin" => Grant::Admin,
            "operator" => Grant::Operator,
            "discovery" => Grant::Discovery,
            "agent" => {
                if let Some(id) = self
                    .agent_id
                    .as_ref()
                    .filter(|id| !drover_common::spec::is_valid_name(id))
                {
                    return Err(bad_token_request(
                        format!("`{id}` is not an agent id"),
                        "agent_id",
                    ));
                }
                Grant::Agent {
                    agent_id: self.agent_id,
                }
            }
            "roles" => {
                if self.roles.is_empty() {
                    return Err(bad_token_request(
                        "roles is empty; name at least one role".to_string(),
                        "roles",
                    ));
                }
                if let Some(bad) = self
                    .roles
                    .iter()
                    .find(|r| !drover_common::spec::is_valid_name(r))
                {
                    return Err(bad_token_request(
                        format!("`{bad}` is not a role name (1-64 of A-Z a-z 0-9 _ . -)"),
                        "roles",
                    ));
                }
                Grant::Roles { roles: self.roles }
            }
            other => {
                return Err(bad_token_request(
                    format!(
                        "kind `{other}` is not one of admin, operator, roles, agent, discovery"
                    ),
                    "kind",
                ))
            }
        };
        Ok((grant, self.description))
    }
}

/// Answer of POST /v1/tokens: the token's record and its text, shown only here.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct CreateTokenResponse {
    #[serde(flatten)]
    info: TokenInfo,
    token: String,
}

#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "tokens",
    request_body = CreateTokenRequest,
    responses(
        (status = 201, description = "The token and its secret (shown only here).", body = CreateTokenResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn create_token(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    body: Body,
) -> Result<Response, ApiErr> {
    let req: CreateTokenRequest = read_json(body).await?;
    let (grant, description) = req.grant()?;
    let (info, token) = api.tokens.create(
        grant,
        description,
        &who.token_id,
        drover_common::state::now_ms(),
    )?;
    Ok(json(
        StatusCode::CREATED,
        &CreateTokenResponse { info, token },
    ))
}

#[utoipa::path(
    post,
    path = "/v1/tokens/{id}/revoke",
    tag = "tokens",
    params(openapi::TokenPath),
    responses(
        (status = 200, description = "The token, revoked.", body = TokenInfo),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn revoke_token(
    State(api): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    let info = api.tokens.revoke(&id, drover_common::state::now_ms())?;
    Ok(json(StatusCode::OK, &info))
}

/// The agent's host is shutting down: drain it.
#[utoipa::path(
    post,
    path = "/v1/agents/{id}/drain",
    tag = "agent API",
    params(openapi::AgentPath),
    request_body = SelfDrainRequest,
    responses(
        (status = 200, description = "The agent's host after the change.", body = Vec<wire::HostView>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn agent_drain(
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

#[utoipa::path(
    get,
    path = "/v1/agents/{id}/assignments",
    tag = "agent API",
    params(openapi::AgentPath, openapi::AssignmentsQuery),
    responses(
        (status = 200, description = "The tasks the agent should hold.", content_type = "application/json", body = wire::AssignmentSet, headers(("x-drover-held-ms" = u64, description = "How long the master held the poll."))),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn assignments(
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

/// 503 `shutting_down` for a long poll the stopping master ends early; `then` says
/// what the client should do.
fn shutting_down(then: &str) -> ApiErr {
    ApiErr::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        format!("the master is stopping; {then}"),
        None,
    )
}

/// GET /v1/changes?index=N[&job=KEY][&wait_ms=M]: the change stream (docs/api.md).
/// Answers at once when something the token may see was committed after index N
/// (or N is newer than this master's index: `reset`), else when the next such
/// commit happens, else empty at the deadline.
#[utoipa::path(
    get,
    path = "/v1/changes",
    tag = "jobs",
    params(openapi::ChangesQuery),
    responses(
        (status = 200, description = "What changed after the index (docs/api.md, change stream).", body = wire::ChangesView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
async fn changes(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let after = query_u64(&q, "index")?.unwrap_or(0);
    let wait_ms = query_u64(&q, "wait_ms")?
        .unwrap_or(DEFAULT_WAIT_MS)
        .min(MAX_WAIT_MS);
    let job = q.get("job").cloned();
    let filter = if who.reads_all() {
        // `job=` asks for that job's changes only: agents' changes would wake a
        // waiting `job create --wait` for nothing.
        ChangeFilter {
            agents: job.is_none(),
            job,
            roles: None,
        }
    } else {
        let Grant::Roles { roles } = &who.grant else {
            return Err(crate::guard::forbidden(&who, &Permission::ReadAll));
        };
        if let Some(key) = &job {
            let role = key.split('/').next().unwrap_or_default();
            crate::guard::require(&who, &Permission::ReadJob { role: role.into() })?;
        }
        ChangeFilter {
            job,
            roles: Some(roles.clone()),
            agents: false,
        }
    };
    let m = &api.master;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let mut commits = m.commit_state().subscribe();
    let mut stopping = m.stopping();
    loop {
        if *stopping.borrow_and_update() {
            return Err(shutting_down(
                "ask again with the same index after it restarted",
            ));
        }
        if m.commit_state().failed() {
            return Err(ApplyError::StoreFailed.into());
        }
        commits.borrow_and_update();
        let committed = m.commit_state().committed();
        let reset = after > committed;
        let from = if reset { 0 } else { after };
        let mut view = m.read(|c| c.changes_since(from, committed, &filter));
        view.reset = reset;
        let empty = view.tasks.is_empty() && view.agents.is_empty() && view.updates.is_empty();
        if !empty || reset || tokio::time::Instant::now() >= deadline {
            crate::metrics::METRICS.change_polls.inc();
            return Ok(json(StatusCode::OK, &view));
        }
        tokio::select! {
            r = commits.changed() => {
                if r.is_err() {
                    return Err(ApplyError::StoreFailed.into());
                }
            }
            _ = tokio::time::sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
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
async fn metrics(State(api): State<Shared>) -> Response {
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

#[cfg(test)]
mod tests {
    #[test]
    fn an_update_names_who_started_it_by_token_description() {
        use super::started_by;
        assert_eq!(
            started_by(None, "3f2a", Some("bootstrap admin token")),
            "bootstrap admin token (token 3f2a)"
        );
        assert_eq!(
            started_by(Some("alice"), "3f2a", Some("ci")),
            "alice (token 3f2a, ci)"
        );
        assert_eq!(started_by(Some(" "), "3f2a", Some("")), "token 3f2a");
    }

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
