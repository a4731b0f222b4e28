//! An executor whose task has settled unmaps the startup pages of its own binary
//! (docs/executor.md, "Memory") and goes on supervising: health checks continue and
//! the kill escalation runs with code mapped again from the file. Real processes in
//! real (v1) cgroups, as root.

// Test helpers outside #[test] functions panic on failure on purpose.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use drover_common::state::{ExitReason, TaskState};
use nix::sys::signal::Signal;
use serde_json::json;
use support::*;

const LONG: Duration = Duration::from_secs(30);

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
    let id = task_id("settle");
    let task = task_json(
        &id,
        json!({
            "processes": [{
                "name": "svc",
                "cmdline": format!("exec ../{SERVICE} --port {{{{ports.health}}}} --record rec"),
            }],
            "resources": {"cpu": 1.0, "ram": "256MiB", "disk": "64MiB", "ports": ["health"]},
        }),
        json!({
            "ports": {"health": free_port()},
            "health_check": {"initial_interval": "5s", "interval": "100ms", "timeout": "1s"},
        }),
    );
    let mut ex = Exec::start(&task, &["--standalone"]);
    let running = ex.wait_state(TaskState::Running, LONG);
    let pid = running.executor_pid;
    let started = resident_binary_kib(pid);
    // Settled 2 s after RUNNING.
    eventually(
        Duration::from_secs(10),
        "the executor's startup pages unmapped",
        || resident_binary_kib(pid) < started - 512,
    );
    let settled = resident_binary_kib(pid);
    let checks = health_checks(&ex);
    eventually(
        Duration::from_secs(10),
        "health checks going on after the release",
        || health_checks(&ex) >= checks + 5,
    );
    ex.signal(Signal::SIGTERM);
    let end = ex.wait_terminal(LONG);
    assert_eq!(end.state, TaskState::Killed);
    assert_eq!(end.exit_reason, Some(ExitReason::KilledByRequest));
    assert_eq!(ex.wait_exit(LONG), 1);
    eprintln!("binary resident at RUNNING {started} KiB, settled {settled} KiB");
}
