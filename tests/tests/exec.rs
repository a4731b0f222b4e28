//! `drover task exec`, black-box on a real cluster: the command runs as the task's
//! user, in its pid namespace, working directory and environment; its exit status
//! is the CLI's; an interactive shell through a PTY (Python's `pty` driving the CLI)
//! runs two commands; another role's token gets 403; the audit log records the
//! command line; a task that is not RUNNING is refused with its state; killing the
//! task ends the exec'd process.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_tests::{
    bin, command_job, describe, drover_as, running_as_root, Cluster, ClusterConfig,
};
use serde_json::json;

const KEY: &str = "www-data/test/shell";
const TARGET: &str = "www-data/test/shell/0";

fn out(c: &Cluster, args: &[&str]) -> (i32, String, String) {
    let o = c
        .drover_with_timeout(args, Duration::from_secs(30))
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The `drover` command against the cluster (its url and admin token).
fn cli(c: &Cluster) -> Command {
    let mut cmd = Command::new(bin("drover").unwrap());
    cmd.env("DROVER_MASTER", &c.api.url)
        .env("DROVER_TOKEN", c.api.token.as_deref().unwrap_or_default())
        .env_remove("DROVER_TOKEN_FILE")
        .env_remove("DROVER_CA")
        .env("DROVER_CONFIG", "/nonexistent/drover-test-config.toml");
    cmd
}

/// Host pids of processes whose command line is `argv`.
fn pids_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn exec_runs_inside_the_task_and_ends_with_it() {
    if !running_as_root("exec_runs_inside_the_task_and_ends_with_it") {
        return;
    }
    let mut c = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let mut spec = command_job("shell", 1, true, "exec sleep 600");
    spec["task"]["env"] = json!({"EXEC_MARK": "from-the-spec"});
    c.create_job(&spec).unwrap();
    c.create_job(&command_job("done", 1, false, "true"))
        .unwrap();
    let view = c.wait_for_all(KEY, TaskState::Running).unwrap();
    let task = view.instances[0].current.clone().unwrap();
    let task_pid = task
        .processes
        .iter()
        .find_map(|p| p.pid)
        .expect("the task's process has a pid");

    // The task's uid, pid namespace, working directory and environment.
    let (code, stdout, stderr) = out(
        &c,
        &[
            "task",
            "exec",
            TARGET,
            "--",
            "sh",
            "-c",
            "id -u; readlink /proc/self/ns/pid; pwd; echo $EXEC_MARK",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let uid = nix::unistd::User::from_name("www-data")
        .unwrap()
        .unwrap()
        .uid;
    assert_eq!(lines[0], uid.to_string(), "{stdout}");
    let task_ns = std::fs::read_link(format!("/proc/{task_pid}/ns/pid")).unwrap();
    assert_eq!(lines[1], task_ns.to_str().unwrap(), "{stdout}");
    assert_ne!(
        std::fs::read_link("/proc/self/ns/pid").unwrap(),
        task_ns,
        "the task has its own pid namespace"
    );
    assert!(
        lines[2].ends_with(&format!("{}/sandbox", task.task_id)),
        "{stdout}"
    );
    assert_eq!(lines[3], "from-the-spec", "{stdout}");

    // The exit status is the CLI's; the audit log has the command line.
    let (code, _, stderr) = out(&c, &["task", "exec", TARGET, "--", "sh", "-c", "exit 3"]);
    assert_eq!(code, 3, "{stderr}");
    let audit = std::fs::read_to_string(c.dir().join("master/audit.log")).unwrap();
    assert!(
        audit.lines().any(|l| l.contains("/instances/0/exec")
            && l.contains(r#""command":["sh","-c","exit 3"]"#)
            && l.contains(r#""status":101"#)),
        "{audit}"
    );

    // An interactive shell on a terminal: two commands, then its exit status.
    let script = r#"
import os, pty, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
os.write(fd, b"echo one-$((1+1))\n")
os.write(fd, b"echo two-$((2+2)); exit 7\n")
out = b""
deadline = time.time() + 20
while time.time() < deadline:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let drover = bin("drover").unwrap();
    let mut python = Command::new("python3");
    python
        .args(["-c", script])
        .arg(&drover)
        .args(["task", "exec", "-i", "-t", TARGET, "--", "sh"]);
    let envs: Vec<(String, String)> = cli(&c)
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
        .collect();
    let o = python.envs(envs).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("one-2") && text.contains("two-4"),
        "{}",
        describe(&o)
    );
    assert_eq!(o.status.code(), Some(7), "{}", describe(&o));

    // Another role's token may not exec.
    let other = c
        .create_token(&json!({"kind": "roles", "roles": ["other"]}))
        .unwrap();
    let o = drover_as(
        Some(&c.api.url),
        Some(&other),
        &["task", "exec", TARGET, "--", "true"],
    )
    .unwrap();
    let text = describe(&o);
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("403") || text.contains("lacks the permission"),
        "{text}"
    );

    // A task that is not RUNNING is refused, naming its state.
    c.wait_for_all("www-data/test/done", TaskState::Finished)
        .unwrap();
    let (code, _, stderr) = out(&c, &["task", "exec", "www-data/test/done/0", "--", "true"]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("FINISHED") && stderr.contains("not RUNNING"),
        "{stderr}"
    );

    // A signal to the CLI reaches the command; its status is the CLI's.
    let marker = ["sleep", "1234.6"];
    let mut session = cli(&c)
        .args(["task", "exec", TARGET, "--"])
        .args(marker)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while pids_running(&marker).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the exec'd sleep never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(session.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = session.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(pids_running(&marker).is_empty());

    // Killing the task ends the exec'd process.
    let marker = ["sleep", "1234.5"];
    let mut session = cli(&c)
        .args(["task", "exec", TARGET, "--"])
        .args(marker)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let exec_pid = loop {
        if let Some(pid) = pids_running(&marker).first() {
            break *pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the exec'd sleep never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    c.kill_job(KEY).unwrap();
    let started = Instant::now();
    while std::path::Path::new(&format!("/proc/{exec_pid}")).exists() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = session.kill();
            panic!("the exec'd process {exec_pid} outlived its task");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = session.wait().unwrap();
    assert!(!status.success(), "the session ended with {status:?}");
}
