//! The master's OpenAPI 3 contract, generated from the code: the `#[utoipa::path]`
//! annotation on every handler in `http.rs`, the `ToSchema` derives on the API types
//! (common's `wire`, `spec`, `state`), and the route table `routes()`, whose access
//! rule each operation carries as `x-drover-access`. Served at `GET
//! /v1/openapi.json` and committed as docs/openapi.json; tests check that the
//! committed file is this one and that the contract and `routes()` name the same
//! routes.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as Contract;
use utoipa::{IntoParams, Modify, OpenApi};

use super::{Access, RouteDef};

// Parameter lists for the annotations. They describe what the handlers read (the
// handlers parse their paths and queries themselves, for errors that name the
// field), so they are never built.

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

/// The contract, as derived by utoipa from the annotated handlers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Drover master API",
        description = "The admin and agent HTTP API of Drover's master (docs/api.md). \
            Every route but `GET /health`, `GET /v1/openapi.json` and the web UI's \
            files (`GET /`, `/ui/...`) needs \
            `Authorization: Bearer drv_<id>_<secret>`; `x-drover-access` on each \
            operation names the access rule it needs (docs/auth.md). Every error is \
            an `ApiErrorBody`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        crate::ui::root,
        crate::ui::ui,
        crate::ui::ui_slash,
        crate::ui::path,
        super::health,
        super::metrics,
        super::openapi_json,
        super::create_job,
        super::list_jobs,
        super::get_job,
        super::kill_job,
        super::restart_job,
        super::start_update,
        super::get_update,
        super::update_pause,
        super::update_resume,
        super::update_rollback,
        super::update_abort,
        super::get_task,
        super::task_log,
        super::cluster,
        super::release_guard,
        super::list_agents,
        super::changes,
        super::services::list,
        super::services::show,
        super::list_hosts,
        super::cordon_hosts,
        super::drain_hosts,
        super::activate_hosts,
        super::get_host,
        super::register,
        super::heartbeat,
        super::assignments,
        super::updates,
        super::agent_drain,
        super::forbid_agent,
        super::allow_agent,
        super::list_quotas,
        super::get_quota,
        super::set_quota,
        super::get_role,
        super::grant_user,
        super::revoke_user,
        super::list_cron,
        super::cron_start,
        super::cron_deschedule,
        super::list_tokens,
        super::create_token,
        super::revoke_token,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// Adds the bearer token scheme every protected route uses.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Contract) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("drv_<id>_<secret>")
                    .build(),
            ),
        );
    }
}

/// An axum path pattern (`/v1/jobs/:role`) in OpenAPI's form (`/v1/jobs/{role}`).
pub fn openapi_path(axum_path: &str) -> String {
    axum_path
        .split('/')
        .map(
            |part| match part.strip_prefix(':').or_else(|| part.strip_prefix('*')) {
                Some(name) => format!("{{{name}}}"),
                None => part.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("/")
}

/// The route's operation in the contract, if it has one.
fn operation_mut<'a>(
    contract: &'a mut Contract,
    def: &RouteDef,
) -> Option<&'a mut utoipa::openapi::path::Operation> {
    let item = contract.paths.paths.get_mut(&openapi_path(def.path))?;
    match def.method {
        "GET" => item.get.as_mut(),
        "POST" => item.post.as_mut(),
        "PUT" => item.put.as_mut(),
        "DELETE" => item.delete.as_mut(),
        "PATCH" => item.patch.as_mut(),
        _ => None,
    }
}

/// The contract: the annotated operations, each with the access rule `routes()`
/// gives it (`x-drover-access`); public routes need no token.
pub fn contract() -> Contract {
    let mut contract = ApiDoc::openapi();
    for def in super::route_table() {
        let Some(op) = operation_mut(&mut contract, &def) else {
            // A route without an annotation: the route test names it.
            continue;
        };
        let extensions = op.extensions.get_or_insert_with(Default::default);
        extensions.insert(
            "x-drover-access".to_string(),
            serde_json::Value::from(format!("{:?}", def.access)),
        );
        if def.access == Access::Public {
            op.security = Some(vec![
                utoipa::openapi::security::SecurityRequirement::default(),
            ]);
        }
    }
    contract
}

/// The contract as served and committed: pretty JSON with a final newline.
pub fn contract_json() -> String {
    let mut text = contract()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// The (method, OpenAPI path) pairs the contract has operations for.
pub fn contract_routes(contract: &Contract) -> Vec<(String, String)> {
    let mut routes = Vec::new();
    for (path, item) in &contract.paths.paths {
        for (method, op) in [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("DELETE", &item.delete),
            ("PATCH", &item.patch),
            ("HEAD", &item.head),
            ("OPTIONS", &item.options),
            ("TRACE", &item.trace),
        ] {
            if op.is_some() {
                routes.push((method.to_string(), path.clone()));
            }
        }
    }
    routes.sort();
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_in_the_contract_and_nothing_else() {
        let mut table: Vec<(String, String)> = super::super::route_table()
            .iter()
            .map(|d| (d.method.to_string(), openapi_path(d.path)))
            .collect();
        table.sort();
        let contract = contract_routes(&contract());
        let missing: Vec<_> = table.iter().filter(|r| !contract.contains(r)).collect();
        let extra: Vec<_> = contract.iter().filter(|r| !table.contains(r)).collect();
        assert!(
            missing.is_empty(),
            "routes without an operation in the contract (add #[utoipa::path] to the \
             handler and list it in ApiDoc's paths in master/src/http/openapi.rs): {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "operations in the contract that routes() does not serve: {extra:?}"
        );
    }

    #[test]
    fn every_operation_carries_its_access_and_public_ones_need_no_token() {
        let contract = contract();
        let json = serde_json::to_value(&contract).expect("contract serializes");
        for def in super::super::route_table() {
            let op = &json["paths"][openapi_path(def.path)][def.method.to_lowercase()];
            assert_eq!(
                op["x-drover-access"],
                serde_json::Value::from(format!("{:?}", def.access)),
                "{} {}",
                def.method,
                def.path
            );
            let public = op["security"] == serde_json::json!([{}]);
            assert_eq!(
                public,
                def.access == Access::Public,
                "{} {}",
                def.method,
                def.path
            );
        }
    }

    /// docs/openapi.json is the contract the code generates.
    #[test]
    fn the_committed_contract_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        let generated = contract_json();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &generated).expect("write docs/openapi.json");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json differs from the contract the code generates; regenerate it \
             with `UPDATE_OPENAPI=1 cargo test -p drover-master --lib openapi` and commit it"
        );
    }

    #[test]
    fn paths_are_written_in_openapi_form() {
        assert_eq!(
            openapi_path("/v1/jobs/:role/:env/:name/kill"),
            "/v1/jobs/{role}/{env}/{name}/kill"
        );
        assert_eq!(openapi_path("/"), "/");
    }
}
