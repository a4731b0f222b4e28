//! The agent's HTTP server: sandbox log files for the CLI (`drover task logs`) and a
//! health check. Paths can never leave a sandbox: names are validated and the
//! resolved file must lie inside the task's canonical sandbox directory.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use drover_common::spec::is_valid_name;
use drover_common::wire::{ApiError, ApiErrorBody};
use serde::Deserialize;

use crate::sandbox::Layout;

/// The most bytes one log request returns; clients continue from the next offset.
pub const MAX_CHUNK: u64 = 4 * 1024 * 1024;
/// Header carrying the log file's total size.
pub const LOG_SIZE_HEADER: &str = "x-drover-log-size";

/// Query of a log request.
#[derive(Debug, Default, Deserialize)]
pub struct LogQuery {
    /// Byte offset to read from (default 0).
    #[serde(default)]
    pub offset: u64,
}

/// The log server's routes: `GET /health` and
/// `GET /v1/tasks/{task_id}/logs/{process}/{stdout|stderr}?offset=N`.
pub fn router(layout: Layout) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/tasks/:task_id/logs/:process/:stream", get(get_log))
        .with_state(Arc::new(layout))
}

/// Why a log request is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error("`{value}` is not a valid {field}: use [A-Za-z0-9_.-], 1-64 characters")]
    InvalidName { field: &'static str, value: String },
    #[error("`{0}` is not a log stream; use stdout or stderr")]
    InvalidStream(String),
    #[error("task `{0}` has no sandbox on this agent")]
    UnknownTask(String),
    #[error("task `{task_id}` has no {stream} log for process `{process}`")]
    UnknownLog {
        task_id: String,
        process: String,
        stream: String,
    },
    #[error("the {stream} log of `{process}` resolves outside task `{task_id}`'s sandbox")]
    OutsideSandbox {
        task_id: String,
        process: String,
        stream: String,
    },
    #[error("reading the log failed: {0}")]
    Io(String),
}

impl LogError {
    fn parts(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            LogError::InvalidName { field, .. } => {
                (StatusCode::BAD_REQUEST, "invalid_name", Some(field))
            }
            LogError::InvalidStream(_) => {
                (StatusCode::BAD_REQUEST, "invalid_stream", Some("stream"))
            }
            LogError::UnknownTask(_) => (StatusCode::NOT_FOUND, "not_found", Some("task_id")),
            LogError::UnknownLog { .. } => (StatusCode::NOT_FOUND, "not_found", Some("process")),
            LogError::OutsideSandbox { .. } => {
                (StatusCode::FORBIDDEN, "outside_sandbox", Some("process"))
            }
            LogError::Io(_) => (StatusCode::INTERNAL_SERVER_ERROR, "io_error", None),
        }
    }
}

impl IntoResponse for LogError {
    fn into_response(self) -> Response {
        let (status, code, field) = self.parts();
        let body = ApiErrorBody {
            error: ApiError {
                code: code.to_string(),
                message: self.to_string(),
                field: field.map(str::to_string),
                details: vec![],
            },
        };
        (status, Json(body)).into_response()
    }
}

/// Resolves a log path, refusing anything that would leave the task's sandbox.
pub fn resolve_log_path(
    layout: &Layout,
    task_id: &str,
    process: &str,
    stream: &str,
) -> Result<PathBuf, LogError> {
    for (field, value) in [("task_id", task_id), ("process", process)] {
        if !is_valid_name(value) {
            return Err(LogError::InvalidName {
                field,
                value: value.to_string(),
            });
        }
    }
    if stream != "stdout" && stream != "stderr" {
        return Err(LogError::InvalidStream(stream.to_string()));
    }
    let sandbox = layout
        .sandbox(task_id)
        .canonicalize()
        .map_err(|_| LogError::UnknownTask(task_id.to_string()))?;
    let unknown = || LogError::UnknownLog {
        task_id: task_id.to_string(),
        process: process.to_string(),
        stream: stream.to_string(),
    };
    let file = layout
        .log_file(task_id, process, stream)
        .canonicalize()
        .map_err(|_| unknown())?;
    let root = layout.root().canonicalize().map_err(|_| unknown())?;
    if !sandbox.starts_with(&root) || !file.starts_with(&sandbox) {
        return Err(LogError::OutsideSandbox {
            task_id: task_id.to_string(),
            process: process.to_string(),
            stream: stream.to_string(),
        });
    }
    if !file.is_file() {
        return Err(unknown());
    }
    Ok(file)
}

async fn get_log(
    State(layout): State<Arc<Layout>>,
    Path((task_id, process, stream)): Path<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let file = match resolve_log_path(&layout, &task_id, &process, &stream) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let offset = q.offset;
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<(u64, Vec<u8>)> {
        let mut f = std::fs::File::open(&file)?;
        let size = f.metadata()?.len();
        if offset >= size {
            return Ok((size, Vec::new()));
        }
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::new();
        f.take((size - offset).min(MAX_CHUNK))
            .read_to_end(&mut buf)?;
        Ok((size, buf))
    })
    .await;
    match read {
        Ok(Ok((size, bytes))) => {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(LOG_SIZE_HEADER, HeaderValue::from(size));
            (StatusCode::OK, headers, bytes).into_response()
        }
        Ok(Err(e)) => LogError::Io(e.to_string()).into_response(),
        Err(e) => LogError::Io(e.to_string()).into_response(),
    }
}
