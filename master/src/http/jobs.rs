//! Jobs and their tasks: create, list, read (a summary and a page of instances,
//! secrets hidden from other roles), kill and restart (instance ranges checked
//! against the job), cron runs, and the change stream `GET /v1/changes` (paged
//! with `limit`).

use std::collections::HashMap;
use std::ops::ControlFlow;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use drover_common::parse::parse_job_json_with;
use drover_common::state::ALL_STATES;
use drover_common::wire::{self, ApiError, ApiErrorBody, FieldError, InstancesRequest};

use super::api::{Api, Shared};
use super::body::{json, key_of, ok_reply, query_u64, read_body, MAX_BODY_BYTES};
use super::error::{unexpected, ApiErr};
use super::guard::{forbidden, require};
use super::longpoll::{until_news, wait_ms};
use super::params;
use crate::auth::{Grant, Permission, Principal};
use crate::core::{restart_rolls, ChangeFilter, ChangesPage, Event, InstancePage, Reply};

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
pub(super) async fn create_job(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    body: Body,
) -> Result<Response, ApiErr> {
    let text = read_body(body, MAX_BODY_BYTES).await?;
    let spec = parse_spec(&api, &text)?;
    require(
        &who,
        &Permission::WriteJob {
            role: spec.role.clone(),
        },
    )?;
    match api.master.apply(Event::CreateJob(Box::new(spec))).await? {
        Reply::JobCreated { job, tasks } => Ok(json(
            StatusCode::CREATED,
            &wire::ActionResponse {
                job,
                tasks,
                update: None,
            },
        )),
        other => Err(unexpected(other)),
    }
}

/// Parses and validates a job spec (all errors at once, the first one's field),
/// with the master's `cron_seconds` switch.
pub(super) fn parse_spec(api: &Shared, text: &str) -> Result<drover_common::JobSpec, ApiErr> {
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

#[utoipa::path(
    get,
    path = "/v1/jobs",
    tag = "jobs",
    params(params::JobListQuery),
    responses(
        (status = 200, description = "Job summaries, sorted by key.", body = Vec<wire::JobSummary>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list_jobs(
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
        return Err(forbidden(&who, &Permission::ReadAll));
    };
    if let Some(role) = role {
        require(&who, &Permission::ReadJob { role: role.into() })?;
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

/// The text that replaces `task.env` values for callers not of the job's role.
pub const HIDDEN_SECRET: &str = "(hidden)";

#[utoipa::path(
    get,
    path = "/v1/jobs/{role}/{env}/{name}",
    tag = "jobs",
    params(params::JobPath, params::JobQuery),
    responses(
        (status = 200, description = "The job's summary and its instances (every one, or one page \
            with `limit`; `next_after` continues).", body = wire::JobView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn get_job(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path((role, env, name)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let key = key_of(&role, &env, &name);
    let page = instance_page(&q)?;
    let mut view = api
        .master
        .read(|c| c.job_view_page(&key, &page))
        .ok_or_else(|| ApiErr::not_found(&format!("job {key}"), "job"))?;
    if !who.sees_secrets_of(&role) {
        let specs = std::iter::once(&mut view.spec).chain(view.configs.values_mut());
        for value in specs.flat_map(|s| s.task.env.values_mut()) {
            *value = HIDDEN_SECRET.to_string();
        }
    }
    Ok(json(StatusCode::OK, &view))
}

/// A query parameter that is present but wrong: `400 invalid_query` naming it.
fn bad_query(name: &str, message: String) -> ApiErr {
    ApiErr::new(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        message,
        Some(name),
    )
}

/// `limit` of a paged read: 1 to `max` (absent: None, no limit).
fn page_limit(q: &HashMap<String, String>, max: u32) -> Result<Option<u32>, ApiErr> {
    let Some(text) = q.get("limit") else {
        return Ok(None);
    };
    match text.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(bad_query(
            "limit",
            format!("limit is `{text}`: a page size from 1 to {max}"),
        )),
    }
}

/// The page of instances `?after=I&limit=N&state=S` asks for (docs/api.md).
fn instance_page(q: &HashMap<String, String>) -> Result<InstancePage, ApiErr> {
    let after = match q.get("after") {
        None => None,
        Some(text) => Some(text.parse::<u32>().map_err(|_| {
            bad_query(
                "after",
                format!("after is `{text}`: an instance number (the answer's next_after)"),
            )
        })?),
    };
    let state = match q.get("state") {
        None => None,
        Some(text) => Some(
            ALL_STATES
                .into_iter()
                .find(|s| s.as_str().eq_ignore_ascii_case(text))
                .ok_or_else(|| {
                    let names: Vec<&str> = ALL_STATES.iter().map(|s| s.as_str()).collect();
                    bad_query(
                        "state",
                        format!("state is `{text}`: one of {}", names.join(", ")),
                    )
                })?,
        ),
    };
    Ok(InstancePage {
        after,
        limit: page_limit(q, wire::MAX_INSTANCE_PAGE)?,
        state,
    })
}

/// The instances a kill or restart names (None: all), checked against the job's
/// instance count before the core sees them: the work is bounded by the number of
/// ranges, and an error names the first instance the job does not have.
pub(super) async fn instances_from(
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
    checked_instances(api, job, role, req.and_then(|r| r.instances))
}

/// The instances `text` names (`0-3,7`; None: all), checked against the job's
/// instance count (see `instances_from`).
fn checked_instances(
    api: &Api,
    job: &str,
    role: &str,
    text: Option<String>,
) -> Result<Option<Vec<u32>>, ApiErr> {
    let Some(text) = text else {
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
    params(params::JobPath),
    request_body = Option<InstancesRequest>,
    responses(
        (status = 200, description = "The tasks touched.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn kill_job(
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
    params(params::JobPath),
    request_body = Option<wire::RestartRequest>,
    responses(
        (status = 200, description = "Named instances or `all_at_once`: the replacement tasks. \
            The whole job (the default): a rolling restart started, `update` its id, `tasks` empty \
            (none when nothing runs).", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn restart_job(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path((role, env, name)): Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    let text = read_body(body, MAX_BODY_BYTES).await?;
    let req = restart_request(&text)?;
    let instances = checked_instances(&api, &job, &role, req.instances)?;
    let event = if restart_rolls(instances.as_deref(), req.all_at_once) {
        let user = api
            .tokens
            .list()
            .into_iter()
            .find(|t| t.id == who.token_id)
            .map(|t| t.description)
            .filter(|d| !d.trim().is_empty())
            .map_or_else(
                || format!("token {}", who.token_id),
                |d| format!("{d} (token {})", who.token_id),
            );
        Event::RollingRestart { job, user }
    } else {
        Event::Restart { job, instances }
    };
    ok_reply(api.master.apply(event).await?)
}

/// The body of POST .../restart read field by field, so a bad one is refused
/// naming its field: empty or `null` is the whole job, rolling.
fn restart_request(text: &str) -> Result<wire::RestartRequest, ApiErr> {
    let field = |name: &str, message: String| {
        ApiErr::new(StatusCode::BAD_REQUEST, "invalid_json", message, Some(name))
    };
    if text.trim().is_empty() {
        return Ok(wire::RestartRequest::default());
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not JSON: {e}"),
            None,
        )
    })?;
    if value.is_null() {
        return Ok(wire::RestartRequest::default());
    }
    let Some(fields) = value.as_object() else {
        return Err(ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body is not {\"instances\": \"0-3,7\", \"all_at_once\": false}",
            None,
        ));
    };
    let mut req = wire::RestartRequest::default();
    for (name, v) in fields {
        match name.as_str() {
            "instances" if v.is_null() => {}
            "instances" => {
                let text = v.as_str().ok_or_else(|| {
                    field(
                        "instances",
                        format!("instances is {v}: an instance set like \"0-3,7\""),
                    )
                })?;
                req.instances = Some(text.to_string());
            }
            "all_at_once" if v.is_null() => {}
            "all_at_once" => {
                req.all_at_once = v.as_bool().ok_or_else(|| {
                    field("all_at_once", format!("all_at_once is {v}: true or false"))
                })?;
            }
            other => {
                return Err(field(
                    other,
                    format!("unknown field {other}: a restart takes instances and all_at_once"),
                ))
            }
        }
    }
    Ok(req)
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    tag = "tasks",
    params(params::TaskPath),
    responses(
        (status = 200, description = "The task.", body = wire::TaskView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn get_task(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    let view = api
        .master
        .read(|c| c.task_view(&id))
        .ok_or_else(|| ApiErr::not_found(&format!("task {id}"), "task_id"))?;
    let role = view.job.split('/').next().unwrap_or_default().to_string();
    require(&who, &Permission::ReadJob { role })?;
    Ok(json(StatusCode::OK, &view))
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
pub(super) async fn list_cron(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.master.read(|c| c.cron_views()))
}

#[utoipa::path(
    post,
    path = "/v1/cron/{role}/{env}/{name}/start",
    tag = "cron",
    params(params::JobPath),
    responses(
        (status = 200, description = "The tasks started.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn cron_start(
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
    params(params::JobPath),
    responses(
        (status = 200, description = "Descheduled.", body = wire::ActionResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn cron_deschedule(
    State(api): State<Shared>,
    Path((role, env, name)): Path<(String, String, String)>,
) -> Result<Response, ApiErr> {
    let job = key_of(&role, &env, &name);
    ok_reply(api.master.apply(Event::CronDeschedule { job }).await?)
}

/// GET /v1/changes?index=N[&job=KEY][&wait_ms=M][&limit=L[&after=TASK]]: the
/// change stream (docs/api.md). Answers at once when something the token may see
/// was committed after index N (or N is newer than this master's index: `reset`),
/// else when the next such commit happens, else empty at the deadline. With
/// `limit`, at most L tasks, and `more` with where to go on when there are more.
#[utoipa::path(
    get,
    path = "/v1/changes",
    tag = "jobs",
    params(params::ChangesQuery),
    responses(
        (status = 200, description = "What changed after the index (docs/api.md, change stream).", body = wire::ChangesView),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn changes(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiErr> {
    let after = query_u64(&q, "index")?.unwrap_or(0);
    let wait_ms = wait_ms(&q)?;
    let limit = page_limit(&q, wire::MAX_CHANGES_PAGE)?;
    let after_task = q.get("after").cloned();
    if after_task.is_some() && limit.is_none() {
        return Err(bad_query(
            "after",
            "after goes with limit: pass the limit of the page it came from".to_string(),
        ));
    }
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
            return Err(forbidden(&who, &Permission::ReadAll));
        };
        if let Some(key) = &job {
            let role = key.split('/').next().unwrap_or_default();
            require(&who, &Permission::ReadJob { role: role.into() })?;
        }
        ChangeFilter {
            job,
            roles: Some(roles.clone()),
            agents: false,
        }
    };
    let m = &api.master;
    let view = until_news(m, wait_ms, |committed| {
        let reset = after > committed;
        let from = if reset { 0 } else { after };
        let page = ChangesPage {
            // A reset starts over: the page point belonged to the old numbering.
            after_task: after_task.clone().filter(|_| !reset),
            limit: limit.map(|l| l as usize),
        };
        let mut view = m.read(|c| c.changes_page(from, committed, &filter, &page));
        view.reset = reset;
        let empty = view.tasks.is_empty() && view.agents.is_empty() && view.updates.is_empty();
        if !empty || reset {
            ControlFlow::Break(view)
        } else {
            ControlFlow::Continue(view)
        }
    })
    .await?;
    crate::metrics::METRICS.change_polls.inc();
    Ok(json(StatusCode::OK, &view))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> (String, Option<String>) {
        let e = restart_request(text).unwrap_err();
        (e.body.error.code, e.body.error.field)
    }

    #[test]
    fn a_restart_request_is_read_field_by_field() {
        let whole = wire::RestartRequest::default();
        for text in [
            "",
            " ",
            "null",
            "{}",
            r#"{"instances": null, "all_at_once": null}"#,
        ] {
            assert_eq!(restart_request(text).unwrap(), whole, "{text}");
        }
        let req = restart_request(r#"{"instances": "0-2", "all_at_once": true}"#).unwrap();
        assert_eq!(req.instances.as_deref(), Some("0-2"));
        assert!(req.all_at_once);
        let field = |f: &str| ("invalid_json".to_string(), Some(f.to_string()));
        assert_eq!(refused(r#"{"all_at_once": "yes"}"#), field("all_at_once"));
        assert_eq!(refused(r#"{"instances": 3}"#), field("instances"));
        assert_eq!(refused(r#"{"rolling": false}"#), field("rolling"));
        assert_eq!(refused("[1]"), ("invalid_json".to_string(), None));
        assert_eq!(refused("{"), ("invalid_json".to_string(), None));
    }
}
