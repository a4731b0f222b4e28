//! The agent's HTTP server: sandbox log files for the CLI (`drover task logs`) and a
//! health check. Paths can never leave a sandbox: names are validated and the
//! resolved file must lie inside the task's canonical sandbox directory.
//!
//! The executor creates a log file on its process's first byte of output, so a
//! process of the task (one named in the sandbox's `.drover/task.json`) without a
//! file has an empty log, served as such; a name the task does not have is a 404.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use drover_common::spec::is_valid_name;
use drover_common::wire::{ApiError, ApiErrorBody, ExecutorTask};
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

/// What a log request reads.
#[derive(Debug, PartialEq, Eq)]
pub enum LogSource {
    /// The log file (canonical, inside the sandbox).
    File(PathBuf),
    /// A process of the task that has written nothing yet: no file, an empty log.
    Empty,
}

/// Resolves a log like [`resolve_log_path`], except that a missing file of a process
/// the task has (in the sandbox's `.drover/task.json`) is an empty log, not an error.
pub fn resolve_log(
    layout: &Layout,
    task_id: &str,
    process: &str,
    stream: &str,
) -> Result<LogSource, LogError> {
    match resolve_log_path(layout, task_id, process, stream) {
        Ok(file) => Ok(LogSource::File(file)),
        Err(e @ LogError::UnknownLog { .. }) => {
            // Only a file that is not there at all (not a dangling symlink, not a
            // directory) can be a log that was never written.
            let missing = std::fs::symlink_metadata(layout.log_file(task_id, process, stream))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
            if missing && task_has_process(layout, task_id, process) {
                Ok(LogSource::Empty)
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether the task file in the task's sandbox (itself inside the sandbox root, the
/// file inside the sandbox, both canonical) names `process`.
fn task_has_process(layout: &Layout, task_id: &str, process: &str) -> bool {
    let (Ok(root), Ok(sandbox), Ok(file)) = (
        layout.root().canonicalize(),
        layout.sandbox(task_id).canonicalize(),
        layout.task_file(task_id).canonicalize(),
    ) else {
        return false;
    };
    if !sandbox.starts_with(&root) || !file.starts_with(&sandbox) {
        return false;
    }
    std::fs::read(&file)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<ExecutorTask>(&bytes).ok())
        .is_some_and(|t| t.task.processes.iter().any(|p| p.name == process))
}

async fn get_log(
    State(layout): State<Arc<Layout>>,
    Path((task_id, process, stream)): Path<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let offset = q.offset;
    let read = tokio::task::spawn_blocking(move || -> Result<(u64, Vec<u8>), LogError> {
        let file = match resolve_log(&layout, &task_id, &process, &stream)? {
            LogSource::File(f) => f,
            LogSource::Empty => return Ok((0, Vec::new())),
        };
        read_chunk(&file, offset).map_err(|e| LogError::Io(e.to_string()))
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
        Ok(Err(e)) => e.into_response(),
        Err(e) => LogError::Io(e.to_string()).into_response(),
    }
}

/// The file's size and at most [`MAX_CHUNK`] bytes of it from `offset`.
fn read_chunk(file: &std::path::Path, offset: u64) -> std::io::Result<(u64, Vec<u8>)> {
    let mut f = std::fs::File::open(file)?;
    let size = f.metadata()?.len();
    if offset >= size {
        return Ok((size, Vec::new()));
    }
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.take((size - offset).min(MAX_CHUNK))
        .read_to_end(&mut buf)?;
    Ok((size, buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox of task t1 whose task file names process `main`, and no logs.
    fn sandbox_without_logs() -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("sandboxes"));
        std::fs::create_dir_all(layout.drover_dir("t1")).unwrap();
        let task = serde_json::json!({
            "task_id": "t1", "role": "r", "environment": "e", "name": "n", "instance": 0,
            "task": {"resources": {"cpu": 0.1, "ram": "1MiB", "disk": "1MiB"},
                     "processes": [{"name": "main", "cmdline": "true"}]},
            "ports": {}
        });
        std::fs::write(layout.task_file("t1"), task.to_string()).unwrap();
        (dir, layout)
    }

    #[test]
    fn a_process_that_wrote_nothing_has_an_empty_log() {
        let (_dir, layout) = sandbox_without_logs();
        for stream in ["stdout", "stderr"] {
            assert_eq!(
                resolve_log(&layout, "t1", "main", stream).unwrap(),
                LogSource::Empty
            );
        }
    }

    #[test]
    fn a_process_the_task_does_not_have_is_still_not_found() {
        let (_dir, layout) = sandbox_without_logs();
        assert!(matches!(
            resolve_log(&layout, "t1", "other", "stdout"),
            Err(LogError::UnknownLog { .. })
        ));
        assert!(matches!(
            resolve_log(&layout, "t2", "main", "stdout"),
            Err(LogError::UnknownTask(_))
        ));
    }

    #[test]
    fn a_written_log_is_served_from_its_file() {
        let (_dir, layout) = sandbox_without_logs();
        let file = layout.log_file("t1", "main", "stdout");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"hi").unwrap();
        assert!(matches!(
            resolve_log(&layout, "t1", "main", "stdout"),
            Ok(LogSource::File(_))
        ));
    }

    #[test]
    fn a_dangling_log_symlink_is_not_an_empty_log() {
        let (dir, layout) = sandbox_without_logs();
        let file = layout.log_file("t1", "main", "stdout");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &file).unwrap();
        assert!(resolve_log(&layout, "t1", "main", "stdout").is_err());
    }
}
