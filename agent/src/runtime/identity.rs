//! Who this agent is and what it proves: the stable agent id (kept in the data dir
//! and in the sandbox root), the token it sends the master, and the log server's key
//! and the gate that asks for it (or, over TLS, for a master's certificate).

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::outbox::write_atomic;

fn read_id(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(id) if !id.trim().is_empty() => Ok(Some(id.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The stable agent id: `<data_dir>/agent-id`, else the copy kept in
/// `<sandbox_root>/.agent-id` (so a lost data dir keeps the id and the master keeps
/// the tasks), else a new `<hostname>-<12 hex>`. Both files are (re)written.
pub fn load_or_create_agent_id(
    data_dir: &Path,
    sandbox_root: &Path,
    hostname: &str,
) -> std::io::Result<String> {
    let path = data_dir.join("agent-id");
    let copy = sandbox_root.join(".agent-id");
    let saved = read_id(&path)?;
    let id = match saved.clone() {
        Some(id) => id,
        None => match read_id(&copy)? {
            Some(id) => {
                tracing::warn!(agent_id = %id, "agent id missing from data_dir; recovered it from the sandbox root");
                id
            }
            None => new_agent_id(hostname),
        },
    };
    if saved.as_deref() != Some(id.as_str()) {
        write_atomic(&path, id.as_bytes(), true)?;
    }
    if read_id(&copy)?.as_deref() != Some(id.as_str()) {
        write_atomic(&copy, id.as_bytes(), true)?;
    }
    Ok(id)
}

fn new_agent_id(hostname: &str) -> String {
    // FNV over the kernel's random uuid (plus pid and time as a fallback).
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    let seed = format!("{uuid}{}{:?}", std::process::id(), SystemTime::now());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let host: String = hostname
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!("{host}-{:012x}", h & 0xffff_ffff_ffff)
}

/// The agent's token for the master from `path` (None, with a warning, when the
/// file is missing or empty: the master then refuses the agent with 401).
pub(super) fn read_token(path: &std::path::Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => Some(text.trim().to_string()),
        Ok(_) | Err(_) => {
            tracing::warn!(token_file = %path.display(), "no agent token: the master will refuse this agent; an admin creates one with `drover token create --role agent` and writes it to this file (mode 0600)");
            None
        }
    }
}

/// A new secret for the log server: 256 random bits, hex.
pub(super) fn new_logs_key() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the agent's HTTP server accepts.
pub(super) struct Keys {
    /// The log server's key, given to the master at registration: every route.
    /// None when the log server serves TLS: a master's client certificate instead.
    pub logs: Option<String>,
    /// The token of `metrics_token_file`: `GET /metrics` only.
    pub metrics: Option<String>,
}

/// The agent's metrics token from `path`: 16-256 printable ASCII characters (the
/// error says what is wrong; the agent does not start without it).
pub(super) fn read_metrics_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let token = text.trim();
    if !(16..=256).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "must hold one token of 16-256 printable characters (e.g. `openssl rand -hex 32`)"
                .to_string(),
        );
    }
    Ok(token.to_string())
}

/// Whether `given` is `key`, compared in constant time (`subtle`).
fn same_secret(given: &str, key: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    given.len() == key.len() && bool::from(given.as_bytes().ct_eq(key.as_bytes()))
}

/// The HTTP server's gate: `/health` is open; `GET /metrics` takes the metrics
/// token as a bearer token; every route takes, over TLS, a master's client
/// certificate (`crate::tls`), else `Authorization: Bearer <logs key>`. Anything
/// else is 401 (no credential) or 403 (a certificate that is not a master's).
pub(super) async fn require_logs_key(
    axum::extract::State(keys): axum::extract::State<Arc<Keys>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let path = request.uri().path();
    if path == "/health" {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let metrics = path == "/metrics";
    let metrics_token = keys.metrics.as_deref().filter(|_| metrics);
    let cert = request.extensions().get::<crate::tls::PeerCert>();
    let allowed = match &keys.logs {
        Some(key) => same_secret(given, key),
        None => cert.is_some_and(|c| c.is_master()),
    };
    if allowed || metrics_token.is_some_and(|t| same_secret(given, t)) {
        return next.run(request).await;
    }
    let (status, code, message) = match (&keys.logs, cert) {
        (None, Some(_)) if !metrics => (
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "this client certificate is not a master's (master.drover): the agent's logs are read through the master: drover task logs, or GET /v1/tasks/{id}/logs/{process}/{stream} on the master",
        ),
        _ if metrics => (
            axum::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the agent's /metrics needs the token of its metrics_token_file as a bearer token (docs/agent.md, Metrics)",
        ),
        _ => (
            axum::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the agent's logs are read through the master: drover task logs, or GET /v1/tasks/{id}/logs/{process}/{stream} on the master",
        ),
    };
    (
        status,
        axum::Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh temp dir (dropped with the first element) with empty `data` and
    /// `root` directories: a data dir and a sandbox root.
    fn data_and_sandbox_root() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (data, root) = (dir.path().join("data"), dir.path().join("root"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        (dir, data, root)
    }

    #[test]
    fn agent_id_is_created_once_and_kept() {
        let (_dir, data, root) = data_and_sandbox_root();
        let a = load_or_create_agent_id(&data, &root, "host.example").unwrap();
        let b = load_or_create_agent_id(&data, &root, "other").unwrap();
        assert_eq!(a, b);
        assert!(a.starts_with("host-example-"), "{a}");
    }

    #[test]
    fn a_lost_data_dir_keeps_the_agent_id_from_the_sandbox_root() {
        let (_dir, data, root) = data_and_sandbox_root();
        let a = load_or_create_agent_id(&data, &root, "h").unwrap();
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        assert_eq!(load_or_create_agent_id(&data, &root, "h").unwrap(), a);
        assert_eq!(std::fs::read_to_string(data.join("agent-id")).unwrap(), a);
    }
}
