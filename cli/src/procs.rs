//! Child daemons of `drover dev`: finding the binaries, starting them with their output
//! in log files, stopping them in order, and sweeping executors that outlived their
//! agent.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The daemons `drover dev` needs, found beside the `drover` binary.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub master: PathBuf,
    pub agent: PathBuf,
    pub executor: PathBuf,
}

impl Binaries {
    /// Looks in the directory of the running `drover` binary.
    pub fn beside_current_exe() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("cannot find the drover binary's path")?;
        let dir = exe
            .parent()
            .context("the drover binary's path has no directory")?;
        Binaries::in_dir(dir)
    }

    /// Looks in `dir`; names every missing binary and how to build it.
    pub fn in_dir(dir: &Path) -> anyhow::Result<Binaries> {
        let found = Binaries {
            master: dir.join("drover-master"),
            agent: dir.join("drover-agent"),
            executor: dir.join("drover-executor"),
        };
        let missing: Vec<&str> = [
            (&found.master, "drover-master"),
            (&found.agent, "drover-agent"),
            (&found.executor, "drover-executor"),
        ]
        .iter()
        .filter(|(path, _)| !path.is_file())
        .map(|(_, name)| *name)
        .collect();
        if !missing.is_empty() {
            bail!(
                "{} not found in {}: build them with cargo build --workspace --bins",
                missing.join(", "),
                dir.display()
            );
        }
        Ok(found)
    }
}

/// A child process that is killed when dropped (if still running).
#[derive(Debug)]
pub struct Daemon {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Daemon {
    /// Starts `command` with stdin closed and stdout and stderr appended to `log`, in
    /// its own process group (so Ctrl-C reaches only `drover dev`, which stops the
    /// daemons in order), and with SIGTERM as its parent-death signal (so nothing is
    /// left running if `drover dev` is killed).
    pub fn spawn(name: &str, command: Command, log: &Path) -> anyhow::Result<Daemon> {
        let child = spawn_logged(name, command, log, Signal::SIGTERM)?;
        Ok(Daemon {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Err with the exit status and the end of its log if it has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); the end of its log {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    pub async fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `command` with stdin closed and stdout and stderr appended to `log` (no
/// colour codes), in its own process group, with `death_signal` sent to it when
/// its parent dies. `drover dev`'s daemons and the black-box tests' processes both
/// start this way.
pub fn spawn_logged(
    name: &str,
    mut command: Command,
    log: &Path,
    death_signal: Signal,
) -> anyhow::Result<Child> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot create the log file {}", log.display()))?;
    let err = out.try_clone()?;
    // Log files are read by people and tests: no terminal colour codes.
    command
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    crate::sys::set_parent_death_signal(&mut command, death_signal);
    let program = command.get_program().to_string_lossy().to_string();
    command
        .spawn()
        .with_context(|| format!("cannot start {name} ({program})"))
}

/// The last `lines` lines of a file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until `path` exists and holds an address (`host:port`), returned as
/// `http://host:port`; fails early if `daemon` exits.
pub async fn wait_for_address(
    daemon: &mut Daemon,
    path: &Path,
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            let text = text.trim();
            if !text.is_empty() {
                return Ok(if text.starts_with("http://") {
                    text.to_string()
                } else {
                    format!("http://{text}")
                });
            }
        }
        daemon.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "{} did not write its address to {} within {}s; the end of its log {}:\n{}",
                daemon.name,
                path.display(),
                timeout.as_secs(),
                daemon.log.display(),
                tail(&daemon.log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// An executor found in a sandbox, from its checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxExecutor {
    pub sandbox: PathBuf,
    /// The executor's pid if it is still running.
    pub live_pid: Option<u32>,
    /// Whether the checkpoint says the task ended.
    pub terminal: bool,
}

/// Every sandbox under `root` (one directory per task) and its executor.
pub fn sandboxes(root: &Path) -> Vec<SandboxExecutor> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| inspect(entry.path()))
        .collect()
}

/// The executor of one task directory (`drover_common::layout`); None if it is not
/// one (it has no `task.json`).
pub fn inspect(sandbox: PathBuf) -> Option<SandboxExecutor> {
    let task = drover_common::layout::TaskDir::new(&sandbox);
    if !task.task_file().is_file() {
        return None;
    }
    let status = std::fs::read(task.status_file())
        .ok()
        .and_then(|bytes| drover_common::wire::checkpointed_status(&bytes));
    Some(match status {
        Some(status) => SandboxExecutor {
            sandbox,
            live_pid: Some(status.executor_pid).filter(|pid| is_executor(*pid)),
            terminal: status.state.is_terminal(),
        },
        None => SandboxExecutor {
            sandbox,
            live_pid: None,
            terminal: false,
        },
    })
}

/// Whether `pid` runs drover-executor (guards against a reused pid).
pub fn is_executor(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            cmdline
                .split(|b| *b == 0)
                .next()
                .is_some_and(|argv0| argv0.ends_with(b"drover-executor"))
        })
        .unwrap_or(false)
}

/// Stops every executor left under the sandbox roots once their agents are gone:
/// SIGTERM (the executor runs the kill escalation), wait for its checkpoint to say
/// the task ended, SIGKILL the executor (it would otherwise wait for an agent), then
/// `drover-executor cleanup` kills whatever is left in the task's cgroup.
/// Returns how many sandboxes needed it.
pub async fn sweep_executors(executor: &Path, roots: &[PathBuf], grace: Duration) -> usize {
    let leftovers: Vec<SandboxExecutor> = roots
        .iter()
        .flat_map(|root| sandboxes(root))
        .filter(|s| s.live_pid.is_some() || !s.terminal)
        .collect();
    for s in &leftovers {
        if let Some(pid) = s.live_pid {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        let all_ended = leftovers
            .iter()
            .filter_map(|s| inspect(s.sandbox.clone()))
            .all(|now| now.terminal || now.live_pid.is_none());
        if all_ended {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &leftovers {
        if let Some(pid) = s.live_pid.filter(|pid| is_executor(*pid)) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let _ = Command::new(executor)
            .arg("cleanup")
            .arg("--sandbox")
            .arg(&s.sandbox)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    leftovers.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_are_named_with_the_build_command() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("drover-agent"), "").unwrap();
        let err = Binaries::in_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("drover-master, drover-executor not found"),
            "{err}"
        );
        assert!(err.contains("cargo build --workspace --bins"), "{err}");
    }

    #[test]
    fn sandboxes_without_a_live_executor_are_reported() {
        let root = tempfile::tempdir().unwrap();
        let drover = root.path().join("task-1");
        std::fs::create_dir_all(&drover).unwrap();
        std::fs::write(drover.join("task.json"), "{}").unwrap();
        let status = serde_json::json!({
            "seq": 3, "task_id": "task-1", "state": "RUNNING", "exit_reason": null,
            "message": "", "timestamp_ms": 1, "executor_pid": std::process::id(),
            "processes": []
        });
        std::fs::write(drover.join("status.json"), status.to_string()).unwrap();
        let found = sandboxes(root.path());
        // This test binary is not drover-executor, so its pid does not count as live.
        assert_eq!(
            found,
            vec![SandboxExecutor {
                sandbox: root.path().join("task-1"),
                live_pid: None,
                terminal: false
            }]
        );
    }

    #[test]
    fn a_checkpoint_of_many_lines_is_read_to_its_last_status() {
        // The executor appends one JSON line per status: the last one counts, and a
        // terminal task whose executor is gone is no leftover.
        let root = tempfile::tempdir().unwrap();
        let task = root.path().join("task-2");
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("task.json"), "{}").unwrap();
        let line = |seq: u64, state: &str| {
            serde_json::json!({
                "seq": seq, "task_id": "task-2", "state": state, "exit_reason": null,
                "message": "", "timestamp_ms": seq, "executor_pid": std::process::id(),
                "processes": []
            })
            .to_string()
        };
        let text = [line(1, "STARTING"), line(2, "RUNNING"), line(3, "FINISHED")].join("\n");
        std::fs::write(task.join("status.json"), text + "\n").unwrap();
        let found = inspect(task.clone()).unwrap();
        assert_eq!(
            found,
            SandboxExecutor {
                sandbox: task,
                live_pid: None,
                terminal: true
            }
        );
    }

    #[tokio::test]
    async fn daemons_are_stopped_and_their_exit_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo started; exec sleep 30"]);
        let mut daemon = Daemon::spawn("sleeper", command, &log).unwrap();
        daemon.check_alive().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !tail(&log, 5).contains("started") && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        daemon.stop(Duration::from_secs(5)).await;
        let err = daemon.check_alive().unwrap_err().to_string();
        assert!(err.contains("sleeper exited"), "{err}");
        assert!(err.contains("started"), "{err}");
    }
}
