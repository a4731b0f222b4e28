//! The resident fork server (`drover-executor zygote`): started once per
//! agent, asked to fork each executor; restarted once when it misbehaves, else
//! the executor is exec'd.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_common::wire::{ZygoteReply, ZygoteRequest};

use super::process::{spawn_inheriting, ExecutorProcess, ReadyPipe};
use crate::sys::{received_fds, watch_pidfd};

/// How long one request to the fork server may take before it counts as dead.
const ZYGOTE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a fork server failed to start, how long executors are exec'd before the
/// next start is tried.
const ZYGOTE_RETRY: Duration = Duration::from_secs(30);
/// Largest fork server reply read.
const ZYGOTE_REPLY_MAX: usize = 4096;

/// The resident fork server (`drover-executor zygote`): one per agent, started at
/// agent start, asked to fork each executor instead of exec'ing the binary again.
/// Requests are serialized (one in flight) and bounded by a timeout. When it is gone
/// or misbehaves it is restarted once and the request retried; otherwise that
/// executor is exec'd: a task never fails because of the fork server.
///
/// It keeps running the executor binary it started with until it is restarted (the
/// agent's restart): replacing the binary on disk does not reach it.
pub struct ForkServer {
    binary: PathBuf,
    inner: std::sync::Mutex<ForkInner>,
}

struct ForkInner {
    zygote: Option<Zygote>,
    /// No start is tried before this (after a failed one).
    retry_at: Option<std::time::Instant>,
}

/// One running fork server: our end of its socket, and the process to reap.
struct Zygote {
    socket: OwnedFd,
    process: std::process::Child,
}

/// Why a request to the fork server got no `started`.
enum ZygoteFailure {
    /// It said no: nothing was forked; exec explains the problem better.
    Refused(String),
    /// The request never reached it: nothing was forked.
    NotSent(std::io::Error),
    /// Sent, but no readable answer: a child may or may not have been forked.
    Lost(String),
}

impl ForkServer {
    /// A fork server for `binary`, started right away (a failure is logged and the
    /// next executor start tries again after `ZYGOTE_RETRY`; until then executors are
    /// exec'd).
    pub fn start(binary: &Path) -> ForkServer {
        let server = ForkServer {
            binary: binary.to_path_buf(),
            inner: std::sync::Mutex::new(ForkInner {
                zygote: None,
                retry_at: None,
            }),
        };
        server.lock().running(&server.binary);
        server
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ForkInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes our end (the fork server exits; executors it forked keep running) and
    /// reaps it.
    pub fn stop(&self) {
        if let Some(z) = self.lock().zygote.take() {
            z.stop(false);
        }
    }

    /// Asks the fork server to start an executor with `args` (`run ...`). None: it
    /// could not, and the caller execs the executor with `ready` (which may have been
    /// replaced by a fresh pipe).
    pub(super) fn fork(
        &self,
        task_id: &str,
        args: &[String],
        stderr: &fs::File,
        ready: &mut ReadyPipe,
        connection: BorrowedFd<'_>,
    ) -> Option<ExecutorProcess> {
        let mut inner = self.lock();
        for attempt in 0..2 {
            let tx = ready.tx.as_ref()?;
            let zygote = inner.running(&self.binary)?;
            let failure = match zygote.request(args, tx.as_fd(), stderr.as_fd(), connection) {
                Ok((pid, Some(pidfd))) => match watch_pidfd(pidfd) {
                    Ok(pidfd) => return Some(ExecutorProcess::Forked { pid, pidfd }),
                    Err(e) => {
                        tracing::warn!(task_id, pid, error = %e, "cannot watch the forked executor's pidfd; following it through its checkpoint");
                        return Some(ExecutorProcess::Untracked { pid: Some(pid) });
                    }
                },
                Ok((pid, None)) => {
                    tracing::warn!(
                        task_id,
                        pid,
                        "forked executor without a pidfd; following it through its checkpoint"
                    );
                    return Some(ExecutorProcess::Untracked { pid: Some(pid) });
                }
                Err(f) => f,
            };
            match failure {
                ZygoteFailure::Refused(error) => {
                    tracing::warn!(
                        task_id,
                        error,
                        "the executor fork server refused; exec'ing the executor"
                    );
                    return None;
                }
                ZygoteFailure::NotSent(e) => {
                    tracing::warn!(task_id, attempt, error = %e, "the executor fork server is gone; restarting it");
                    if let Some(z) = inner.zygote.take() {
                        z.stop(true);
                    }
                }
                ZygoteFailure::Lost(error) => {
                    tracing::warn!(
                        task_id,
                        attempt,
                        error,
                        "no answer from the executor fork server; restarting it"
                    );
                    if let Some(z) = inner.zygote.take() {
                        z.stop(true);
                    }
                    // With the fork server dead, only a child it forked can hold the
                    // write end: then that child is the task's executor.
                    if ready.has_writer() {
                        return Some(ExecutorProcess::Untracked { pid: None });
                    }
                    *ready = ReadyPipe::new().ok()?;
                }
            }
        }
        None
    }
}

impl ForkInner {
    /// The running fork server, started when there is none (unless a start failed
    /// less than `ZYGOTE_RETRY` ago).
    fn running(&mut self, binary: &Path) -> Option<&Zygote> {
        if self.zygote.is_none() {
            if self
                .retry_at
                .is_some_and(|at| std::time::Instant::now() < at)
            {
                return None;
            }
            match Zygote::start(binary) {
                Ok(z) => {
                    tracing::info!(pid = z.process.id(), binary = %binary.display(), "executor fork server started");
                    self.retry_at = None;
                    self.zygote = Some(z);
                }
                Err(e) => {
                    tracing::warn!(binary = %binary.display(), error = %e, "could not start the executor fork server; exec'ing executors, retrying in {}s", ZYGOTE_RETRY.as_secs());
                    self.retry_at = Some(std::time::Instant::now() + ZYGOTE_RETRY);
                    return None;
                }
            }
        }
        self.zygote.as_ref()
    }
}

impl Zygote {
    /// Starts `binary zygote --socket-fd N` on a new socketpair and waits for its
    /// `ready`.
    fn start(binary: &Path) -> std::io::Result<Zygote> {
        use nix::sys::socket::{
            setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType,
        };
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let timeout = nix::sys::time::TimeVal::new(ZYGOTE_TIMEOUT.as_secs() as i64, 0);
        setsockopt(&ours, sockopt::ReceiveTimeout, &timeout)?;
        setsockopt(&ours, sockopt::SendTimeout, &timeout)?;
        let mut cmd = std::process::Command::new(binary);
        cmd.arg("zygote")
            .arg("--socket-fd")
            .arg(theirs.as_raw_fd().to_string())
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // Inheritable only while SPAWN holds, like an executor's readiness pipe.
        let process = spawn_inheriting(&theirs, || cmd.spawn())?;
        drop(theirs);
        let zygote = Zygote {
            socket: ours,
            process,
        };
        match zygote.recv() {
            Ok((ZygoteReply::Ready { .. }, _)) => Ok(zygote),
            Ok((other, _)) => {
                zygote.stop(true);
                Err(std::io::Error::other(format!(
                    "expected `ready`, got {other:?}"
                )))
            }
            Err(e) => {
                zygote.stop(true);
                Err(std::io::Error::other(format!(
                    "{e}; is `{}` a drover-executor with the `zygote` command?",
                    binary.display()
                )))
            }
        }
    }

    /// One request: (pid, pidfd) of the forked executor.
    fn request(
        &self,
        args: &[String],
        ready_tx: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
        connection: BorrowedFd<'_>,
    ) -> Result<(u32, Option<OwnedFd>), ZygoteFailure> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
        let body = serde_json::to_vec(&ZygoteRequest {
            args: args.to_vec(),
        })
        .map_err(|e| ZygoteFailure::Refused(e.to_string()))?;
        let fds = [
            ready_tx.as_raw_fd(),
            stderr.as_raw_fd(),
            connection.as_raw_fd(),
        ];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(&body)];
        loop {
            match sendmsg::<UnixAddr>(
                self.socket.as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(ZygoteFailure::NotSent(e.into())),
            }
        }
        match self.recv() {
            Ok((ZygoteReply::Started { pid }, mut fds)) => Ok((pid, fds.pop())),
            Ok((ZygoteReply::Failed { error }, _)) => Err(ZygoteFailure::Refused(error)),
            Ok((other, _)) => Err(ZygoteFailure::Lost(format!("unexpected reply {other:?}"))),
            Err(e) => Err(ZygoteFailure::Lost(e.to_string())),
        }
    }

    /// Receives one reply (blocking up to `ZYGOTE_TIMEOUT`) and its descriptors.
    fn recv(&self) -> std::io::Result<(ZygoteReply, Vec<OwnedFd>)> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
        let mut buf = [0u8; ZYGOTE_REPLY_MAX];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 2]);
        let (len, fds) = loop {
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            match recvmsg::<UnixAddr>(
                self.socket.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => {
                    let mut fds = Vec::new();
                    for c in msg.cmsgs().into_iter().flatten() {
                        if let ControlMessageOwned::ScmRights(raw) = c {
                            fds.extend(received_fds(raw));
                        }
                    }
                    break (msg.bytes, fds);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {}s", ZYGOTE_TIMEOUT.as_secs()),
                    ))
                }
                Err(e) => return Err(e.into()),
            }
        };
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the fork server exited",
            ));
        }
        let reply = serde_json::from_slice(&buf[..len]).map_err(std::io::Error::other)?;
        Ok((reply, fds))
    }

    /// Closes our end and reaps the process: at once when `kill`, else after it
    /// noticed the closed socket (a second at most).
    fn stop(self, kill: bool) {
        let Zygote {
            socket,
            mut process,
        } = self;
        drop(socket);
        if !kill {
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = process.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = process.kill();
        let _ = process.wait();
    }
}
