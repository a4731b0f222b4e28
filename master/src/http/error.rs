//! The API's errors: `ApiErr` (a status and the JSON `ApiErrorBody` with a code,
//! a message and the field at fault) and how the core's, the store's and the token
//! registry's errors become one.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use drover_common::wire::{ApiError, ApiErrorBody};

use crate::core::{CoreError, Reply};
use crate::runtime::ApplyError;
use crate::tokens::TokenError;

/// An API error response.
#[derive(Debug)]
pub struct ApiErr {
    pub(super) status: StatusCode,
    pub(super) body: ApiErrorBody,
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

    pub(super) fn not_found(what: &str, field: &str) -> ApiErr {
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

pub(super) fn unexpected(reply: Reply) -> ApiErr {
    ApiErr::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("unexpected core reply {reply:?}; this is a bug"),
        None,
    )
}

/// 503 `shutting_down` for a long poll the stopping master ends early; `then` says
/// what the client should do.
pub(super) fn shutting_down(then: &str) -> ApiErr {
    ApiErr::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        format!("the master is stopping; {then}"),
        None,
    )
}

/// An error with every cause below it, `outer: inner: ...` (reqwest's own text hides
/// the cause: refused, a certificate not trusted).
pub(super) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}
