//! Talking to executors: spawning one detached per task (forked by the resident fork
//! server, `drover-executor zygote`, or exec'd), the Unix socket protocol (subscribe,
//! kill), telling whether one is still alive, and running `drover-executor cleanup`
//! after one died.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_common::state::ExitReason;
use drover_common::wire::{
    Assignment, ExecutorRequest, ExecutorStatus, ZygoteReply, ZygoteRequest,
};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;

use crate::sandbox::{AgentMeta, SandboxIo};
use crate::sys::{received_fds, watch_pidfd};
use drover_common::layout::Layout;

/// How executors are started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorSettings {
    pub binary: PathBuf,
    pub no_isolation: bool,
    pub allow_root: bool,
    pub recovery_timeout: Option<Duration>,
    pub cgroup_parent: Option<String>,
    /// Other parents task cgroups of this host may be under (made by an agent that
    /// placed them elsewhere): `cleanup` looks there too.
    pub other_cgroup_parents: Vec<String>,
    /// The host's maximum pids limit per task (`--pids-max`); none: the executor's
    /// default.
    pub max_task_pids: Option<u64>,
    /// `--log-max-size` in bytes, when set.
    pub log_max_bytes: Option<u64>,
    /// `--log-max-files`, when set.
    pub log_max_files: Option<u32>,
}

/// An executor could not be started or reached.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("preparing sandbox {path}: {source}")]
    Prepare {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting executor {binary}: {source}; check the agent's `executor` setting")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("executor socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("executor cleanup for {sandbox}: {message}")]
    Cleanup { sandbox: PathBuf, message: String },
}

/// A started executor: its process, the read end of its readiness pipe (readable
/// once its socket listens, or at EOF when it died before that) and, for one the
/// fork server forked, the agent's end of a connection to it (then the executor
/// binds no socket while that connection lasts; see [`subscribe_on`]).
pub struct Spawned {
    pub child: ExecutorProcess,
    pub ready: Option<tokio::net::unix::pipe::Receiver>,
    pub connection: Option<UnixStream>,
}

/// How the agent learns that an executor it started has exited.
pub enum ExecutorProcess {
    /// Exec'd by the agent: its child, reaped here.
    Child(tokio::process::Child),
    /// Forked by the fork server (which reaps it): its pidfd reads as ready once it
    /// has exited.
    Forked { pid: u32, pidfd: AsyncFd<OwnedFd> },
    /// Forked by the fork server but not watchable by pidfd (it died before saying
    /// which pid, or no pidfd could be made): followed like an executor adopted at
    /// start, through its pid (when known) and its checkpoint.
    Untracked { pid: Option<u32> },
}

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

/// The readiness pipe of one executor start.
struct ReadyPipe {
    rx: OwnedFd,
    tx: Option<OwnedFd>,
}

impl ReadyPipe {
    fn new() -> std::io::Result<ReadyPipe> {
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(ReadyPipe { rx, tx: Some(tx) })
    }

    /// Whether some process other than us may still hold the write end, or already
    /// wrote to it: checked with our own write end closed.
    fn has_writer(&mut self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        self.tx = None;
        let mut fds = [PollFd::new(self.rx.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => true,
            Ok(_) => fds[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLIN)),
            Err(_) => true,
        }
    }
}

impl ExecutorProcess {
    /// The executor's pid, when known.
    pub fn id(&self) -> Option<u32> {
        match self {
            ExecutorProcess::Child(c) => c.id(),
            ExecutorProcess::Forked { pid, .. } => Some(*pid),
            ExecutorProcess::Untracked { pid } => *pid,
        }
    }

    /// Waits until the executor has exited. Never returns for `Untracked`, which has
    /// nothing to wait on.
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match self {
            ExecutorProcess::Child(c) => c.wait().await.map(|_| ()),
            ExecutorProcess::Forked { pidfd, .. } => {
                // A pidfd stays readable once the process exited.
                pidfd.readable().await?.retain_ready();
                Ok(())
            }
            ExecutorProcess::Untracked { .. } => std::future::pending().await,
        }
    }
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
    fn fork(
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

/// The status stream of one subscription. The whole stream is kept: closing our
/// write direction would end the subscription at the executor.
pub type StatusLines = Lines<BufReader<UnixStream>>;

impl ExecutorSettings {
    /// The `run` arguments for one task.
    pub fn run_args(&self, task_file: &Path, sandbox: &Path) -> Vec<String> {
        let mut args = vec![
            "run".to_string(),
            "--task".to_string(),
            task_file.display().to_string(),
            "--sandbox".to_string(),
            sandbox.display().to_string(),
        ];
        if self.no_isolation {
            args.push("--no-isolation".into());
        }
        if self.allow_root {
            args.push("--allow-root".into());
        }
        if let Some(t) = self.recovery_timeout {
            args.push("--recovery-timeout".into());
            args.push(format!("{}ms", t.as_millis()));
        }
        if let Some(p) = &self.cgroup_parent {
            args.push("--cgroup-parent".into());
            args.push(p.clone());
        }
        if let Some(n) = self.max_task_pids {
            args.push("--pids-max".into());
            args.push(n.to_string());
        }
        if let Some(n) = self.log_max_bytes {
            args.push("--log-max-size".into());
            args.push(format!("{n}B"));
        }
        if let Some(n) = self.log_max_files {
            args.push("--log-max-files".into());
            args.push(n.to_string());
        }
        args
    }

    /// Creates the task directory (root's, 0711), writes the task file (0600) and the
    /// agent's record into it and starts the executor in its own session, stdin and
    /// stdout null, stderr to the task directory's `executor.stderr`,
    /// with the write end of a readiness pipe (`--ready-fd N`), so the agent
    /// learns the moment the executor's socket listens instead of polling for it.
    /// With a fork server the executor is forked by it (same arguments, same
    /// descriptors); without one, or when it cannot, the binary is exec'd.
    /// The caller waits for the process (`ExecutorProcess::wait`).
    pub fn spawn(
        &self,
        layout: &Layout,
        assignment: &Assignment,
        fork_server: Option<&ForkServer>,
    ) -> Result<Spawned, ExecutorError> {
        let task_id = &assignment.task.task_id;
        let task_dir = layout.task_dir(task_id);
        let prep = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ExecutorError::Prepare { path, source }
        };
        // A task with artifacts has its task directory already (`runtime::fetch`).
        crate::sandbox::create_task_dir(layout, task_id)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists if !assignment.task.task.artifacts.is_empty() => {
                    Ok(())
                }
                _ => Err(e),
            })
            .map_err(prep(&task_dir))?;
        let task_file = layout.task_file(task_id);
        let bytes = serde_json::to_vec(&assignment.task).map_err(|e| ExecutorError::Prepare {
            path: task_file.clone(),
            source: std::io::Error::other(e),
        })?;
        // Written in place, not through a temp file + rename: the sandbox is new and
        // no executor reads it before the spawn below, and an agent crash before the
        // spawn leaves a sandbox without a live executor either way (LOST on restart).
        crate::sandbox::open_private(
            &task_file,
            fs::OpenOptions::new().write(true).create_new(true),
        )
        .and_then(|mut f| f.write_all(&bytes))
        .map_err(prep(&task_file))?;
        // The executor's stdout repeats, as JSON lines, the statuses the agent gets
        // over the socket and `status.json` keeps: nobody reads it here, so it goes
        // to /dev/null instead of costing a file (an inode) per task. Its stderr is
        // kept: `last_stderr_line` explains a death with it. A forked executor is
        // handed the task directory instead of the file and creates `executor.stderr` there on
        // its first line (most never write one: an inode less per task); an exec'd
        // one gets the file.
        let err_path = layout.task(task_id).stderr_file();
        let open_stderr = || {
            crate::sandbox::open_private(
                &err_path,
                fs::OpenOptions::new().create(true).append(true),
            )
            .map_err(prep(&err_path))
        };
        let pipe_err = |e: std::io::Error| ExecutorError::Prepare {
            path: task_dir.clone(),
            source: e,
        };
        let mut ready = ReadyPipe::new().map_err(pipe_err)?;
        let args = self.run_args(&task_file, &task_dir);
        // A forked executor gets one end of a connected pair: the agent follows it on
        // the other, and the executor binds no socket (no inode) while it lasts.
        let mut connection = None;
        let forked = fork_server.and_then(|f| {
            let area = fs::File::open(&task_dir).ok()?;
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().ok()?;
            let child = f.fork(task_id, &args, &area, &mut ready, theirs.as_fd())?;
            connection = Some(ours);
            Some(child)
        });
        // Registered with the runtime here; should that fail, the connection is
        // dropped, the executor then binds its socket, and the agent connects to it.
        let connection = connection.and_then(|c| {
            c.set_nonblocking(true).ok()?;
            UnixStream::from_std(c).ok()
        });
        let child = match forked {
            Some(child) => child,
            None => {
                if ready.tx.is_none() {
                    ready = ReadyPipe::new().map_err(pipe_err)?;
                }
                self.exec(&args, &task_dir, open_stderr()?, &mut ready)?
            }
        };
        // Only the child may hold the write end, so that its death reads as EOF.
        let ReadyPipe { rx: ready_rx, tx } = ready;
        drop(tx);
        let ready = match tokio::net::unix::pipe::Receiver::from_owned_fd(ready_rx) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(task_id, error = %e, "readiness pipe unusable; polling the socket instead");
                None
            }
        };
        // Only an exclusive task needs `agent.json`: a restarted agent that cannot
        // reach the master must know to kill it after the lease. For any other task
        // the file would repeat what is known without it (not exclusive is the
        // default; the executor's pid is in its own `status.json`, and the /proc
        // scan at restart finds an executor that has not written one yet), and it
        // cost an inode per task. Written once, after the spawn. Best effort and not
        // fsync'd: an agent crash keeps the page cache, and a host crash ends the
        // executor too. An agent crash in between loses only `exclusive` until the
        // next assignment set says it again.
        if assignment.exclusive {
            let meta = AgentMeta {
                exclusive: true,
                executor_pid: child.id(),
            };
            if let Err(e) = layout.write_meta(task_id, &meta, false) {
                tracing::warn!(task_id, error = %e, "could not record the task as exclusive");
            }
        }
        Ok(Spawned {
            child,
            ready,
            connection,
        })
    }

    /// Execs the executor binary with `args` in its task directory, the readiness pipe's
    /// write end as `--ready-fd`.
    fn exec(
        &self,
        args: &[String],
        sandbox: &Path,
        stderr: fs::File,
        ready: &mut ReadyPipe,
    ) -> Result<ExecutorProcess, ExecutorError> {
        let spawn_err = |source| ExecutorError::Spawn {
            binary: self.binary.clone(),
            source,
        };
        let ready_tx = ready
            .tx
            .take()
            .ok_or_else(|| spawn_err(std::io::Error::other("readiness pipe closed")))?;
        let mut cmd = std::process::Command::new(&self.binary);
        cmd.args(args)
            .arg("--ready-fd")
            .arg(ready_tx.as_raw_fd().to_string())
            .current_dir(sandbox)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(false);
        // No pre_exec hook, so std starts the executor with posix_spawn (vfork)
        // instead of fork: forking the agent copied its page tables and then paid a
        // copy-on-write fault for every page it touched afterwards, per task. The
        // executor puts itself in its own session first thing (`setsid`), and the
        // readiness pipe is inherited under its own number: it is inheritable only
        // while SPAWN holds, so no other child of the agent gets a copy.
        let child = spawn_inheriting(&ready_tx, || cmd.spawn()).map_err(spawn_err)?;
        Ok(ExecutorProcess::Child(child))
    }

    /// Runs `drover-executor cleanup` for a task whose executor died: in the task
    /// cgroups' parent, then in each of [`Self::other_cgroup_parents`] (a cgroup
    /// that is not there counts as cleaned up).
    pub async fn cleanup(&self, layout: &Layout, task_id: &str) -> Result<(), ExecutorError> {
        let parents = std::iter::once(self.cgroup_parent.as_deref())
            .chain(self.other_cgroup_parents.iter().map(|p| Some(p.as_str())));
        let mut first_error = None;
        for parent in parents {
            if let Err(e) = self.cleanup_in(layout, task_id, parent).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `drover-executor cleanup` with `--cgroup-parent parent` (when given).
    async fn cleanup_in(
        &self,
        layout: &Layout,
        task_id: &str,
        parent: Option<&str>,
    ) -> Result<(), ExecutorError> {
        let sandbox = layout.task_dir(task_id);
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.arg("cleanup")
            .arg("--sandbox")
            .arg(&sandbox)
            .arg("--task-id")
            .arg(task_id)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(p) = parent {
            cmd.arg("--cgroup-parent").arg(p);
        }
        let fail = |message: String| ExecutorError::Cleanup {
            sandbox: sandbox.clone(),
            message,
        };
        let child = {
            let _spawning = lock_spawn();
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
        }
        .map_err(|e| fail(format!("could not run {}: {e}", self.binary.display())))?;
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .map_err(|_| fail("did not finish within 60s".into()))?
            .map_err(|e| fail(format!("could not run {}: {e}", self.binary.display())))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(fail(format!(
                "exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }
}

/// Held while the agent starts a child process, so that a readiness pipe made
/// inheritable for one executor is inherited by no other child.
static SPAWN: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn lock_spawn() -> std::sync::MutexGuard<'static, ()> {
    SPAWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `spawn` with `fd` inheritable, under its own number, by the child it starts:
/// close-on-exec is cleared only while SPAWN is held, so no other child of the agent
/// gets a copy (our copy is closed by the caller right after).
fn spawn_inheriting<C>(
    fd: &OwnedFd,
    spawn: impl FnOnce() -> std::io::Result<C>,
) -> std::io::Result<C> {
    let _spawning = lock_spawn();
    set_cloexec(fd, false)?;
    let child = spawn();
    let _ = set_cloexec(fd, true);
    child
}

/// Sets or clears close-on-exec on `fd`.
fn set_cloexec(fd: &OwnedFd, on: bool) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let flags = if on {
        FdFlag::FD_CLOEXEC
    } else {
        FdFlag::empty()
    };
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(flags))
        .map(|_| ())
        .map_err(std::io::Error::from)
}

async fn send_line(stream: &mut UnixStream, req: &ExecutorRequest) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line).await
}

/// Connects and subscribes to every status after `after_seq`.
pub async fn subscribe(socket: &Path, after_seq: u64) -> Result<StatusLines, ExecutorError> {
    let err = |source| ExecutorError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    let stream = connect(socket).map_err(err)?;
    subscribe_on(stream, after_seq).await.map_err(err)
}

/// Subscribes to every status after `after_seq` on a connected stream: one from
/// [`subscribe`], or the connection a forked executor was started with
/// ([`Spawned::connection`]).
pub async fn subscribe_on(mut stream: UnixStream, after_seq: u64) -> std::io::Result<StatusLines> {
    send_line(&mut stream, &ExecutorRequest::Subscribe { after_seq }).await?;
    Ok(BufReader::new(stream).lines())
}

/// Asks an executor to start its kill escalation on a subscribed connection (the
/// executor takes requests on any connection).
pub async fn send_kill_on(lines: &mut StatusLines, reason: ExitReason) -> std::io::Result<()> {
    send_line(
        lines.get_mut().get_mut(),
        &ExecutorRequest::Kill {
            reason: Some(reason),
        },
    )
    .await
}

/// Parses one status line.
pub fn parse_status(line: &str) -> Option<ExecutorStatus> {
    serde_json::from_str(line).ok()
}

/// True if something accepts connections on the socket.
pub fn socket_is_live(socket: &Path) -> bool {
    connect_std(socket).is_ok()
}

/// Connects to an executor's socket. A Unix connect completes at once (or fails), so
/// the blocking std call is fine on the runtime.
fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    let stream = connect_std(socket)?;
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

/// Connects, through the task directory when the socket path is too
/// long for a Unix socket address (see `wire::socket_address`).
fn connect_std(socket: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    let (address, _dir) =
        drover_common::wire::socket_address(socket, |dir| std::fs::File::open(dir))?;
    std::os::unix::net::UnixStream::connect(address)
}

/// True if `pid` is a running (not zombie) process of the agent's own user whose
/// command line mentions `binary_name` (so a reused pid is not mistaken for the
/// executor, and a task process dressed up as one, which runs as the task user, is
/// never believed).
pub fn executor_pid_is_live(pid: u32, binary_name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = fs::metadata(format!("/proc/{pid}"))
        .is_ok_and(|m| m.uid() == nix::unistd::Uid::effective().as_raw());
    if !ours {
        return false;
    }
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(_) => return false,
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, Some('Z') | Some('X') | None) {
        return false;
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => String::from_utf8_lossy(&cmdline).contains(binary_name),
        Err(_) => false,
    }
}

/// Finds running executors of sandboxes below `sandbox_root` by their command line
/// (`<binary_name> run ... --sandbox <root>/<task_id>`), or for one forked by the fork
/// server (whose command line is the zygote's) by its working directory, the task
/// directory: task id -> pid. Covers an executor whose pid the agent never recorded
/// (a crash right after the spawn).
pub fn find_running_executors(binary_name: &str, sandbox_root: &Path) -> HashMap<String, u32> {
    let mut found = HashMap::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok();
        if let Some(task_id) = executor_task_of(&cmdline, cwd.as_deref(), binary_name, sandbox_root)
        {
            if executor_pid_is_live(pid, binary_name) {
                found.insert(task_id, pid);
            }
        }
    }
    found
}

/// The task id an executor runs, if it is one of ours, from its command line and
/// working directory (pure). An executor forked by the fork server has the zygote's
/// command line (`<binary_name> zygote ...`) and its task directory as working directory; the
/// fork server itself works in `/`.
pub fn executor_task_of(
    cmdline: &[u8],
    cwd: Option<&Path>,
    binary_name: &str,
    sandbox_root: &Path,
) -> Option<String> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if !args.iter().take(2).any(|a| a.contains(binary_name)) {
        return None;
    }
    let sandbox = if args.get(1).is_some_and(|a| a == "zygote") {
        cwd?
    } else if args.iter().any(|a| a == "run") {
        let pos = args.iter().position(|a| a == "--sandbox")?;
        Path::new(args.get(pos + 1)?)
    } else {
        return None;
    };
    if sandbox.parent()? != sandbox_root {
        return None;
    }
    let task_id = sandbox.file_name()?.to_str()?.to_string();
    drover_common::spec::is_valid_name(&task_id).then_some(task_id)
}

/// The last non-empty line the executor wrote to its stderr, for LOST messages.
pub fn last_stderr_line(layout: &Layout, task_id: &str) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    crate::sandbox::open_private(
        &layout.task(task_id).stderr_file(),
        fs::OpenOptions::new().read(true),
    )
    .ok()?
    .read_to_string(&mut text)
    .ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(line.chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn executor_command_lines_name_their_task() {
        let root = Path::new("/srv/sandboxes");
        let ours = b"/usr/bin/drover-executor\0run\0--task\0/srv/sandboxes/t1/task.json\0--sandbox\0/srv/sandboxes/t1\0";
        let cwd = Some(Path::new("/"));
        let of = |cmdline: &[u8], cwd| executor_task_of(cmdline, cwd, "drover-executor", root);
        assert_eq!(of(ours, cwd), Some("t1".into()));
        let elsewhere = b"/usr/bin/drover-executor\0run\0--sandbox\0/tmp/x/t1\0";
        assert_eq!(of(elsewhere, cwd), None);
        let cleanup = b"/usr/bin/drover-executor\0cleanup\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(of(cleanup, cwd), None);
        let other = b"/bin/sleep\0run\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(of(other, cwd), None);
        // Forked by the fork server: the zygote's command line, the sandbox as cwd.
        let forked = b"/usr/bin/drover-executor\0zygote\0--socket-fd\x005\0";
        let sandbox = Path::new("/srv/sandboxes/t2");
        assert_eq!(of(forked, Some(sandbox)), Some("t2".into()));
        assert_eq!(of(forked, cwd), None, "the fork server itself");
        assert_eq!(of(forked, None), None);
        assert_eq!(of(forked, Some(Path::new("/tmp/t2"))), None);
    }

    use super::*;

    #[test]
    fn run_args_follow_the_executor_contract() {
        let s = ExecutorSettings {
            binary: "/bin/drover-executor".into(),
            no_isolation: true,
            allow_root: true,
            recovery_timeout: Some(Duration::from_secs(60)),
            cgroup_parent: Some("drover".into()),
            other_cgroup_parents: Vec::new(),
            max_task_pids: None,
            log_max_bytes: None,
            log_max_files: None,
        };
        assert_eq!(
            s.run_args(Path::new("/s/t/task.json"), Path::new("/s/t")),
            vec![
                "run",
                "--task",
                "/s/t/task.json",
                "--sandbox",
                "/s/t",
                "--no-isolation",
                "--allow-root",
                "--recovery-timeout",
                "60000ms",
                "--cgroup-parent",
                "drover"
            ]
        );
    }

    #[test]
    fn our_own_pid_is_live_only_under_the_right_name() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        assert!(executor_pid_is_live(me, &name));
        assert!(!executor_pid_is_live(me, "no-such-binary-name-xyz"));
        assert!(!executor_pid_is_live(u32::MAX - 1, &name));
    }

    #[test]
    fn a_process_of_another_user_is_never_taken_for_an_executor() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        // Waits until the child has exec'd `sleep` (its command line says so).
        let execd = |pid: u32| {
            for _ in 0..200 {
                if fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep")) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("{pid} never exec'd sleep");
        };
        // A task user's process named like the executor.
        let mut impostor = std::process::Command::new("sleep")
            .arg("30")
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        execd(impostor.id());
        let fooled = executor_pid_is_live(impostor.id(), "sleep");
        impostor.kill().unwrap();
        impostor.wait().unwrap();
        assert!(
            !fooled,
            "a process of another user was taken for an executor"
        );
        let mut ours = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        execd(ours.id());
        let live = executor_pid_is_live(ours.id(), "sleep");
        ours.kill().unwrap();
        ours.wait().unwrap();
        assert!(live);
    }

    #[test]
    fn a_socket_path_too_long_for_sun_path_is_still_reached() {
        let dir = tempfile::tempdir().unwrap();
        let area = dir.path().join("d".repeat(120)).join("t");
        std::fs::create_dir_all(&area).unwrap();
        let socket = area.join("executor.sock");
        assert!(socket.as_os_str().len() > drover_common::wire::SUN_PATH_MAX);
        assert!(!socket_is_live(&socket));
        let (address, _dir) =
            drover_common::wire::socket_address(&socket, |dir| std::fs::File::open(dir)).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(address).unwrap();
        assert!(socket.exists());
        assert!(socket_is_live(&socket));
    }

    #[test]
    fn a_missing_socket_is_not_live() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!socket_is_live(&dir.path().join("x.sock")));
        let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("y.sock")).unwrap();
        assert!(socket_is_live(&dir.path().join("y.sock")));
    }
}
