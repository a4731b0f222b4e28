//! A standby's answer to the admin API: it forwards the request to the leader
//! and relays the leader's answer, so the CLI, the web UI and scripts work
//! against any master on etcd. Reads answered this way are exactly the leader's;
//! only a read that accepts a stale answer, when the leader gives no answer,
//! comes from the standby's copy (`standby`). Writes are the leader's to accept
//! or refuse. The answer carries `X-Drover-Served-By: <leader URL>`.
//!
//! Not forwarded (the standby answers 503 `not_leader` with `X-Drover-Leader`):
//! agent traffic (agents follow the header to the leader themselves and keep
//! long polls there), `/metrics` (each master's own), a request another master
//! already forwarded (`X-Drover-Proxied-By`: two standbys with stale views never
//! bounce a request between them), and anything while no leader is known.
//! Those rules, and what a failed forward tells the client, are `ha`'s.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::ha::{failure_answer, Failure, LEADER_HEADER};
use crate::http::{ApiErr, MAX_BODY_BYTES};

pub use drover_common::wire::{PROXIED_HEADER, SERVED_BY_HEADER};
/// How long the standby waits to connect to the leader.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Headers that belong to one connection, not to the request or answer.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

fn end_to_end(name: &HeaderName) -> bool {
    !HOP_BY_HOP.contains(&name.as_str()) && name != "content-length"
}

/// The client a standby forwards with: `ca` (PEM) is the cluster CA the
/// masters' certificates chain to, when they serve TLS.
pub fn client(ca: Option<&[u8]>) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(pem) = ca {
        for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| e.to_string())? {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| e.to_string())
}

/// Whether a standby forwards `request` to the leader (`ha::forwardable`).
pub fn forwardable(request: &Request) -> bool {
    crate::ha::forwardable(
        request.uri().path(),
        request.headers().contains_key(PROXIED_HEADER),
    )
}

/// Why forwarding failed (`ha::failure_answer`), naming the leader.
fn failed(failure: Failure, leader: &str, error: impl std::fmt::Display) -> Response {
    let (status, code, message) = failure_answer(failure, leader, &error.to_string());
    let mut resp = ApiErr::new(status, code, message, None).into_response();
    if let Ok(value) = HeaderValue::from_str(leader) {
        resp.headers_mut().insert(LEADER_HEADER, value);
    }
    resp
}

/// Forwards `request` to `leader` (this master being `me`) and relays the answer.
/// When the leader gives no answer, Err with this master's own: a leader that
/// cannot be reached, 503 `not_leader` (nothing was sent: safe to retry); one
/// that took the request but gave no answer, 502 `leader_lost` (it may or may not
/// have been done).
pub async fn forward(
    http: &reqwest::Client,
    leader: &str,
    me: &str,
    request: Request,
) -> Result<Response, Response> {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return Ok(ApiErr::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is larger than {MAX_BODY_BYTES} bytes; send less at once"),
                None,
            )
            .into_response())
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forwarded = http
        .request(parts.method.clone(), format!("{leader}{path}"))
        .timeout(crate::ha::forward_timeout(parts.uri.query()))
        .header(PROXIED_HEADER, me)
        .body(body);
    for (name, value) in parts.headers.iter().filter(|(n, _)| end_to_end(n)) {
        forwarded = forwarded.header(name, value);
    }
    let answer = match forwarded.send().await {
        Ok(a) => a,
        Err(e) if e.is_connect() => return Err(failed(Failure::Unreachable, leader, e)),
        Err(e) => return Err(failed(Failure::NoAnswer, leader, e)),
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => return Err(failed(Failure::StoppedAnswering, leader, e)),
    };
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    for (name, value) in headers.iter().filter(|(n, _)| end_to_end(n)) {
        response.headers_mut().append(name, value.clone());
    }
    if let Ok(value) = HeaderValue::from_str(leader) {
        response.headers_mut().insert(SERVED_BY_HEADER, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> Request {
        Request::builder().uri(path).body(Body::empty()).unwrap()
    }

    #[test]
    fn the_admin_api_is_forwarded_and_agent_traffic_is_not() {
        for path in [
            "/v1/jobs",
            "/v1/agents",
            "/v1/agents/a1/forbid",
            "/ui/",
            "/",
        ] {
            assert!(forwardable(&request(path)), "{path}");
        }
        for path in [
            "/v1/agents/register",
            "/v1/agents/a1/heartbeat",
            "/v1/agents/a1/assignments",
            "/v1/agents/a1/updates",
            "/v1/agents/a1/drain",
            "/metrics",
        ] {
            assert!(!forwardable(&request(path)), "{path}");
        }
        let mut again = request("/v1/jobs");
        again
            .headers_mut()
            .insert(PROXIED_HEADER, HeaderValue::from_static("http://m1"));
        assert!(!forwardable(&again), "forwarded once already");
    }
}
