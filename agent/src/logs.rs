//! The agent's HTTP server: task log files for the CLI (`drover task logs`) and a
//! health check. Logs live in the root-owned task directory, out of the task's reach
//! ([`drover_common::layout`]); names are validated, and each log is opened once,
//! without following links, and checked for what was opened ([`open_log`]).
//!
//! The executor creates a log file on its process's first byte of output, so a
//! process of the task (one named in the task directory's `task.json`) without a
//! file has an empty log, served as such; a name the task does not have is a 404.

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use drover_common::spec::is_valid_name;
use drover_common::wire::{ApiError, ApiErrorBody, ExecutorTask};
use serde::Deserialize;

use crate::sys::open_nofollow;
use drover_common::layout::Layout;
pub use drover_common::wire::LOG_SIZE_HEADER;

/// The most bytes one log request returns; clients continue from the next offset.
pub const MAX_CHUNK: u64 = 4 * 1024 * 1024;

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
    #[error("the {stream} log of `{process}` in task `{task_id}` is not a regular file")]
    NotRegularFile {
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
            LogError::NotRegularFile { .. } => {
                (StatusCode::FORBIDDEN, "not_a_file", Some("process"))
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

/// What a log request reads.
#[derive(Debug)]
pub enum LogSource {
    /// The log file, opened (a regular file, reached without following any link).
    File(std::fs::File),
    /// A process of the task that has written nothing yet: no file, an empty log.
    Empty,
}

/// Opens a task's log once, race-free: the task directory, `logs/` and the file are
/// each opened relative to the one before, none through a symlink
/// (`O_NOFOLLOW`), and what was opened is checked (`fstat`: a regular file), not what
/// was named. All three are root's ([`drover_common::layout`]), so a task cannot
/// put anything there; this holds even if something else did. A missing file of a
/// process the task has (per the task directory's `task.json`, root's too) is an
/// empty log; a name the task does not have is [`LogError::UnknownLog`].
pub fn open_log(
    layout: &Layout,
    task_id: &str,
    process: &str,
    stream: &str,
) -> Result<LogSource, LogError> {
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
    let io = |e: std::io::Error| LogError::Io(e.to_string());
    let not_regular = || LogError::NotRegularFile {
        task_id: task_id.to_string(),
        process: process.to_string(),
        stream: stream.to_string(),
    };
    let unknown = || LogError::UnknownLog {
        task_id: task_id.to_string(),
        process: process.to_string(),
        stream: stream.to_string(),
    };
    let dir = match open_nofollow(None, &layout.task_dir(task_id), DIR_FLAGS) {
        Ok(d) => d,
        Err(e) if is_missing_or_link(&e) => return Err(LogError::UnknownTask(task_id.to_string())),
        Err(e) => return Err(io(e)),
    };
    let name = format!("{process}.{stream}");
    let file = open_nofollow(Some(&dir), std::path::Path::new("logs"), DIR_FLAGS)
        .and_then(|logs| open_nofollow(Some(&logs), std::path::Path::new(&name), FILE_FLAGS));
    match file {
        Ok(file) => {
            if !file.metadata().map_err(io)?.is_file() {
                return Err(not_regular());
            }
            Ok(LogSource::File(file))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Only a file that is not there at all (not a symlink, not a directory)
            // can be a log that was never written.
            if task_has_process(&dir, process) {
                Ok(LogSource::Empty)
            } else {
                Err(unknown())
            }
        }
        Err(e) if is_missing_or_link(&e) => Err(not_regular()),
        Err(e) => Err(io(e)),
    }
}

/// `open` flags of a directory on the way to a log.
const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY;
/// `open` flags of a log: non-blocking, so a FIFO in its place cannot hang a reader.
const FILE_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NONBLOCK;

/// ENOENT, or what opening a symlink with `O_NOFOLLOW` gives (ELOOP, or ENOTDIR
/// with `O_DIRECTORY`).
fn is_missing_or_link(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
}

/// Whether the task file in the task directory `dir` names `process`.
fn task_has_process(dir: &std::fs::File, process: &str) -> bool {
    let mut bytes = Vec::new();
    open_nofollow(Some(dir), std::path::Path::new("task.json"), FILE_FLAGS)
        .and_then(|mut f| {
            if !f.metadata()?.is_file() {
                return Err(std::io::Error::other("task.json is not a regular file"));
            }
            f.read_to_end(&mut bytes)
        })
        .is_ok()
        && serde_json::from_slice::<ExecutorTask>(&bytes)
            .is_ok_and(|t| t.task.processes.iter().any(|p| p.name == process))
}

async fn get_log(
    State(layout): State<Arc<Layout>>,
    Path((task_id, process, stream)): Path<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let offset = q.offset;
    let read = tokio::task::spawn_blocking(move || -> Result<(u64, Vec<u8>), LogError> {
        match open_log(&layout, &task_id, &process, &stream)? {
            LogSource::File(f) => read_chunk(f, offset).map_err(|e| LogError::Io(e.to_string())),
            LogSource::Empty => Ok((0, Vec::new())),
        }
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

/// The open file's size and at most [`MAX_CHUNK`] bytes of it from `offset`.
fn read_chunk(mut f: std::fs::File, offset: u64) -> std::io::Result<(u64, Vec<u8>)> {
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
        std::fs::create_dir_all(layout.task_dir("t1")).unwrap();
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
            assert!(matches!(
                open_log(&layout, "t1", "main", stream).unwrap(),
                LogSource::Empty
            ));
        }
    }

    #[test]
    fn a_process_the_task_does_not_have_is_still_not_found() {
        let (_dir, layout) = sandbox_without_logs();
        assert!(matches!(
            open_log(&layout, "t1", "other", "stdout"),
            Err(LogError::UnknownLog { .. })
        ));
        assert!(matches!(
            open_log(&layout, "t2", "main", "stdout"),
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
            open_log(&layout, "t1", "main", "stdout"),
            Ok(LogSource::File(_))
        ));
    }

    #[test]
    fn a_dangling_log_symlink_is_not_an_empty_log() {
        let (dir, layout) = sandbox_without_logs();
        let file = layout.log_file("t1", "main", "stdout");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &file).unwrap();
        assert!(open_log(&layout, "t1", "main", "stdout").is_err());
    }
}
