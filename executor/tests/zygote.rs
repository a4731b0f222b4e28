//! The fork server (`drover-executor zygote`) as a real process, with this test playing
//! the agent on a socketpair: it forks executors that run their tasks to the end, reaps
//! them, answers a bad request without forking, and exits when the agent's end closes
//! while an executor it forked keeps running.

// Test helpers panic on failure on purpose.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_common::wire::{checkpointed_status, ExecutorStatus, ZygoteReply, ZygoteRequest};
use drover_executor::zygote::{recv_with_fds, send_with_fds};
use serde_json::json;
use support::*;

const LONG: Duration = Duration::from_secs(30);

/// A SOCK_SEQPACKET socketpair, both ends close-on-exec.
#[allow(unsafe_code)]
fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the two-int array.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Starts a zygote on a new socket pair, the other end inherited as its socket
/// (close-on-exec is cleared in the child only, so no other test's child inherits it),
/// and reads its hello. Returns our end, the zygote and the hello with its descriptors.
#[allow(unsafe_code)]
fn start_zygote() -> (OwnedFd, Child, (ZygoteReply, Vec<OwnedFd>)) {
    let (ours, theirs) = seqpacket_pair();
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(executor_bin());
    cmd.args(["zygote", "--socket-fd", &fd.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: fcntl is async-signal-safe and touches only the descriptor's flags.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let zygote = cmd.spawn().unwrap();
    drop(theirs);
    let hello = reply(&ours);
    (ours, zygote, hello)
}

/// The next reply and its descriptors, waiting up to LONG.
fn reply(ours: &OwnedFd) -> (ZygoteReply, Vec<OwnedFd>) {
    let deadline = Instant::now() + LONG;
    let mut buf = vec![0u8; 4096];
    loop {
        match recv_with_fds(ours.as_fd(), &mut buf) {
            Ok((n, fds)) => {
                assert!(n > 0, "the zygote closed its end");
                return (serde_json::from_slice(&buf[..n]).unwrap(), fds);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no reply from the zygote");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("recvmsg: {e}"),
        }
    }
}

/// A task in `dir/<name>`, the request that runs it, and the readiness pipe's read end.
struct Started {
    sandbox: std::path::PathBuf,
    pid: i32,
    pidfd: OwnedFd,
    ready: std::fs::File,
}

fn run_task(ours: &OwnedFd, dir: &Path, name: &str, cmdline: &str) -> Started {
    run_task_with(ours, dir, name, cmdline, None, false)
}

/// `run_task`, handing the executor `connection` (the agent's connection) too, and
/// with `deferred_stderr` the task directory instead of the stderr file.
fn run_task_with(
    ours: &OwnedFd,
    dir: &Path,
    name: &str,
    cmdline: &str,
    connection: Option<&UnixStream>,
    deferred_stderr: bool,
) -> Started {
    let id = task_id(name);
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": cmdline}]}),
        json!({}),
    );
    let sandbox = dir.join(name);
    std::fs::create_dir_all(&sandbox).unwrap();
    let task_file = dir.join(format!("{name}.json"));
    std::fs::write(&task_file, serde_json::to_vec(&task).unwrap()).unwrap();
    let stderr = if deferred_stderr {
        std::fs::File::open(&sandbox).unwrap()
    } else {
        std::fs::File::create(sandbox.join("executor.stderr")).unwrap()
    };
    let (ready_rx, ready_tx) = nix::unistd::pipe().unwrap();
    let request = ZygoteRequest {
        args: vec![
            "run".into(),
            "--task".into(),
            task_file.display().to_string(),
            "--sandbox".into(),
            sandbox.display().to_string(),
            "--no-isolation".into(),
            "--recovery-timeout".into(),
            "60s".into(),
        ],
    };
    let mut fds = vec![ready_tx.as_fd(), stderr.as_fd()];
    fds.extend(connection.map(|c| c.as_fd()));
    send_with_fds(ours.as_fd(), &serde_json::to_vec(&request).unwrap(), &fds).unwrap();
    drop(ready_tx);
    let (answer, mut fds) = reply(ours);
    let ZygoteReply::Started { pid } = answer else {
        panic!("expected started, got {answer:?}");
    };
    assert_eq!(fds.len(), 1, "a pidfd comes with `started`");
    Started {
        sandbox,
        pid: pid as i32,
        pidfd: fds.pop().unwrap(),
        ready: std::fs::File::from(ready_rx),
    }
}

impl Started {
    /// Waits for the readiness byte, then subscribes like the agent.
    fn subscribe(&mut self) -> (UnixStream, BufReader<UnixStream>) {
        let mut byte = [0u8; 1];
        assert_eq!(self.ready.read(&mut byte).unwrap(), 1, "readiness byte");
        let mut s = UnixStream::connect(self.sandbox.join("executor.sock")).unwrap();
        writeln!(s, "{}", json!({"op": "subscribe", "after_seq": 0})).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        let r = BufReader::new(s.try_clone().unwrap());
        (s, r)
    }

    /// Whether the pidfd says the process exited (it polls readable then).
    #[allow(unsafe_code)]
    fn exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call, no waiting.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
        n == 1
    }
}

fn next_status(r: &mut BufReader<UnixStream>) -> ExecutorStatus {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad status line {line:?}: {e}"))
}

fn until(r: &mut BufReader<UnixStream>, state: TaskState) -> ExecutorStatus {
    loop {
        let s = next_status(r);
        if s.state == state {
            return s;
        }
        assert!(!s.state.is_terminal(), "ended {s:?} before {state}");
    }
}

#[test]
fn zygote_forks_executors_reaps_them_and_exits_with_the_agent_leaving_them_running() {
    let dir = open_tempdir();
    let (ours, mut zygote, (hello, fds)) = start_zygote();
    assert!(
        matches!(hello, ZygoteReply::Ready { pid, .. } if pid == zygote.id()),
        "{hello:?}"
    );
    assert!(fds.is_empty());

    // A short task runs to FINISHED; its executor is reaped by the zygote.
    let mut short = run_task(&ours, dir.path(), "short", "true");
    assert_ne!(short.pid as u32, zygote.id());
    let (_s, mut r) = short.subscribe();
    let end = until(&mut r, TaskState::Finished);
    assert_eq!(
        end.executor_pid, short.pid as u32,
        "the forked child is the executor"
    );
    eventually(LONG, "the pidfd reports the exit", || short.exited());
    eventually(LONG, "the zygote reaps its child", || {
        !Path::new(&format!("/proc/{}", short.pid)).exists()
    });
    let checkpoint =
        checkpointed_status(&std::fs::read(short.sandbox.join("status.json")).unwrap());
    assert_eq!(checkpoint.map(|c| c.state), Some(TaskState::Finished));

    // A bad request forks nothing and the zygote keeps serving.
    let bad = serde_json::to_vec(&ZygoteRequest {
        args: vec!["cleanup".into()],
    })
    .unwrap();
    send_with_fds(ours.as_fd(), &bad, &[]).unwrap();
    let (answer, fds) = reply(&ours);
    assert!(matches!(answer, ZygoteReply::Failed { .. }), "{answer:?}");
    assert!(fds.is_empty());

    // A long task keeps running after the agent's end closes and the zygote exits.
    let mut long = run_task(&ours, dir.path(), "long", "exec sleep 1000");
    let (mut s, mut r) = long.subscribe();
    let running = until(&mut r, TaskState::Running);
    drop(ours);
    let deadline = Instant::now() + LONG;
    let status = loop {
        if let Some(status) = zygote.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the zygote did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "zygote exit: {status}");
    assert!(alive(long.pid), "the forked executor outlives its zygote");
    assert!(!long.exited());
    // The zygote's SIGCHLD mask did not reach the task: nothing blocked, and ignored
    // only what this test process ignores (as an exec'd executor's task would),
    // except SIGPIPE, which every Rust program ignores and its children reset.
    let task_pid = running.processes[0].pid.unwrap();
    let sig = |pid: &str, field: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = text.lines().find(|l| l.starts_with(field)).unwrap();
        u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
    };
    let task = task_pid.to_string();
    let sigpipe = 1u64 << (libc::SIGPIPE - 1);
    assert_eq!(sig(&task, "SigBlk:"), 0, "signals blocked in the task");
    assert_eq!(
        sig(&task, "SigIgn:"),
        sig("self", "SigIgn:") & !sigpipe,
        "signals ignored in the task"
    );
    writeln!(s, "{}", json!({"op": "kill"})).unwrap();
    let end = loop {
        let st = next_status(&mut r);
        if st.state.is_terminal() {
            break st;
        }
    };
    assert_eq!(end.state, TaskState::Killed);
    eventually(LONG, "the orphaned executor exits", || long.exited());
}

#[test]
fn an_executor_given_the_agents_connection_binds_its_socket_only_once_it_closes() {
    let dir = open_tempdir();
    let (ours, mut zygote, _) = start_zygote();
    let (agent, executor_end) = UnixStream::pair().unwrap();
    let mut task = run_task_with(
        &ours,
        dir.path(),
        "paired",
        "exec sleep 1000",
        Some(&executor_end),
        true,
    );
    drop(executor_end);
    let mut byte = [0u8; 1];
    assert_eq!(task.ready.read(&mut byte).unwrap(), 1, "readiness byte");
    let mut s = agent;
    writeln!(s, "{}", json!({"op": "subscribe", "after_seq": 0})).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let running = until(&mut r, TaskState::Running);
    let socket = task.sandbox.join("executor.sock");
    assert!(
        !socket.exists(),
        "no socket while the agent's connection lasts"
    );
    // Handed the task directory for its stderr, the executor creates `executor.stderr` only
    // when it has something to say.
    let stderr_file = task.sandbox.join("executor.stderr");
    assert!(
        !stderr_file.exists(),
        "no stderr file before the first line"
    );
    writeln!(s, "not a request").unwrap();
    eventually(LONG, "the executor's complaint in executor.stderr", || {
        std::fs::read_to_string(&stderr_file)
            .is_ok_and(|t| t.contains("ignoring a bad socket request"))
    });
    // The agent goes away: the executor binds its socket for the next one, which
    // gets what it missed and can kill the task.
    drop((s, r));
    eventually(LONG, "the socket is bound", || {
        UnixStream::connect(&socket).is_ok()
    });
    let mut s = UnixStream::connect(&socket).unwrap();
    writeln!(
        s,
        "{}",
        json!({"op": "subscribe", "after_seq": running.seq - 1})
    )
    .unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(next_status(&mut r).seq, running.seq);
    writeln!(s, "{}", json!({"op": "kill"})).unwrap();
    assert_eq!(until_terminal(&mut r).state, TaskState::Killed);
    eventually(LONG, "the executor exits", || task.exited());
    drop(ours);
    assert!(zygote.wait().unwrap().success());
}

fn until_terminal(r: &mut BufReader<UnixStream>) -> ExecutorStatus {
    loop {
        let st = next_status(r);
        if st.state.is_terminal() {
            return st;
        }
    }
}
