//! Black-box tests of `drover-executor`: real processes in real (v1) cgroups, as root.
//! Each test prints SKIPPED and returns when not root or without cgroups.

// Test helpers outside #[test] functions panic on failure on purpose.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use drover_common::state::{now_ms, ExitReason, TaskState};
use drover_common::wire::{checkpointed_status, ExecutorStatus, ProcessState};
use nix::sys::signal::Signal;
use serde_json::json;
use support::*;

const LONG: Duration = Duration::from_secs(30);

fn http_task(
    id: &str,
    port: u16,
    service_flags: &str,
    graceful: &str,
    shutdown: &str,
) -> serde_json::Value {
    task_json(
        id,
        json!({
            "processes": [{
                "name": "svc",
                "cmdline": format!("exec ../../{SERVICE} --port {{{{ports.health}}}} --record rec {service_flags}"),
            }],
            "resources": {"cpu": 1.0, "ram": "256MiB", "disk": "64MiB", "ports": ["health"]},
        }),
        json!({
            "ports": {"health": port},
            "health_check": {"initial_interval": "5s", "interval": "100ms", "timeout": "1s"},
            "lifecycle": {"http": {"graceful_shutdown_wait": graceful, "shutdown_wait": shutdown}},
        }),
    )
}

#[test]
fn kill_escalation_posts_quit_then_abort_then_sigterm_then_sigkill_with_configured_waits() {
    if !can_isolate("kill_escalation_order") {
        return;
    }
    let id = task_id("escalate");
    let port = free_port();
    let mut ex = Exec::start(
        &http_task(&id, port, "--ignore-term", "1s", "1s"),
        &["--standalone"],
    );
    let running = ex.wait_state(TaskState::Running, LONG);
    let pid = running.processes[0].pid.unwrap() as i32;
    let t0 = now_ms();
    ex.signal(Signal::SIGTERM);
    ex.wait_state(TaskState::Killing, LONG);
    let end = ex.wait_terminal(LONG);
    let elapsed = now_ms() - t0;
    assert_eq!(end.state, TaskState::Killed);
    assert_eq!(end.exit_reason, Some(ExitReason::KilledByRequest));
    assert!(!alive(pid), "the TERM-ignoring service survived");
    let rec = recorded(&ex.path("rec"));
    let quit = rec
        .iter()
        .find(|(_, r)| r == "POST /quitquitquit")
        .expect("quitquitquit posted")
        .0;
    let abort = rec
        .iter()
        .find(|(_, r)| r == "POST /abortabortabort")
        .expect("abortabortabort posted")
        .0;
    assert!(
        quit >= t0 && quit < t0 + 500,
        "quit {} ms after kill",
        quit - t0
    );
    let wait1 = abort - quit;
    assert!(
        (900..1500).contains(&wait1),
        "graceful wait was {wait1} ms, expected ~1000"
    );
    // quit, 1 s, abort, 1 s, SIGTERM (ignored), 1 s finalization_wait, SIGKILL.
    assert!(
        (2_900..5_000).contains(&elapsed),
        "escalation took {elapsed} ms, expected ~3000"
    );
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn kill_escalation_stops_once_the_process_exits_on_quitquitquit() {
    if !can_isolate("kill_escalation_stops_early") {
        return;
    }
    let id = task_id("early");
    let port = free_port();
    let mut ex = Exec::start(
        &http_task(&id, port, "--exit-on-quit", "5s", "5s"),
        &["--standalone"],
    );
    ex.wait_state(TaskState::Running, LONG);
    let t0 = Instant::now();
    ex.signal(Signal::SIGTERM);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Killed);
    assert!(
        t0.elapsed() < Duration::from_millis(2_500),
        "took {:?}: the 5 s wait was not cut short",
        t0.elapsed()
    );
    let rec = recorded(&ex.path("rec"));
    assert!(rec.iter().any(|(_, r)| r == "POST /quitquitquit"));
    assert!(
        !rec.iter().any(|(_, r)| r == "POST /abortabortabort"),
        "escalation went on: {rec:?}"
    );
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn running_is_gated_on_health_and_the_snooze_file_pauses_checks() {
    if !can_isolate("health_gating") {
        return;
    }
    let id = task_id("gate");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "exec sleep 1000"}]}),
        json!({"health_check": {
            "type": "shell", "command": "test -f ready",
            "initial_interval": "3s", "interval": "100ms", "timeout": "1s",
            "max_consecutive_failures": 3, "min_consecutive_successes": 2,
        }}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    ex.wait_state(TaskState::Starting, LONG);
    std::thread::sleep(Duration::from_millis(800));
    while let Ok(s) = ex.statuses.try_recv() {
        assert_ne!(
            s.state,
            TaskState::Running,
            "RUNNING before the health check passed"
        );
        ex.seen.push(s);
    }
    std::fs::write(ex.path("ready"), "").unwrap();
    ex.wait_state(TaskState::Running, LONG);
    // Snoozed: failing checks do not count.
    std::fs::write(ex.path(".healthchecksnooze"), "").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(ex.path("ready")).unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    while let Ok(s) = ex.statuses.try_recv() {
        assert!(!s.state.is_terminal(), "killed while snoozed: {s:?}");
        ex.seen.push(s);
    }
    std::fs::remove_file(ex.path(".healthchecksnooze")).unwrap();
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed);
    match end.exit_reason {
        Some(ExitReason::HealthCheckFailed { last_error }) => {
            assert!(last_error.contains("test -f ready"), "{last_error}")
        }
        other => panic!("expected a health check failure, got {other:?}"),
    }
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn failing_http_health_checks_kill_the_task_with_the_last_error() {
    if !can_isolate("http_health_fails") {
        return;
    }
    let id = task_id("sick");
    let port = free_port();
    let mut task = http_task(&id, port, "", "1s", "1s");
    task["health_check"] = json!({"endpoint": "/nope", "initial_interval": "200ms", "interval": "100ms", "max_consecutive_failures": 1});
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed);
    match end.exit_reason {
        Some(ExitReason::HealthCheckFailed { last_error }) => {
            assert!(last_error.contains("404"), "{last_error}")
        }
        other => panic!("expected a health check failure, got {other:?}"),
    }
    // The lifecycle endpoints were used to stop it.
    assert!(recorded(&ex.path("rec"))
        .iter()
        .any(|(_, r)| r == "POST /quitquitquit"));
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn fork_bomb_hits_the_pids_limit_and_the_kill_leaves_nothing() {
    if !can_isolate("fork_bomb") {
        return;
    }
    let id = task_id("bomb");
    let task = task_json(
        &id,
        json!({"processes": [
            {"name": "bomb",
                // Every level leaves a sleeper behind and forks the next level, until
                // forks fail at the pids limit; the first process stays as a sleeper.
                "cmdline": "b() { sleep 1000 & b & }; b; exec sleep 1000"},
        ]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone", "--pids-max", "64"]);
    ex.wait_state(TaskState::Running, LONG);
    let pids_dir = format!("/sys/fs/cgroup/pids/drover/{id}");
    eventually(LONG, "the pids limit to be hit", || {
        std::fs::read_to_string(format!("{pids_dir}/pids.events"))
            .map(|e| !e.contains("max 0"))
            .unwrap_or(false)
    });
    let current: u64 = std::fs::read_to_string(format!("{pids_dir}/pids.current"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(current <= 64, "{current} pids over the limit");
    ex.signal(Signal::SIGTERM);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Killed);
    assert_eq!(ex.wait_exit(LONG), 1);
    assert!(
        !std::path::Path::new(&pids_dir).exists(),
        "cgroup {pids_dir} left behind"
    );
}

/// Processes the executor starts are born in the task's cgroup (v2) or join it before
/// they can fork and back out over the limit (v1), so a task of many processes and a
/// fork bomb never holds more than its `pids` at once: the starts beyond it fail
/// (`EAGAIN`, as a fork would) instead of being moved in past `pids.max`.
#[test]
fn a_task_never_holds_more_than_its_pids_limit_whoever_starts_the_processes() {
    if !can_isolate("pids_at_once") {
        return;
    }
    let id = task_id("pidsonce");
    let limit = 16u64;
    let mut processes = vec![json!({"name": "bomb",
        "cmdline": "b() { sleep 30 & b & }; b; exec sleep 30"})];
    for i in 0..40 {
        processes.push(json!({"name": format!("p{i}"), "cmdline": "sleep 30"}));
    }
    let task = task_json(
        &id,
        json!({"processes": processes, "max_failures": 100,
               "resources": {"cpu": 1.0, "ram": "256MiB", "disk": "64MiB", "pids": limit}}),
        json!({}),
    );
    let version = drover_executor::cgroup::FsCgroup::detect(std::path::Path::new("/sys/fs/cgroup"));
    let current = match version {
        Some(drover_executor::cgroup::Version::V1) => {
            format!("/sys/fs/cgroup/pids/drover/{id}/pids.current")
        }
        _ => format!("/sys/fs/cgroup/drover/{id}/pids.current"),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let current = current.clone();
        std::thread::spawn(move || {
            let (mut max, mut samples) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = std::fs::read_to_string(&current) {
                    max = max.max(n.trim().parse().unwrap_or(0));
                    samples += 1;
                }
            }
            (max, samples)
        })
    };
    let mut ex = Exec::start(&task, &["--standalone"]);
    eventually(LONG, "the cgroup to fill up", || {
        std::fs::read_to_string(&current)
            .map(|n| n.trim().parse::<u64>().unwrap_or(0) >= limit - 1)
            .unwrap_or(false)
    });
    std::thread::sleep(Duration::from_millis(300));
    ex.signal(Signal::SIGTERM);
    let end = ex.wait_terminal(LONG);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (max, samples) = sampler.join().unwrap();
    assert!(samples > 10, "the sampler read {current} {samples} times");
    // v1 only: a refused child is counted for the moment between its join and its
    // exit (the kernel does not check a migration, so it checks and backs out itself).
    let slack = u64::from(version == Some(drover_executor::cgroup::Version::V1));
    assert!(
        max <= limit + slack,
        "{max} pids at once in a task limited to {limit}"
    );
    let refused = end
        .processes
        .iter()
        .chain(ex.seen.iter().flat_map(|s| s.processes.iter()))
        .any(|p| matches!(&p.last_exit, Some(ExitReason::FailedToStart { error, .. }) if error.contains("temporarily unavailable")));
    assert!(refused, "a start over the limit fails with EAGAIN: {end:?}");
    assert_eq!(ex.wait_exit(LONG), 1);
}

/// `resources.disk` is enforced by a scan of what the task can write, its private
/// `/tmp` included: over it, the task is stopped and fails with `disk_limit_exceeded`
/// naming the usage and the limit.
#[test]
fn a_task_writing_past_its_disk_limit_fails_with_disk_limit_exceeded() {
    if !can_isolate("disk_limit") {
        return;
    }
    let id = task_id("disk");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "fill",
            "cmdline": "head -c 3000000 /dev/zero > /tmp/big && exec sleep 100"}],
               "resources": {"cpu": 1.0, "ram": "64MiB", "disk": "2MiB"}}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone", "--disk-scan-interval", "100ms"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed, "{end:?}");
    match end.exit_reason {
        Some(ExitReason::DiskLimitExceeded {
            used_bytes,
            limit_bytes,
        }) => {
            assert_eq!(limit_bytes, 2 << 20);
            assert!(used_bytes > 3_000_000, "{used_bytes}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        ex.seen
            .iter()
            .any(|s| s.message.contains("over resources.disk")),
        "{:?}",
        ex.seen
    );
    assert_eq!(ex.wait_exit(LONG), 1);
}

/// `task.network: isolated`: the task's own network namespace, where loopback is the
/// only interface (up, so the task can still talk to itself).
#[test]
fn an_isolated_task_sees_only_loopback() {
    if !can_isolate("isolated_network") {
        return;
    }
    let id = task_id("netiso");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "p",
            "cmdline": "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ,; grep -c '' /proc/net/route"}],
               "network": "isolated"}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Finished, "{end:?}");
    let out = std::fs::read_to_string(ex.area("logs/p.stdout")).unwrap();
    // Only `lo`; and no route out (the route table has its header line only).
    assert_eq!(out, "lo,1\n");
    assert_eq!(ex.wait_exit(LONG), 0);
}

/// `task.network: isolated` with a named port: the executor listens on the host on
/// the assigned port and forwards each connection into the task's namespace, so the
/// HTTP health check passes, the host reaches the service, and the escalation's
/// lifecycle POST arrives.
#[test]
fn an_isolated_tasks_named_port_is_forwarded_from_the_host() {
    if !can_isolate("isolated_forwarded_port") {
        return;
    }
    let id = task_id("netfwd");
    let port = free_port();
    let mut task = http_task(&id, port, "", "1s", "1s");
    task["task"]["network"] = json!("isolated");
    // Not standalone: after the task ends the executor waits for an agent.
    let mut ex = Exec::start(&task, &["--recovery-timeout", "60s"]);
    ex.wait_state(TaskState::Running, LONG);
    assert!(
        ex.seen
            .iter()
            .any(|s| s.message.contains("network namespaces")),
        "{:?}",
        ex.seen
    );
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut conn, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    ex.signal(Signal::SIGTERM);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Killed, "{end:?}");
    let rec = recorded(&ex.path("rec"));
    assert!(
        rec.iter().any(|(_, r)| r == "POST /quitquitquit"),
        "{rec:?}"
    );
    // The task ended: its port is free for another task while the executor waits.
    eventually(
        Duration::from_secs(3),
        "the forwarded port to be closed",
        || std::net::TcpListener::bind(("0.0.0.0", port)).is_ok(),
    );
    assert!(ex.child.try_wait().unwrap().is_none(), "the executor waits");
}

/// The TCP health check of an isolated task connects inside its namespace: the
/// forwarder on the host accepts whether or not the task listens, so a task that
/// does not listen fails its check.
#[test]
fn an_isolated_tasks_tcp_check_fails_when_the_task_does_not_listen() {
    if !can_isolate("isolated_tcp_check") {
        return;
    }
    let id = task_id("nettcp");
    let port = free_port();
    let task = task_json(
        &id,
        json!({"processes": [{"name": "p", "cmdline": "exec sleep 30"}],
               "resources": {"cpu": 1.0, "ram": "64MiB", "disk": "64MiB", "ports": ["p"]},
               "network": "isolated"}),
        json!({"ports": {"p": port},
               "health_check": {"type": "tcp", "port": "p", "initial_interval": "0s",
                                "interval": "100ms", "timeout": "1s",
                                "max_consecutive_failures": 1}}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed, "{end:?}");
    assert!(
        matches!(end.exit_reason, Some(ExitReason::HealthCheckFailed { .. })),
        "{end:?}"
    );
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn memory_hog_ends_with_exit_reason_oom() {
    if !can_isolate("oom") {
        return;
    }
    let id = task_id("hog");
    let task = task_json(
        &id,
        json!({
            "processes": [{"name": "hog", "cmdline": "tail /dev/zero"}],
            "resources": {"cpu": 1.0, "ram": "32MiB", "disk": "64MiB"},
        }),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed);
    assert_eq!(end.exit_reason, Some(ExitReason::OomKilled), "{end:?}");
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn setsid_grandchild_is_killed_with_the_task() {
    if !can_isolate("setsid_grandchild") {
        return;
    }
    let id = task_id("orphan");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main",
            "cmdline": "setsid sh -c 'trap \"\" TERM; exec sleep 1000.4711' & sleep 0.5; echo started"}]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Finished, "{end:?}");
    // Found by its command line: a pid the task writes down is its pid namespace's.
    eventually(
        Duration::from_secs(5),
        "the setsid'd grandchild to die",
        || host_pids_running(b"sleep\x001000.4711\x00").is_empty(),
    );
    assert_eq!(ex.wait_exit(LONG), 0);
}

#[test]
fn process_restarts_until_max_failures_and_no_faster_than_min_duration() {
    if !can_isolate("restarts") {
        return;
    }
    let id = task_id("restart");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "flaky", "cmdline": "date +%s%3N >> starts; exit 3",
            "max_failures": 3, "min_duration": "500ms"}]}),
        json!({}),
    );
    let started_ms = now_ms();
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed);
    assert_eq!(end.exit_reason, Some(ExitReason::ExitCode { code: 3 }));
    assert_eq!(end.processes[0].runs, 3);
    assert_eq!(end.processes[0].state, ProcessState::Failed);
    let starts: Vec<u64> = std::fs::read_to_string(ex.path("starts"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(starts.len(), 3);
    // Each run starts at least min_duration after the one before, and the first not
    // before the executor did, so the third at least 2 x 500 ms after the executor.
    // (`date` runs after fork and exec: a run that printed late under load shortens
    // the gap to the next, so the gaps themselves are not compared.)
    assert!(
        starts[2] - started_ms >= 1_000,
        "third run {} ms after the executor started",
        starts[2] - started_ms
    );
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn ordering_and_final_processes_run_in_order() {
    if !can_isolate("ordering") {
        return;
    }
    let id = task_id("order");
    let step = |n: &str| format!("sleep 0.1; echo {n} >> trace");
    let task = task_json(
        &id,
        json!({
            "processes": [
                {"name": "f2", "cmdline": step("f2"), "final": true},
                {"name": "b", "cmdline": step("b")},
                {"name": "f1", "cmdline": step("f1"), "final": true},
                {"name": "a", "cmdline": step("a")},
            ],
            "order": [["a", "b"], ["f1", "f2"]],
        }),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Finished, "{end:?}");
    let trace = std::fs::read_to_string(ex.path("trace")).unwrap();
    assert_eq!(
        trace.split_whitespace().collect::<Vec<_>>(),
        ["a", "b", "f1", "f2"]
    );
    assert_eq!(ex.wait_exit(LONG), 0);
}

#[test]
fn missing_binary_fails_to_start_naming_the_path() {
    if !can_isolate("failed_to_start") {
        return;
    }
    let id = task_id("nobin");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "./no-such-binary --flag"}]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Failed);
    match end.exit_reason {
        Some(ExitReason::FailedToStart { process, error }) => {
            assert_eq!(process, "main");
            assert!(
                error.contains("no-such-binary: binary not found"),
                "{error}"
            );
        }
        other => panic!("expected FailedToStart, got {other:?}"),
    }
    assert_eq!(ex.wait_exit(LONG), 1);
    assert_eq!(ex.seen.len(), 2, "STARTING then FAILED: {:#?}", ex.seen);
}

#[test]
fn root_task_is_refused_unless_spec_and_flag_allow_it() {
    if !can_isolate("root_refused") {
        return;
    }
    let id = task_id("root");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "true"}], "user": "root", "allow_root": true}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert!(
        matches!(end.exit_reason, Some(ExitReason::SandboxSetupFailed { ref error }) if error.contains("--allow-root")),
        "{end:?}"
    );
    assert_eq!(ex.wait_exit(LONG), 2);
    let mut ex = Exec::start(&task, &["--standalone", "--allow-root"]);
    assert_eq!(ex.wait_terminal(LONG).state, TaskState::Finished);
}

fn subscribe(sock: &std::path::Path, after_seq: u64) -> (UnixStream, BufReader<UnixStream>) {
    let mut s = UnixStream::connect(sock).unwrap();
    writeln!(s, "{}", json!({"op": "subscribe", "after_seq": after_seq})).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn read_status(r: &mut BufReader<UnixStream>) -> ExecutorStatus {
    let mut line = String::new();
    r.get_ref().set_read_timeout(Some(LONG)).unwrap();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad status line {line:?}: {e}"))
}

#[test]
fn a_killed_client_leaves_the_task_running_and_a_new_client_gets_missed_updates() {
    if !can_isolate("reconnect") {
        return;
    }
    let id = task_id("reconnect");
    let task = task_json(
        &id,
        json!({"processes": [
            {"name": "main", "cmdline": "exec sleep 1000"},
            {"name": "short", "cmdline": "sleep 1.5", "ephemeral": true},
        ]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--recovery-timeout", "30s"]);
    let running = ex.wait_state(TaskState::Running, LONG);
    let sock = ex.area("executor.sock");
    // The agent stand-in: a process that subscribes, then dies by SIGKILL.
    let mut agent = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!(
            "import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.connect({:?})\ns.sendall(b'{{\"op\":\"subscribe\",\"after_seq\":0}}\\n')\nf=s.makefile()\nprint(f.readline(),flush=True)\ntime.sleep(1000)",
            sock.display().to_string()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(agent.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("\"seq\":1"), "{first}");
    agent.kill().unwrap();
    agent.wait().unwrap();
    // An update happens while no agent is connected: `short` exits.
    let missed = ex.wait_for(LONG, "short exited", |s| {
        s.processes
            .iter()
            .any(|p| p.name == "short" && p.state == ProcessState::Succeeded)
    });
    let pid = running.processes[0].pid.unwrap() as i32;
    assert!(alive(pid), "the task died with its client");
    let (mut s, mut r) = subscribe(&sock, running.seq);
    let mut got = Vec::new();
    while got.last().map(|x: &ExecutorStatus| x.seq) != Some(missed.seq) {
        got.push(read_status(&mut r));
    }
    assert_eq!(
        got[0].seq,
        running.seq + 1,
        "the replay starts right after after_seq"
    );
    let checkpoint = checkpointed_status(&std::fs::read(ex.area("status.json")).unwrap());
    assert_eq!(checkpoint, Some(missed));
    // Kill through the socket; the terminal status arrives there, then the executor exits.
    writeln!(s, "{}", json!({"op": "kill"})).unwrap();
    let end = loop {
        let st = read_status(&mut r);
        if st.state.is_terminal() {
            break st;
        }
    };
    assert_eq!(end.state, TaskState::Killed);
    assert_eq!(end.exit_reason, Some(ExitReason::KilledByRequest));
    assert_eq!(ex.wait_exit(LONG), 1);
    assert!(!alive(pid));
}

#[test]
fn without_an_agent_past_the_recovery_timeout_the_task_is_killed() {
    if !can_isolate("recovery_timeout") {
        return;
    }
    let id = task_id("orphaned");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "exec sleep 1000"}]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--recovery-timeout", "1s"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Killed);
    assert_eq!(end.exit_reason, Some(ExitReason::AgentLost));
    assert_eq!(ex.wait_exit(LONG), 1);
}

#[test]
fn cleanup_after_an_executor_crash_kills_what_is_left_and_is_idempotent() {
    if !can_isolate("cleanup") {
        return;
    }
    let id = task_id("crash");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "sleep 1000 & exec sleep 1000"}]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--recovery-timeout", "1m"]);
    let running = ex.wait_state(TaskState::Running, LONG);
    let pid = running.processes[0].pid.unwrap() as i32;
    ex.signal(Signal::SIGKILL);
    ex.wait_exit_unchecked(LONG);
    // Its pid namespace's init dies with the executor, and with it every process of
    // the task (the agent would report it LOST and run cleanup anyway).
    eventually(
        Duration::from_secs(5),
        "the task to die with its executor",
        || !alive(pid),
    );
    // What an executor from before the freezer was dropped also made (v1 hosts).
    let freezer = std::path::PathBuf::from(format!("/sys/fs/cgroup/freezer/drover/{id}"));
    let old_layout = std::path::Path::new("/sys/fs/cgroup/freezer").is_dir()
        && std::fs::create_dir_all(&freezer).is_ok();
    for _ in 0..2 {
        let status = std::process::Command::new(executor_bin())
            .args(["cleanup", "--sandbox"])
            .arg(&ex.sandbox)
            .status()
            .unwrap();
        assert!(status.success());
    }
    eventually(Duration::from_secs(5), "the task to die", || !alive(pid));
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/memory/drover/{id}")).exists());
    if old_layout {
        assert!(!freezer.exists(), "the old freezer cgroup is removed too");
    }
}

#[test]
fn bad_task_file_is_a_usage_error() {
    let dir = open_tempdir();
    let file = dir.path().join("task.json");
    std::fs::write(&file, "{\"task_id\": 1}").unwrap();
    let out = std::process::Command::new(executor_bin())
        .args(["run", "--no-isolation", "--standalone", "--task"])
        .arg(&file)
        .arg("--sandbox")
        .arg(dir.path().join("sb"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a valid task"), "{err}");
}

#[test]
fn process_output_goes_to_rotated_log_files() {
    if !can_isolate("logs") {
        return;
    }
    let id = task_id("logs");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "chatty",
            "cmdline": "for i in 1 2 3 4 5 6; do echo line-$i-$DROVER_TASK_ID; sleep 0.05; done; echo oops >&2"},
            {"name": "quiet", "cmdline": "true"}]}),
        json!({}),
    );
    let mut ex = Exec::start(
        &task,
        &[
            "--standalone",
            "--log-max-size",
            "60B",
            "--log-max-files",
            "2",
        ],
    );
    assert_eq!(ex.wait_terminal(LONG).state, TaskState::Finished);
    let logs = ex.area("logs");
    let read = |f: &str| std::fs::read_to_string(logs.join(f)).unwrap_or_default();
    assert_eq!(read("chatty.stderr"), "oops\n");
    let all = format!(
        "{}{}{}",
        read("chatty.stdout.2"),
        read("chatty.stdout.1"),
        read("chatty.stdout")
    );
    assert!(all.contains(&format!("line-6-{id}")), "{all}");
    assert!(
        logs.join("chatty.stdout.1").exists(),
        "no rotation happened"
    );
    assert!(!logs.join("chatty.stdout.3").exists());
    assert!(
        !logs.join("quiet.stdout").exists() && !logs.join("quiet.stderr").exists(),
        "a process that printed nothing has no log files"
    );
    assert_eq!(ex.wait_exit(LONG), 0);
}

#[test]
fn a_silent_task_leaves_no_log_files_and_reports_every_status() {
    if !can_isolate("silent") {
        return;
    }
    let id = task_id("silent");
    let task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "true"}]}),
        json!({}),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Finished, "{end:?}");
    assert_eq!(ex.wait_exit(LONG), 0);
    // STARTING and RUNNING share one checkpoint, but each is reported with its seq.
    let states: Vec<TaskState> = ex.seen.iter().map(|s| s.state).collect();
    assert_eq!(
        states,
        [TaskState::Starting, TaskState::Running, TaskState::Finished]
    );
    let checkpoint = checkpointed_status(&std::fs::read(ex.area("status.json")).unwrap());
    assert_eq!(checkpoint, Some(end));
    assert!(
        !ex.area("logs").exists(),
        "logs are created on the first byte of output"
    );
}

#[test]
fn no_isolation_runs_without_a_cgroup() {
    let id = task_id("noiso");
    let mut task = task_json(
        &id,
        json!({"processes": [{"name": "main", "cmdline": "echo $DROVER_INSTANCE > out"}]}),
        json!({}),
    );
    task["instance"] = json!(7);
    let mut ex = Exec::start(&task, &["--standalone", "--no-isolation"]);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Finished, "{end:?}");
    assert!(end.processes[0].last_exit == Some(ExitReason::ExitCode { code: 0 }));
    assert_eq!(std::fs::read_to_string(ex.path("out")).unwrap(), "7\n");
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/pids/drover/{id}")).exists());
    assert_eq!(ex.wait_exit(LONG), 0);
}

// The executor once its task settled: it unmaps the startup pages of its binary
// (docs/executor.md, "Memory") and goes on supervising with code mapped again from
// the file.

/// KiB resident in the read-only mappings (code, read-only data) of `pid`'s program
/// file, which is the executor binary.
fn resident_binary_kib(pid: u32) -> u64 {
    let binary = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut ours = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            // A mapping's header: range, perms, offset, dev, inode, path.
            ours = fields.len() >= 6
                && !fields[1].contains('w')
                && std::path::Path::new(fields[5]) == binary;
        } else if ours && fields.first() == Some(&"Rss:") {
            kib += fields[1].parse::<u64>().unwrap();
        }
    }
    kib
}

fn health_checks(ex: &Exec) -> usize {
    recorded(&ex.path("rec"))
        .iter()
        .filter(|(_, r)| r == "GET /health")
        .count()
}

#[test]
fn a_settled_executor_unmaps_its_startup_pages_and_still_checks_and_stops_its_task() {
    if !can_isolate("settled_executor_unmaps_startup_pages") {
        return;
    }
    // Two executors of the same task, one told to keep its pages: what the other has
    // resident once settled is what it mapped again, which is less than everything
    // it ran (how much less depends on where the build put the code it runs).
    // An HTTP lifecycle, so that stopping also runs the health checker's client.
    let task = |name| http_task(&task_id(name), free_port(), "--exit-on-quit", "5s", "5s");
    let mut ex = Exec::start(&task("settle"), &["--standalone"]);
    let mut kept = Exec::start_with_env(
        &task("settle-kept"),
        &["--standalone"],
        &[("DROVER_EXECUTOR_RELEASE_STARTUP", "0")],
    );
    let pid = ex.wait_state(TaskState::Running, LONG).executor_pid;
    let kept_pid = kept.wait_state(TaskState::Running, LONG).executor_pid;
    // Settled 2 s after RUNNING.
    eventually(
        Duration::from_secs(10),
        "the executor's startup pages unmapped",
        || resident_binary_kib(pid) + 64 < resident_binary_kib(kept_pid),
    );
    let checks = health_checks(&ex);
    eventually(
        Duration::from_secs(10),
        "health checks going on after the release",
        || health_checks(&ex) >= checks + 5,
    );
    let (settled, all) = (resident_binary_kib(pid), resident_binary_kib(kept_pid));
    ex.signal(Signal::SIGTERM);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Killed);
    assert_eq!(end.exit_reason, Some(ExitReason::KilledByRequest));
    let rec = recorded(&ex.path("rec"));
    assert!(
        rec.iter().any(|(_, r)| r == "POST /quitquitquit"),
        "{rec:?}"
    );
    assert_eq!(ex.wait_exit(LONG), 1);
    eprintln!("binary resident once settled {settled} KiB, kept {all} KiB");
}
