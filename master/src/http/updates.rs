//! Rolling updates of a job: start (the spec validated like a new job's), read,
//! pause, resume, roll back and abort, and who started one.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use drover_common::wire::{self, ApiErrorBody};

use super::api::Shared;
use super::body::{json, key_of, read_body, MAX_BODY_BYTES};
use super::error::{unexpected, ApiErr};
use super::jobs::parse_spec;
use super::params;
use crate::auth::Principal;
use crate::core::{Event, Reply, UpdateAction};

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

/// POST /v1/jobs/{key}/update: an `UpdateRequest`, read field by field so the spec
/// is validated like POST /v1/jobs (all errors, with paths).
#[utoipa::path(
    post,
    path = "/v1/jobs/{role}/{env}/{name}/update",
    tag = "updates",
    params(params::JobPath),
    request_body = wire::UpdateRequest,
    responses(
        (status = 201, description = "The update, started.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn start_update(
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
    params(params::JobPath),
    responses(
        (status = 200, description = "The job's latest update.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn get_update(
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
pub(super) async fn update_action(
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
    params(params::JobPath),
    responses(
        (status = 200, description = "The update, paused.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn update_pause(
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
    params(params::JobPath),
    responses(
        (status = 200, description = "The update, going on.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn update_resume(
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
    params(params::JobPath),
    responses(
        (status = 200, description = "The update, rolling back.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn update_rollback(
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
    params(params::JobPath),
    responses(
        (status = 200, description = "The update, aborted.", body = wire::UpdateView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn update_abort(
    State(api): State<Shared>,
    Path(key): Path<JobKeyPath>,
) -> Result<Response, ApiErr> {
    update_action(api, key, UpdateAction::Abort).await
}

/// A job key from the path: role, environment, name.
type JobKeyPath = (String, String, String);

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
}
