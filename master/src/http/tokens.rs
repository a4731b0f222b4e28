//! The token registry's API: list, create (the kind and scope checked) and revoke.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use drover_common::wire::{self, ApiErrorBody};

use super::api::Shared;
use super::body::{json, read_json};
use super::error::ApiErr;
use super::params;
use crate::auth::Principal;

#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "tokens",
    responses(
        (status = 200, description = "Every token, oldest first, without secrets.", body = Vec<wire::TokenInfo>),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn list_tokens(State(api): State<Shared>) -> Response {
    json(StatusCode::OK, &api.tokens.list())
}

#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "tokens",
    request_body = wire::CreateTokenRequest,
    responses(
        (status = 201, description = "The token and its secret (shown only here).", body = wire::CreateTokenResponse),
        (status = "default", description = "An error (docs/api.md, Errors).", body = ApiErrorBody),
    ),
)]
pub(super) async fn create_token(
    State(api): State<Shared>,
    Extension(who): Extension<Principal>,
    body: Body,
) -> Result<Response, ApiErr> {
    let req: wire::CreateTokenRequest = read_json(body).await?;
    let (grant, description) = drover_common::validate::token_request(req).map_err(|e| {
        ApiErr::new(
            StatusCode::BAD_REQUEST,
            "invalid_token_request",
            e.message,
            Some(&e.field),
        )
    })?;
    let (info, token) = api.tokens.create(
        grant,
        description,
        &who.token_id,
        drover_common::state::now_ms(),
    )?;
    Ok(json(
        StatusCode::CREATED,
        &wire::CreateTokenResponse { info, token },
    ))
}

#[utoipa::path(
    post,
    path = "/v1/tokens/{id}/revoke",
    tag = "tokens",
    params(params::TokenPath),
    responses(
        (status = 200, description = "The token, revoked.", body = wire::TokenInfo),
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
