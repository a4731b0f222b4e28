//! The admin and agent HTTP APIs (axum), as documented in docs/api.md: one route
//! table with the access each route needs (checked by `guard` before any handler
//! runs), bounded JSON bodies, JSON errors with codes, and the agents' assignment
//! long poll that only ever serves committed placements.
//!
//! This file is the route table and the router built from it; the handlers live in
//! one file per API area beside it, and the guard and the OpenAPI contract are
//! handed the table rather than reading it from here.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Router};

mod agent_api;
mod api;
mod body;
mod cluster;
mod error;
mod exec;
mod guard;
mod hosts;
mod jobs;
mod logs;
mod longpoll;
mod meta;
pub mod openapi;
mod params;
mod services;
mod tokens;
mod updates;

pub use api::Api;
use api::Shared;
pub use body::{
    check_depth, BODY_READ_TIMEOUT, MAX_AGENT_BODY_BYTES, MAX_BODY_BYTES, MAX_JSON_DEPTH,
};
pub use error::ApiErr;
use guard::{route, Gate};
pub use guard::{Access, RouteDef};
pub use jobs::HIDDEN_SECRET;

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
        (route("GET", "/health", Public), get(meta::health)),
        (
            route("GET", "/v1/openapi.json", Public),
            get(openapi::openapi_json),
        ),
        (route("GET", "/metrics", ReadAll), get(meta::metrics)),
        (route("POST", "/v1/jobs", JobCreate), post(jobs::create_job)),
        (route("GET", "/v1/jobs", JobList), get(jobs::list_jobs)),
        (
            route("GET", "/v1/jobs/:role/:env/:name", JobRead),
            get(jobs::get_job),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/kill", JobWrite),
            post(jobs::kill_job),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/restart", JobWrite),
            post(jobs::restart_job),
        ),
        // master/tests/auth.rs walks the update routes in this order: start, read,
        // pause, resume, roll back, abort (each 2xx with the right token).
        (
            route("POST", "/v1/jobs/:role/:env/:name/update", JobWrite),
            post(updates::start_update),
        ),
        (
            route("GET", "/v1/jobs/:role/:env/:name/update", JobRead),
            get(updates::get_update),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/update/pause", JobWrite),
            post(updates::update_pause),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/update/resume", JobWrite),
            post(updates::update_resume),
        ),
        (
            route(
                "POST",
                "/v1/jobs/:role/:env/:name/update/rollback",
                JobWrite,
            ),
            post(updates::update_rollback),
        ),
        (
            route("POST", "/v1/jobs/:role/:env/:name/update/abort", JobWrite),
            post(updates::update_abort),
        ),
        (route("GET", "/v1/tasks/:id", TaskRead), get(jobs::get_task)),
        (
            route("GET", "/v1/tasks/:id/logs/:process/:stream", TaskRead),
            get(logs::task_log),
        ),
        (
            route(
                "GET",
                "/v1/jobs/:role/:env/:name/instances/:instance/exec",
                JobWrite,
            ),
            get(exec::exec_task),
        ),
        (route("GET", "/v1/cluster", ReadAll), get(cluster::cluster)),
        (
            route("POST", "/v1/cluster/eviction-guard/release", Override),
            post(cluster::release_guard),
        ),
        (
            route("GET", "/v1/agents", ReadAll),
            get(cluster::list_agents),
        ),
        // Any reader; a role-scoped token gets its roles' changes only (changes()).
        (route("GET", "/v1/changes", JobList), get(jobs::changes)),
        (
            route("GET", "/v1/services", ServiceList),
            get(services::list),
        ),
        (
            route("GET", "/v1/services/:role/:env/:name", ServiceRead),
            get(services::show),
        ),
        (route("GET", "/v1/hosts", ReadAll), get(hosts::list_hosts)),
        (
            route("POST", "/v1/hosts/cordon", Maintenance),
            post(hosts::cordon_hosts),
        ),
        (
            route("POST", "/v1/hosts/drain", Maintenance),
            post(hosts::drain_hosts),
        ),
        (
            route("POST", "/v1/hosts/activate", Maintenance),
            post(hosts::activate_hosts),
        ),
        (
            route("GET", "/v1/hosts/:host", ReadAll),
            get(hosts::get_host),
        ),
        (
            route("POST", "/v1/agents/register", AgentRegister),
            post(agent_api::register),
        ),
        (
            route("POST", "/v1/agents/:id/heartbeat", Agent),
            post(agent_api::heartbeat),
        ),
        (
            route("GET", "/v1/agents/:id/assignments", Agent),
            get(agent_api::assignments),
        ),
        (
            route("POST", "/v1/agents/:id/updates", Agent),
            post(agent_api::updates),
        ),
        (
            route("POST", "/v1/agents/:id/drain", Agent),
            post(agent_api::agent_drain),
        ),
        (
            route("POST", "/v1/agents/:id/forbid", Maintenance),
            post(cluster::forbid_agent),
        ),
        (
            route("POST", "/v1/agents/:id/allow", Maintenance),
            post(cluster::allow_agent),
        ),
        (
            route("GET", "/v1/quotas", ReadAll),
            get(cluster::list_quotas),
        ),
        (
            route("GET", "/v1/quotas/:role", ReadAll),
            get(cluster::get_quota),
        ),
        (
            route("POST", "/v1/quotas/:role", ManageQuotas),
            post(cluster::set_quota),
        ),
        (
            route("GET", "/v1/roles/:role", JobRead),
            get(cluster::get_role),
        ),
        (
            route("POST", "/v1/roles/:role/grant-user", ManageRoles),
            post(cluster::grant_user),
        ),
        (
            route("POST", "/v1/roles/:role/revoke-user", ManageRoles),
            post(cluster::revoke_user),
        ),
        (route("GET", "/v1/cron", ReadAll), get(jobs::list_cron)),
        (
            route("POST", "/v1/cron/:role/:env/:name/start", JobWrite),
            post(jobs::cron_start),
        ),
        (
            route("POST", "/v1/cron/:role/:env/:name/deschedule", JobWrite),
            post(jobs::cron_deschedule),
        ),
        (
            route("GET", "/v1/tokens", ManageTokens),
            get(tokens::list_tokens),
        ),
        (
            route("POST", "/v1/tokens", ManageTokens),
            post(tokens::create_token),
        ),
        (
            route("POST", "/v1/tokens/:id/revoke", ManageTokens),
            post(tokens::revoke_token),
        ),
    ]
}

/// The route table: every route's method, path and access (tests enumerate it).
pub fn route_table() -> Vec<RouteDef> {
    routes().into_iter().map(|(def, _)| def).collect()
}

/// Every route of the master (from `routes`), each behind `guard`.
pub fn router(api: Shared) -> Router {
    let mut router = Router::new();
    for (def, handler) in routes() {
        router = router.route(def.path, handler);
    }
    let table: Arc<[RouteDef]> = route_table().into();
    let gate = Gate {
        api: api.clone(),
        routes: table.clone(),
    };
    router
        .route_layer(axum::middleware::from_fn_with_state(gate, guard::guard))
        .layer(Extension(table))
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
