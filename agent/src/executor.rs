//! Talking to executors: spawning one detached per task (forked by the resident fork
//! server, `drover-executor zygote`: `fork_server`, or exec'd), subscribing to its
//! socket (the protocol: `protocol`), telling whether one is still alive (`/proc`:
//! `liveness`), and running `drover-executor cleanup` after one died. How a
//! started executor is followed is `process`'s.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use drover_common::wire::Assignment;
use tokio::net::UnixStream;

mod fork_server;
mod liveness;
mod process;
mod protocol;

pub use fork_server::ForkServer;
pub use liveness::{executor_pid_is_live, executor_task_of, find_running_executors};
pub use process::ExecutorProcess;
pub use protocol::{parse_status, send_kill_on, socket_is_live, subscribe_on, StatusLines};

pub(crate) use process::lock_spawn;
use process::{spawn_inheriting, ReadyPipe};
use protocol::connect;

use crate::sandbox::{AgentMeta, SandboxIo};
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

/// Connects and subscribes to every status after `after_seq`.
pub async fn subscribe(socket: &Path, after_seq: u64) -> Result<StatusLines, ExecutorError> {
    let err = |source| ExecutorError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    let stream = connect(socket).map_err(err)?;
    subscribe_on(stream, after_seq).await.map_err(err)
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
}
