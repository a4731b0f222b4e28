//! `GET /v1/tasks/{task_id}/exec` on the log server (the master's only): one command
//! run inside a running task for `drover task exec`, over an HTTP upgrade
//! (`Upgrade: drover-exec`) carrying [`ExecFrame`]s.
//!
//! The agent checks the task (RUNNING in its executor's checkpoint, the process
//! named), then starts `drover-executor exec` (executor/src/exec.rs), which enters the
//! task as that process runs and forks the command. The command's stdio are pipes, or
//! with `tty` a PTY whose master the agent keeps; the agent relays bytes between them
//! and the stream, sets the window size, passes signals on (to the helper, which
//! passes them to the command), and sends the exit status last. When the stream
//! closes first, the helper gets SIGHUP (passed on), then SIGKILL 2 s later.

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use drover_common::layout::Layout;
use drover_common::state::TaskState;
use drover_common::wire::{ApiError, ApiErrorBody, ExecFrame, ExecQuery, EXEC_PROTOCOL};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;

use crate::sandbox::SandboxIo as _;

/// What the exec route needs.
#[derive(Debug, Clone)]
pub struct ExecState {
    pub layout: Layout,
    /// The `drover-executor` binary.
    pub executor: PathBuf,
    /// Where the cgroup filesystem is mounted.
    pub cgroup_root: PathBuf,
}

/// The route `GET /v1/tasks/{task_id}/exec`.
pub fn router(state: ExecState) -> Router {
    Router::new()
        .route("/v1/tasks/:task_id/exec", get(exec))
        .with_state(Arc::new(state))
}

fn error(status: StatusCode, code: &str, field: Option<&str>, message: String) -> Response {
    let body = ApiErrorBody {
        error: ApiError {
            code: code.to_string(),
            message,
            field: field.map(str::to_string),
            details: vec![],
        },
    };
    (status, Json(body)).into_response()
}

/// The helper's stdio as the agent holds them.
enum ChildIo {
    Pty(OwnedFd),
    Pipes {
        stdin: Option<tokio::process::ChildStdin>,
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
    },
}

async fn exec(
    State(st): State<Arc<ExecState>>,
    Path(task_id): Path<String>,
    q: Result<Query<ExecQuery>, axum::extract::rejection::QueryRejection>,
    mut request: Request,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_command",
                Some("command"),
                format!("{e}: exec takes command=[\"CMD\",...] (a JSON array)"),
            )
        }
    };
    if !drover_common::spec::is_valid_name(&task_id) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            Some("task_id"),
            format!("`{task_id}` is not a valid task id"),
        );
    }
    let argv = match q.argv() {
        Ok(argv) => argv,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_command",
                Some("command"),
                e,
            )
        }
    };
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok());
    if upgrade != Some(EXEC_PROTOCOL) {
        return error(
            StatusCode::BAD_REQUEST,
            "upgrade_required",
            None,
            format!(
                "exec needs an HTTP/1.1 upgrade: `Connection: upgrade`, `Upgrade: {EXEC_PROTOCOL}`"
            ),
        );
    }
    let Some(status) = st.layout.read_status(&task_id) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            Some("task_id"),
            format!("task {task_id} has no executor on this agent"),
        );
    };
    if status.state != TaskState::Running {
        return error(
            StatusCode::CONFLICT,
            "task_not_running",
            Some("task_id"),
            format!(
                "task {task_id} is {}, not RUNNING: exec needs a running task",
                status.state
            ),
        );
    }
    let running = status.processes.iter().filter(|p| p.pid.is_some());
    let process = match &q.process {
        Some(name) => running.clone().find(|p| &p.name == name),
        None => running.clone().next(),
    };
    let Some((name, pid)) = process.and_then(|p| Some((p.name.clone(), p.pid?))) else {
        let names: Vec<&str> = running.map(|p| p.name.as_str()).collect();
        return error(
            StatusCode::CONFLICT,
            "process_not_running",
            Some("process"),
            match &q.process {
                Some(p) => format!(
                    "process `{p}` of task {task_id} is not running (running: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
                None => format!("task {task_id} has no running process to exec beside"),
            },
        );
    };
    let (child, io) = match start(&st, &task_id, pid, &q, &argv) {
        Ok(started) => started,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "exec_failed",
                None,
                format!("cannot start {}: {e}", st.executor.display()),
            )
        }
    };
    tracing::info!(task_id, process = %name, ?argv, tty = q.tty, "exec");
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => relay(hyper_util::rt::TokioIo::new(upgraded), child, io).await,
            Err(e) => {
                tracing::warn!(error = %e, "exec: the upgrade failed; ending the command");
                end(child).await;
            }
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response
        .headers_mut()
        .insert(header::UPGRADE, HeaderValue::from_static(EXEC_PROTOCOL));
    response
}

/// Starts the helper with the command's stdio.
fn start(
    st: &ExecState,
    task_id: &str,
    pid: u32,
    q: &ExecQuery,
    argv: &[String],
) -> std::io::Result<(tokio::process::Child, ChildIo)> {
    let mut cmd = tokio::process::Command::new(&st.executor);
    cmd.arg("exec")
        .arg("--task-dir")
        .arg(st.layout.task_dir(task_id))
        .arg("--pid")
        .arg(pid.to_string())
        .arg("--cgroup-root")
        .arg(&st.cgroup_root);
    if q.tty {
        cmd.arg("--tty");
    }
    cmd.arg("--").args(argv).kill_on_drop(false);
    // Under the agent's spawn lock: no executor started meanwhile inherits the PTY.
    let _spawning = crate::executor::lock_spawn();
    if q.tty {
        let size = nix::pty::Winsize {
            ws_row: q.rows.unwrap_or(24),
            ws_col: q.cols.unwrap_or(80),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).map_err(std::io::Error::from)?;
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                fd.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(std::io::Error::from)?;
        }
        let stdin = if q.stdin {
            Stdio::from(pty.slave.try_clone()?)
        } else {
            Stdio::null()
        };
        cmd.stdin(stdin)
            .stdout(Stdio::from(pty.slave.try_clone()?))
            .stderr(Stdio::from(pty.slave));
        let child = cmd.spawn()?;
        nix::fcntl::fcntl(
            pty.master.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(std::io::Error::from)?;
        return Ok((child, ChildIo::Pty(pty.master)));
    }
    cmd.stdin(if q.stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let io = ChildIo::Pipes {
        stdin: child.stdin.take(),
        stdout: child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout pipe"))?,
        stderr: child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("no stderr pipe"))?,
    };
    Ok((child, io))
}

/// Ends the helper: SIGHUP (passed on to the command), SIGKILL 2 s later.
async fn end(mut child: tokio::process::Child) {
    signal(&child, libc::SIGHUP);
    if tokio::time::timeout(Duration::from_secs(2), child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

fn signal(child: &tokio::process::Child, sig: i32) {
    if let (Some(pid), Ok(sig)) = (child.id(), nix::sys::signal::Signal::try_from(sig)) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
    }
}

/// The exit status as the CLI reports it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Reads the PTY master until the terminal hangs up (EIO) and sends it as stdout.
async fn read_pty(pty: Arc<AsyncFd<OwnedFd>>, out: mpsc::Sender<ExecFrame>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let Ok(mut guard) = pty.readable().await else {
            return;
        };
        match guard.try_io(|fd| {
            nix::unistd::read(fd.get_ref().as_raw_fd(), &mut buf).map_err(std::io::Error::from)
        }) {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => {
                if out
                    .send(ExecFrame::Stdout(buf[..n].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(_would_block) => continue,
        }
    }
}

/// Writes all of `data` to the PTY master.
async fn write_pty(pty: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = pty.writable().await?;
        match guard
            .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
        {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

async fn read_pipe(
    mut pipe: impl AsyncRead + Unpin,
    out: mpsc::Sender<ExecFrame>,
    frame: fn(Vec<u8>) -> ExecFrame,
) {
    let mut buf = vec![0u8; 32 * 1024];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 || out.send(frame(buf[..n].to_vec())).await.is_err() {
            return;
        }
    }
}

/// How long output is still read after the command exited (a background process
/// of it may hold the pipe open).
const DRAIN: Duration = Duration::from_secs(1);

/// Relays between the upgraded stream and the helper until it exits; the exit status
/// goes last.
async fn relay<S>(stream: S, mut child: tokio::process::Child, io: ChildIo)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (out_tx, mut out_rx) = mpsc::channel::<ExecFrame>(64);
    let mut readers = tokio::task::JoinSet::new();
    let (pty, mut stdin) = match io {
        ChildIo::Pty(master) => match crate::sys::async_fd(master) {
            Ok(fd) => {
                let fd = Arc::new(fd);
                readers.spawn(read_pty(fd.clone(), out_tx.clone()));
                (Some(fd), None)
            }
            Err(e) => {
                let _ = wr
                    .write_all(
                        &ExecFrame::Error(format!("cannot watch the terminal: {e}")).encode(),
                    )
                    .await;
                end(child).await;
                return;
            }
        },
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            readers.spawn(read_pipe(stdout, out_tx.clone(), ExecFrame::Stdout));
            readers.spawn(read_pipe(stderr, out_tx.clone(), ExecFrame::Stderr));
            (None, stdin)
        }
    };
    drop(out_tx);
    // The writer: every frame to the stream, in order.
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if wr.write_all(&frame.encode()).await.is_err() {
                return None;
            }
        }
        Some(wr)
    });
    let mut inbuf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 32 * 1024];
    let mut client_open = true;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            read = rd.read(&mut chunk), if client_open => {
                let n = match read {
                    Ok(0) | Err(_) => {
                        // The client is gone: end the command.
                        client_open = false;
                        signal(&child, libc::SIGHUP);
                        let ended = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
                        if ended.is_err() {
                            let _ = child.start_kill();
                        }
                        continue;
                    }
                    Ok(n) => n,
                };
                inbuf.extend_from_slice(&chunk[..n]);
                loop {
                    let (frame, used) = match ExecFrame::decode(&inbuf) {
                        Ok(Some(pair)) => pair,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "exec: a malformed frame; ending the command");
                            client_open = false;
                            let _ = child.start_kill();
                            break;
                        }
                    };
                    inbuf.drain(..used);
                    match frame {
                        ExecFrame::Stdin(data) => {
                            if let Some(pty) = &pty {
                                let _ = write_pty(pty, &data).await;
                            } else if let Some(w) = stdin.as_mut() {
                                if w.write_all(&data).await.is_err() {
                                    stdin = None;
                                }
                            }
                        }
                        ExecFrame::StdinEof => {
                            if let Some(pty) = &pty {
                                // The terminal's end-of-file character (VEOF, ^D).
                                let _ = write_pty(pty, &[4]).await;
                            }
                            stdin = None;
                        }
                        ExecFrame::Resize { rows, cols } => {
                            if let Some(pty) = &pty {
                                let _ = crate::sys::set_window_size(pty.get_ref().as_fd(), rows, cols);
                            }
                        }
                        ExecFrame::Signal(sig) => signal(&child, sig),
                        _ => {}
                    }
                }
            }
        }
    };
    drop(stdin);
    let code = status.map_or(1, exit_code);
    // What the command wrote before it ended, then the status.
    let _ = tokio::time::timeout(DRAIN, async {
        while readers.join_next().await.is_some() {}
    })
    .await;
    readers.abort_all();
    drop(pty);
    // The readers' senders are gone, so the writer ends; the status goes last.
    let _ = finish(writer, code).await;
}

/// Sends the exit status once the writer has sent everything before it.
async fn finish(
    writer: tokio::task::JoinHandle<Option<tokio::io::WriteHalf<impl AsyncWrite>>>,
    code: i32,
) -> Option<()> {
    let mut wr = writer.await.ok()??;
    wr.write_all(&ExecFrame::Exit(code).encode()).await.ok()?;
    wr.flush().await.ok()?;
    wr.shutdown().await.ok()
}
