//! Helpers for the executor's black-box tests: a sandbox in a temp dir, a task file,
//! the executor started with its stdout parsed into statuses, and the test service.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_common::wire::ExecutorStatus;
use serde_json::{json, Value};

/// The executor binary.
pub fn executor_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drover-executor"))
}

/// The test service's file name; tasks run it as `../../drover-test-service` (it is
/// copied beside the task directory).
pub const SERVICE: &str = "drover-test-service";

/// The test service binary, built on first use when missing.
pub fn test_service_bin() -> PathBuf {
    let dir = executor_bin()
        .parent()
        .expect("the executor binary is in a directory")
        .to_path_buf();
    let bin = dir.join("drover-test-service");
    if !bin.exists() {
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "drover-tests",
                "--bin",
                "drover-test-service",
            ])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building drover-test-service failed");
    }
    assert!(bin.exists(), "{} missing after build", bin.display());
    bin
}

/// Whether we can test for real (root and v1 or v2 cgroups). Prints why not.
pub fn can_isolate(test: &str) -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED {test}: needs root (CI runs as root)");
        return false;
    }
    if drover_executor::cgroup::FsCgroup::detect(Path::new("/sys/fs/cgroup")).is_none() {
        eprintln!("SKIPPED {test}: no cgroup filesystem at /sys/fs/cgroup");
        return false;
    }
    true
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A task id unique to this test run.
pub fn task_id(name: &str) -> String {
    format!("t-{name}-{}", std::process::id())
}

/// A task file's JSON with sensible test defaults; `task` is merged into `task`.
pub fn task_json(id: &str, task: Value, extra: Value) -> Value {
    let mut t = json!({
        "resources": {"cpu": 1.0, "ram": "256MiB", "disk": "64MiB"},
        "finalization_wait": "1s",
    });
    merge(&mut t, task);
    let mut v = json!({
        "task_id": id,
        "role": "nobody",
        "environment": "test",
        "name": "exec",
        "instance": 0,
        "task": t,
        "ports": {},
    });
    merge(&mut v, extra);
    v
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        for (k, v) in b {
            a.insert(k, v);
        }
    }
}

/// A running executor and its task directory (`sandbox`, given as `--sandbox`).
pub struct Exec {
    pub dir: tempfile::TempDir,
    pub sandbox: PathBuf,
    pub child: Child,
    pub statuses: mpsc::Receiver<ExecutorStatus>,
    pub seen: Vec<ExecutorStatus>,
    pub task_id: String,
}

impl Drop for Exec {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Whatever is left of the task: the cleanup command knows how.
        let _ = Command::new(executor_bin())
            .args(["cleanup", "--sandbox"])
            .arg(&self.sandbox)
            .args(["--task-id", &self.task_id])
            .stderr(Stdio::null())
            .status();
    }
}

/// A temp dir other users can traverse (the task user must reach its sandbox).
pub fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

impl Exec {
    /// Starts `drover-executor run` on `task` with extra flags.
    pub fn start(task: &Value, flags: &[&str]) -> Exec {
        let dir = open_tempdir();
        Self::start_in(dir, task, flags, &[])
    }

    /// Like `start`, with extra environment variables.
    pub fn start_with_env(task: &Value, flags: &[&str], env: &[(&str, &str)]) -> Exec {
        Self::start_in(open_tempdir(), task, flags, env)
    }

    /// Like `start`, in a given directory, with extra environment variables.
    pub fn start_in(
        dir: tempfile::TempDir,
        task: &Value,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> Exec {
        if task.to_string().contains(SERVICE) {
            // Beside the sandbox, where the task user can reach it even when the
            // build directory is not (say under /root).
            let copy = dir.path().join(SERVICE);
            std::fs::copy(test_service_bin(), &copy).unwrap();
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let task_file = dir.path().join("task.json");
        std::fs::write(&task_file, serde_json::to_vec(task).unwrap()).unwrap();
        let sandbox = dir.path().join("sandbox");
        let mut child = Command::new(executor_bin())
            .arg("run")
            .arg("--task")
            .arg(&task_file)
            .arg("--sandbox")
            .arg(&sandbox)
            .args(flags)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<ExecutorStatus>(&line) {
                    Ok(s) => {
                        if tx.send(s).is_err() {
                            break;
                        }
                    }
                    Err(e) => eprintln!("not a status line ({e}): {line}"),
                }
            }
        });
        Exec {
            dir,
            sandbox,
            child,
            statuses: rx,
            seen: Vec::new(),
            task_id: task["task_id"].as_str().unwrap().to_string(),
        }
    }

    /// Waits for a status matching `pred`, returning it.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&ExecutorStatus) -> bool,
    ) -> ExecutorStatus {
        let deadline = Instant::now() + timeout;
        if let Some(s) = self.seen.iter().find(|s| pred(s)) {
            return s.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.statuses.recv_timeout(left) {
                Ok(s) => {
                    self.seen.push(s.clone());
                    if pred(&s) {
                        return s;
                    }
                }
                Err(_) => panic!(
                    "no status `{what}` within {timeout:?}; seen: {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for a status in `state`.
    pub fn wait_state(&mut self, state: TaskState, timeout: Duration) -> ExecutorStatus {
        self.wait_for(timeout, state.as_str(), |s| s.state == state)
    }

    /// Waits for the terminal status.
    pub fn wait_terminal(&mut self, timeout: Duration) -> ExecutorStatus {
        self.wait_for(timeout, "terminal", |s| s.state.is_terminal())
    }

    /// Sends a signal to the executor.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Waits for the executor to exit without checking its statuses (it was killed).
    pub fn wait_exit_unchecked(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "executor still running after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the executor to exit; checks the status stream is well formed;
    /// returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let code = self.wait_exit_unchecked(timeout);
        // The stdout reader ends with the executor: collect the rest and check the
        // whole stream.
        while let Ok(s) = self.statuses.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(s);
        }
        assert_well_formed(&self.seen);
        code
    }

    /// A path in the task's working directory (`sandbox/` of the task directory).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.sandbox.join("sandbox").join(rel)
    }

    /// A path in the task directory (root's files: socket, checkpoint, logs).
    pub fn area(&self, rel: &str) -> PathBuf {
        self.sandbox.join(rel)
    }
}

/// Whether a pid is alive (zombies count as dead).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Waits until `cond` holds or panics with `what`.
pub fn eventually(timeout: Duration, what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} not true within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines `<unix_ms> <METHOD> <path>` recorded by the test service.
pub fn recorded(file: &Path) -> Vec<(u64, String)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.splitn(2, ' ');
            Some((p.next()?.parse().ok()?, p.next()?.to_string()))
        })
        .collect()
}

/// Statuses count up by one from 1, the first is STARTING (or a setup failure), and
/// exactly one terminal status comes last.
pub fn assert_well_formed(seen: &[ExecutorStatus]) {
    assert!(!seen.is_empty(), "no statuses at all");
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.seq, i as u64 + 1, "seq gap or reorder in {seen:#?}");
    }
    let first = &seen[0];
    assert!(
        first.state == TaskState::Starting || first.state.is_terminal(),
        "first status is {:?}",
        first.state
    );
    let terminals = seen.iter().filter(|s| s.state.is_terminal()).count();
    assert_eq!(terminals, 1, "{terminals} terminal statuses in {seen:#?}");
    assert!(seen.last().unwrap().state.is_terminal());
}

/// The host pids whose `/proc/<pid>/cmdline` is exactly `cmdline` (NUL-separated,
/// NUL-terminated), zombies aside.
pub fn host_pids_running(cmdline: &[u8]) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline))
        .collect()
}
