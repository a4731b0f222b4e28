//! Talking to executors: spawning one detached per task, the Unix socket protocol
//! (subscribe, kill), telling whether one is still alive, and running
//! `drover-executor cleanup` after one died.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_common::state::ExitReason;
use drover_common::wire::{Assignment, ExecutorRequest, ExecutorStatus};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;

use crate::sandbox::{AgentMeta, Layout};

/// How executors are started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorSettings {
    pub binary: PathBuf,
    pub no_isolation: bool,
    pub allow_root: bool,
    pub recovery_timeout: Option<Duration>,
    pub cgroup_parent: Option<String>,
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

/// A started executor: the child to reap, and the read end of its readiness pipe
/// (readable once its socket listens, or at EOF when it died before that).
pub struct Spawned {
    pub child: tokio::process::Child,
    pub ready: Option<tokio::net::unix::pipe::Receiver>,
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
        args
    }

    /// Writes the task file and the agent's record into a new sandbox and starts the
    /// executor in its own session, stdin and stdout null, stderr to
    /// `.drover/executor.stderr`,
    /// with the write end of a readiness pipe (`--ready-fd N`), so the agent
    /// learns the moment the executor's socket listens instead of polling for it.
    /// The child must be reaped by the caller (`wait`).
    pub fn spawn(
        &self,
        layout: &Layout,
        assignment: &Assignment,
    ) -> Result<Spawned, ExecutorError> {
        let task_id = &assignment.task.task_id;
        let sandbox = layout.sandbox(task_id);
        let drover = layout.drover_dir(task_id);
        let prep = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ExecutorError::Prepare { path, source }
        };
        fs::create_dir_all(&drover).map_err(prep(&drover))?;
        let task_file = layout.task_file(task_id);
        let bytes = serde_json::to_vec(&assignment.task).map_err(|e| ExecutorError::Prepare {
            path: task_file.clone(),
            source: std::io::Error::other(e),
        })?;
        // Written in place, not through a temp file + rename: the sandbox is new and
        // no executor reads it before the spawn below, and an agent crash before the
        // spawn leaves a sandbox without a live executor either way (LOST on restart).
        fs::File::create_new(&task_file)
            .and_then(|mut f| f.write_all(&bytes))
            .map_err(prep(&task_file))?;
        // The executor's stdout repeats, as JSON lines, the statuses the agent gets
        // over the socket and `status.json` keeps: nobody reads it here, so it goes
        // to /dev/null instead of costing a file (an inode) per task. Its stderr is
        // kept: `last_stderr_line` explains a death with it.
        let err_path = drover.join("executor.stderr");
        let stderr = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&err_path)
            .map_err(prep(&err_path))?;
        let (ready_rx, ready_tx) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| {
                ExecutorError::Prepare {
                    path: drover.clone(),
                    source: std::io::Error::from(e),
                }
            })?;
        let mut cmd = std::process::Command::new(&self.binary);
        cmd.args(self.run_args(&task_file, &sandbox))
            .arg("--ready-fd")
            .arg(ready_tx.as_raw_fd().to_string())
            .current_dir(&sandbox)
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
        let child = {
            let _spawning = lock_spawn();
            set_cloexec(&ready_tx, false).and_then(|()| {
                let child = cmd.spawn();
                // The agent's copy is closed right after this; nothing else can fork now.
                let _ = set_cloexec(&ready_tx, true);
                child
            })
        }
        .map_err(|source| ExecutorError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        // Only the child may hold the write end, so that its death reads as EOF.
        drop(ready_tx);
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
        Ok(Spawned { child, ready })
    }

    /// Runs `drover-executor cleanup` for a task whose executor died.
    pub async fn cleanup(&self, layout: &Layout, task_id: &str) -> Result<(), ExecutorError> {
        let sandbox = layout.sandbox(task_id);
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.arg("cleanup")
            .arg("--sandbox")
            .arg(&sandbox)
            .arg("--task-id")
            .arg(task_id)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(p) = &self.cgroup_parent {
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

fn lock_spawn() -> std::sync::MutexGuard<'static, ()> {
    SPAWN.lock().unwrap_or_else(|e| e.into_inner())
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
    let mut stream = connect(socket).map_err(err)?;
    send_line(&mut stream, &ExecutorRequest::Subscribe { after_seq })
        .await
        .map_err(err)?;
    Ok(BufReader::new(stream).lines())
}

/// Parses one status line.
pub fn parse_status(line: &str) -> Option<ExecutorStatus> {
    serde_json::from_str(line).ok()
}

/// Asks an executor to start its kill escalation.
pub async fn send_kill(socket: &Path, reason: ExitReason) -> Result<(), ExecutorError> {
    let err = |source| ExecutorError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    let mut stream = connect(socket).map_err(err)?;
    send_line(
        &mut stream,
        &ExecutorRequest::Kill {
            reason: Some(reason),
        },
    )
    .await
    .map_err(err)?;
    stream.shutdown().await.map_err(err)?;
    Ok(())
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

/// Connects, through the sandbox's `.drover` directory when the socket path is too
/// long for a Unix socket address (see `wire::socket_address`).
fn connect_std(socket: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    let (address, _dir) =
        drover_common::wire::socket_address(socket, |dir| std::fs::File::open(dir))?;
    std::os::unix::net::UnixStream::connect(address)
}

/// True if `pid` is a running (not zombie) process whose command line mentions
/// `binary_name` (so a reused pid is not mistaken for the executor).
pub fn executor_pid_is_live(pid: u32, binary_name: &str) -> bool {
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
/// (`<binary_name> run ... --sandbox <root>/<task_id>`): task id -> pid. Covers an
/// executor whose pid the agent never recorded (a crash right after the spawn).
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
        if let Some(task_id) = executor_task_of(&cmdline, binary_name, sandbox_root) {
            if executor_pid_is_live(pid, binary_name) {
                found.insert(task_id, pid);
            }
        }
    }
    found
}

/// The task id an executor command line runs, if it is one of ours (pure).
pub fn executor_task_of(cmdline: &[u8], binary_name: &str, sandbox_root: &Path) -> Option<String> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if !args.iter().take(2).any(|a| a.contains(binary_name)) || !args.iter().any(|a| a == "run") {
        return None;
    }
    let pos = args.iter().position(|a| a == "--sandbox")?;
    let sandbox = Path::new(args.get(pos + 1)?);
    if sandbox.parent()? != sandbox_root {
        return None;
    }
    let task_id = sandbox.file_name()?.to_str()?.to_string();
    drover_common::spec::is_valid_name(&task_id).then_some(task_id)
}

/// The last non-empty line the executor wrote to its stderr, for LOST messages.
pub fn last_stderr_line(layout: &Layout, task_id: &str) -> Option<String> {
    let text = fs::read_to_string(layout.drover_dir(task_id).join("executor.stderr")).ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(line.chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn executor_command_lines_name_their_task() {
        let root = Path::new("/srv/sandboxes");
        let ours = b"/usr/bin/drover-executor\0run\0--task\0/srv/sandboxes/t1/.drover/agent-task.json\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(
            executor_task_of(ours, "drover-executor", root),
            Some("t1".into())
        );
        let elsewhere = b"/usr/bin/drover-executor\0run\0--sandbox\0/tmp/x/t1\0";
        assert_eq!(executor_task_of(elsewhere, "drover-executor", root), None);
        let cleanup = b"/usr/bin/drover-executor\0cleanup\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(executor_task_of(cleanup, "drover-executor", root), None);
        let other = b"/bin/sleep\0run\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(executor_task_of(other, "drover-executor", root), None);
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
        };
        assert_eq!(
            s.run_args(Path::new("/s/t/.drover/agent-task.json"), Path::new("/s/t")),
            vec![
                "run",
                "--task",
                "/s/t/.drover/agent-task.json",
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
    fn a_socket_path_too_long_for_sun_path_is_still_reached() {
        let dir = tempfile::tempdir().unwrap();
        let area = dir.path().join("d".repeat(120)).join(".drover");
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
