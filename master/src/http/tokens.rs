//! The token registry's API: list, create (the kind and scope checked) and revoke.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use drover_common::wire::ApiErrorBody;
use serde::Serialize;

use super::api::Shared;
use super::body::{json, read_json};
use super::error::ApiErr;
use super::params;
use crate::auth::{Grant, Principal};
use crate::tokens::TokenInfo;

#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "tokens",
    responses(
        (status = 200, description = "Every token, oldest first, without secrets.", body = Vec<TokenInfo>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list_tokens(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.tokens.list())
}

/// Body of POST /v1/tokens: `{"kind": "admin" | "operator" | "agent"}` (an agent
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
                    format!("kind `{other}` is not one of admin, operator, roles, agent"),
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
pub(super) async fn create_token(
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
    params(params::TokenPath),
    responses(
        (status = 200, description = "The token, revoked.", body = TokenInfo),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn revoke_token(
    State(api): State<Shared>,
    Path(id): Path<String>,
) -> Result<Response, ApiErr> {
    let info = api.tokens.revoke(&id, drover_common::state::now_ms())?;
    Ok(json(StatusCode::OK, &info))
}
