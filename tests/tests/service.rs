//! Black-box: a 3-instance service with an HTTP health check on three agents. All
//! instances become RUNNING on distinct agents; killing one instance's process gets
//! it replaced with its history kept; the CLI shows status, task details and logs;
//! killing the job ends in KILLED after the escalation with every process gone.

use std::collections::BTreeSet;
use std::time::Duration;

use drover_common::state::{ExitReason, TaskState};
use drover_tests::{
    describe, process_alive, running_as_root, service_job, Cluster, ClusterConfig, WAIT,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const KEY: &str = "www-data/test/web";

#[test]
fn service_runs_healthy_is_replaced_when_killed_and_is_killed_by_request() {
    if !running_as_root("service test") {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(3)).unwrap();

    // Create through the CLI from a JSON file, waiting for RUNNING.
    let output = cluster
        .create_with_cli("web.json", &service_job("web", 3))
        .unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        describe(&output),
        cluster.diagnostics()
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("all 3 instance(s) RUNNING"),
        "{}",
        describe(&output)
    );

    let view = cluster.wait_for_all(KEY, TaskState::Running).unwrap();
    let agents: BTreeSet<String> = view
        .instances
        .iter()
        .filter_map(|i| i.current.as_ref()?.agent_id.clone())
        .collect();
    assert_eq!(agents.len(), 3, "one instance per host: {view:?}");

    // Each instance answers on its assigned port.
    for instance in &view.instances {
        let task = instance.current.as_ref().unwrap();
        let port = task.ports["http"];
        let body = reqwest::blocking::get(format!("http://127.0.0.1:{port}/health"))
            .and_then(|r| r.text())
            .unwrap();
        assert_eq!(body, "ok");
    }

    // The CLI's views.
    let output = cluster.drover(&["job", "status", KEY]).unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let status = String::from_utf8_lossy(&output.stdout);
    assert!(
        status.starts_with("www-data/test/web: 3 instance(s), service; RUNNING 3"),
        "{status}"
    );
    // Rows below the column header, counted by their STATE column.
    let mut rows = status.lines().skip_while(|l| !l.starts_with("INSTANCE"));
    let header = rows.next().unwrap_or_default();
    let state_col = header
        .split_whitespace()
        .position(|c| c == "STATE")
        .unwrap();
    let running_rows = rows
        .filter(|row| row.split_whitespace().nth(state_col) == Some("RUNNING"))
        .count();
    assert_eq!(running_rows, 3, "{status}");
    let output = cluster.drover(&["job", "status", KEY, "--json"]).unwrap();
    let parsed: drover_common::wire::JobView = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(parsed.key, KEY);
    let output = cluster.drover(&["job", "list", "www-data"]).unwrap();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(KEY),
        "{}",
        describe(&output)
    );
    let output = cluster.drover(&["agent", "list"]).unwrap();
    let agent_list = String::from_utf8_lossy(&output.stdout);
    assert!(agent_list.contains("rack=r2"), "{}", describe(&output));

    let victim = view.instances[1].current.clone().unwrap();
    let output = cluster.drover(&["task", "show", &victim.task_id]).unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("State:    RUNNING"), "{shown}");
    assert!(shown.contains("server"), "lists the process: {shown}");
    let output = cluster
        .drover(&["task", "logs", &format!("{KEY}/1")])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("serving on"),
        "{}",
        describe(&output)
    );
    // The agent's log server answers only the master (401 to anyone else), and
    // the master's log route never serves a path outside the sandbox.
    let agents = cluster.agents().unwrap();
    let agent = agents
        .iter()
        .find(|a| Some(&a.agent_id) == victim.agent_id.as_ref())
        .unwrap();
    let direct = format!(
        "{}/v1/tasks/{}/logs/main/stdout",
        agent.address, victim.task_id
    );
    let response = reqwest::blocking::get(&direct).unwrap();
    assert_eq!(response.status().as_u16(), 401, "{direct}");
    for process in ["..", "..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd"] {
        let path = format!("/v1/tasks/{}/logs/{process}/stdout", victim.task_id);
        let (status, body) = cluster.get_status(&path).unwrap();
        assert!((400..500).contains(&status), "{path}: {status} {body}");
        assert!(!body.contains("root:"), "{path}: {body}");
    }

    // Kill instance 1's process: the task fails and a new task takes its slot.
    let pid = victim
        .processes
        .iter()
        .find_map(|p| p.pid)
        .unwrap_or_else(|| panic!("no pid in {victim:?}"));
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let old_id = victim.task_id.clone();
    let replaced = cluster
        .wait_for("instance 1 to be replaced and RUNNING", WAIT, |c| {
            let view = c.job(KEY).ok()?;
            let slot = view.instances.iter().find(|i| i.instance == 1)?.clone();
            let current = slot.current.as_ref()?;
            (current.task_id != old_id && current.state == TaskState::Running).then_some(slot)
        })
        .unwrap();
    let old = replaced
        .history
        .iter()
        .find(|t| t.task_id == old_id)
        .unwrap_or_else(|| panic!("history kept: {replaced:?}"));
    assert_eq!(old.state, TaskState::Failed, "{old:?}");
    assert_eq!(old.instance, 1);

    // Restart instance 0: its task goes RESTARTING and is killed while a new task
    // takes the slot.
    let old0 = cluster.job(KEY).unwrap().instances[0]
        .current
        .clone()
        .unwrap()
        .task_id;
    let output = cluster
        .drover(&["job", "restart", &format!("{KEY}/0")])
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("restarting www-data/test/web: 1 new task(s)"),
        "{}",
        describe(&output)
    );
    let slot = cluster
        .wait_for("instance 0 to restart", WAIT, |c| {
            let view = c.job(KEY).ok()?;
            let slot = view.instances.iter().find(|i| i.instance == 0)?.clone();
            let current = slot.current.as_ref()?;
            let old = slot.history.iter().find(|t| t.task_id == old0)?;
            (current.task_id != old0
                && current.state == TaskState::Running
                && old.state.is_terminal())
            .then_some(slot)
        })
        .unwrap();
    let old = slot.history.iter().find(|t| t.task_id == old0).unwrap();
    assert!(
        old.events.iter().any(|e| e.state == TaskState::Restarting),
        "went through RESTARTING: {old:?}"
    );
    assert_eq!(
        old.exit_reason,
        Some(ExitReason::Restarted),
        "a replaced task says it was restarted: {old:?}"
    );

    // Kill the job: every task goes KILLING then KILLED, the processes are gone.
    let pids: Vec<u32> = cluster
        .job(KEY)
        .unwrap()
        .instances
        .iter()
        .flat_map(|i| i.current.iter())
        .flat_map(|t| t.processes.iter().filter_map(|p| p.pid))
        .collect();
    let output = cluster.drover(&["job", "kill", KEY]).unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let view = cluster.wait_for_all(KEY, TaskState::Killed).unwrap();
    for instance in &view.instances {
        let task = instance.current.as_ref().unwrap();
        assert_eq!(
            task.exit_reason,
            Some(ExitReason::KilledByRequest),
            "{task:?}"
        );
        let states: Vec<TaskState> = task.events.iter().map(|e| e.state).collect();
        assert!(
            states.contains(&TaskState::Killing),
            "went through KILLING: {states:?}"
        );
    }
    // The escalation started with the graceful endpoint, which the service obeyed.
    for instance in &view.instances {
        let task = instance.current.as_ref().unwrap();
        let sandbox = cluster.sandbox_of(&task.task_id).unwrap();
        let posted =
            std::fs::read_to_string(sandbox.join("sandbox/lifecycle.log")).unwrap_or_default();
        assert_eq!(posted, "/quitquitquit\n", "task {}", task.task_id);
    }
    cluster
        .wait_for(
            "the killed processes to be gone",
            Duration::from_secs(30),
            |_| pids.iter().all(|pid| !process_alive(*pid)).then_some(()),
        )
        .unwrap();
}
