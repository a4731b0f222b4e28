//! The master's OpenAPI 3 contract, generated from the code: the `#[utoipa::path]`
//! annotation on every handler in `http/`, the `ToSchema` derives on the API types
//! (common's `wire`, `spec`, `state`), and the route table `routes()` it is handed,
//! whose access rule each operation carries as `x-drover-access`. Served at `GET
//! /v1/openapi.json` and committed as docs/openapi.json; tests check that the
//! committed file is this one and that the contract and `routes()` name the same
//! routes.

use std::sync::{Arc, OnceLock};

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as Contract;
use utoipa::{Modify, OpenApi};

use super::guard::{Access, RouteDef};
use super::{agent_api, cluster, exec, hosts, jobs, logs, meta, services, tokens, updates};

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
        meta::health,
        meta::metrics,
        openapi_json,
        jobs::create_job,
        jobs::list_jobs,
        jobs::get_job,
        jobs::kill_job,
        jobs::restart_job,
        updates::start_update,
        updates::get_update,
        updates::update_pause,
        updates::update_resume,
        updates::update_rollback,
        updates::update_abort,
        jobs::get_task,
        logs::task_log,
        exec::exec_task,
        cluster::cluster,
        cluster::release_guard,
        cluster::list_agents,
        jobs::changes,
        services::list,
        services::show,
        hosts::list_hosts,
        hosts::cordon_hosts,
        hosts::drain_hosts,
        hosts::activate_hosts,
        hosts::get_host,
        agent_api::register,
        agent_api::heartbeat,
        agent_api::assignments,
        agent_api::updates,
        agent_api::agent_drain,
        cluster::forbid_agent,
        cluster::allow_agent,
        cluster::list_quotas,
        cluster::get_quota,
        cluster::set_quota,
        cluster::get_role,
        cluster::grant_user,
        cluster::revoke_user,
        jobs::list_cron,
        jobs::cron_start,
        jobs::cron_deschedule,
        tokens::list_tokens,
        tokens::create_token,
        tokens::revoke_token,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
struct ApiDoc;

/// This API's OpenAPI 3 contract (no token): the same document as docs/openapi.json.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "This contract (OpenAPI 3.1).", body = Object),
    ),
)]
pub(super) async fn openapi_json(Extension(routes): Extension<Arc<[RouteDef]>>) -> Response {
    static CONTRACT: OnceLock<String> = OnceLock::new();
    let text = CONTRACT.get_or_init(|| contract_json(&routes));
    ([(header::CONTENT_TYPE, "application/json")], text.as_str()).into_response()
}

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

/// The contract: the annotated operations, each with the access rule the route
/// table gives it (`x-drover-access`); public routes need no token.
pub fn contract(routes: &[RouteDef]) -> Contract {
    let mut contract = ApiDoc::openapi();
    for def in routes {
        let Some(op) = operation_mut(&mut contract, def) else {
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
pub fn contract_json(routes: &[RouteDef]) -> String {
    let mut text = contract(routes)
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
        let mut table: Vec<(String, String)> = crate::http::route_table()
            .iter()
            .map(|d| (d.method.to_string(), openapi_path(d.path)))
            .collect();
        table.sort();
        let contract = contract_routes(&contract(&crate::http::route_table()));
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
        let contract = contract(&crate::http::route_table());
        let json = serde_json::to_value(&contract).expect("contract serializes");
        for def in crate::http::route_table() {
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
        let generated = contract_json(&crate::http::route_table());
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
