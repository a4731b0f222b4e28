//! The paths, queries and untyped answers the handlers' `#[utoipa::path]`
//! annotations describe. The handlers parse their paths and queries themselves (for
//! errors that name the field), so these are never built.

use utoipa::IntoParams;

/// A job key in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct JobPath {
    /// The job's role (first part of its key).
    role: String,
    /// The job's environment (second part of its key).
    env: String,
    /// The job's name (third part of its key).
    name: String,
}

/// A task id in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct TaskPath {
    /// The task's id, e.g. `hello-0-1f2e3d4c5b6a`.
    id: String,
}

/// A task's log in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct LogPath {
    /// The task's id.
    id: String,
    /// The process whose log to read.
    process: String,
    /// `stdout` or `stderr`.
    stream: String,
}

/// The query of a log read.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct LogQuery {
    /// The byte to read from (default 0).
    #[param(minimum = 0)]
    offset: Option<u64>,
}

/// An agent id in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct AgentPath {
    /// The agent's id.
    id: String,
}

/// A host in the path: an agent id or a host name.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct HostPath {
    /// An agent id or a host name.
    host: String,
}

/// A role in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct RolePath {
    /// The role.
    role: String,
}

/// A token id in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct TokenPath {
    /// The token's id (the part after `drv_`, before the secret).
    id: String,
}

/// The query of `GET /v1/jobs`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct JobListQuery {
    /// Only the jobs of this role.
    role: Option<String>,
}

/// The query of `GET /v1/jobs/{role}/{env}/{name}`: which instances to answer.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct JobQuery {
    /// At most this many instances (1 to 1000); absent: every instance.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Only instances numbered above this one (the previous page's `next_after`).
    #[param(minimum = 0)]
    after: Option<u32>,
    /// Only instances whose current task is in this state (e.g. `PENDING`).
    state: Option<drover_common::state::TaskState>,
}

/// The query of `GET /v1/changes`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ChangesQuery {
    /// The index of the last answer (0 or absent: everything).
    #[param(minimum = 0)]
    index: Option<u64>,
    /// Only this job's tasks (`role/env/name`).
    job: Option<String>,
    /// How long to wait for a change, in milliseconds (default 30000, at most
    /// 120000; more is cut to 120000).
    #[param(minimum = 0)]
    wait_ms: Option<u64>,
    /// At most this many tasks in the answer (1 to 5000); absent: every one.
    #[param(minimum = 1, maximum = 5000)]
    limit: Option<u32>,
    /// With `limit`: the previous page's `after` (its last task), with its
    /// `index`.
    after: Option<String>,
}

/// The query of the assignments long poll.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct AssignmentsQuery {
    /// The set version the agent has; absent: answer at once.
    #[param(minimum = 0)]
    after_version: Option<u64>,
    /// How long to wait for a change, in milliseconds (default 30000, at most
    /// 120000).
    #[param(minimum = 0)]
    wait_ms: Option<u64>,
}

/// The answer of `POST /v1/hosts/drain`: the hosts after the change, or with
/// `dry_run` what a drain would do.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum DrainAnswer {
    /// The hosts after the drain round.
    Hosts(Vec<drover_common::wire::HostView>),
    /// `dry_run`: what a drain would do, per host.
    Probes(Vec<drover_common::wire::HostProbe>),
}
