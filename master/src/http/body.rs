//! The parts of a request and a response every handler shares: bounded bodies
//! (size, time, nesting), JSON in and out, a core reply as a response, query
//! numbers and job keys from paths.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::{unexpected, ApiErr};
use crate::core::Reply;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Largest accepted body on the agent API (full task sets and update batches of big
/// agents).
pub const MAX_AGENT_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Deepest accepted JSON nesting.
pub const MAX_JSON_DEPTH: usize = 64;
/// Default and largest long-poll wait.
pub(super) const DEFAULT_WAIT_MS: u64 = 30_000;
pub(super) const MAX_WAIT_MS: u64 = 120_000;

/// How long a client may take to send a request's body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads a bounded body as text (within `BODY_READ_TIMEOUT`), rejecting deep
/// nesting.
pub(super) async fn read_body(body: Body, limit: usize) -> Result<String, ApiErr> {
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

pub(super) async fn read_json<T: DeserializeOwned>(body: Body) -> Result<T, ApiErr> {
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

pub(super) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (status, Json(value)).into_response()
}

/// 200 with the body of a reply that carries one; a reply without one is a bug.
pub(super) fn ok_reply(reply: Reply) -> Result<Response, ApiErr> {
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

pub(super) fn query_u64(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, ApiErr> {
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

pub(super) fn key_of(role: &str, env: &str, name: &str) -> String {
    format!("{role}/{env}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
