//! Black-box: a host lost (cut off past the agent timeout) while it drains, with
//! agents in their own network namespaces (`drover_tests::netns`). The lost host's
//! tasks follow their jobs' partition policy, never the drain (not even past its
//! deadline); the drain completes once they ended, while the host is still away or
//! when it is back; a host that comes back after its drain completed stays DRAINED
//! and its agent kills the copies it still ran. Needs root, `ip` and `nsenter`.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::time::{Duration, Instant};

use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{HostView, JobView, MaintenanceMode, TaskView};
use drover_tests::netns::{fault_job, key, netns_available, NetCluster, FAULT_MASTER_CONFIG};
use drover_tests::WAIT;
use serde_json::{json, Value};

/// A service process that runs until killed.
const FOREVER: &str = "exec sleep 100000";

/// Settle time for the invariant checker.
const SETTLE: Duration = Duration::from_secs(40);

/// A service of `n` instances with partition policy `partition` and SLA policy `sla`,
/// up to ten of them per host.
fn job(name: &str, n: u32, partition: Value, sla: Value) -> Value {
    let mut spec = fault_job(name, n, true, FOREVER, partition);
    spec["sla_policy"] = sla;
    // Several instances on one host (services spread one per host by default).
    spec["constraints"] = json!({"host": "limit:10"});
    spec
}

fn host(c: &NetCluster, id: &str) -> HostView {
    c.get(&format!("/v1/hosts/{id}")).unwrap()
}

fn drain(c: &NetCluster, id: &str, deadline_ms: Option<u64>) {
    let mut body = json!({"hosts": [id]});
    if let Some(ms) = deadline_ms {
        body["deadline_ms"] = json!(ms);
    }
    let (status, answer) = c.post("/v1/hosts/drain", &body).unwrap();
    assert_eq!(status, 200, "{answer}");
}

/// The current tasks of `view`, by instance.
fn currents(view: &JobView) -> Vec<TaskView> {
    view.instances
        .iter()
        .map(|i| i.current.clone().unwrap())
        .collect()
}

/// Creates `specs` while only agent 0 runs (so every task lands there), waits for
/// them RUNNING, then starts the other agents; the tasks by job key.
fn all_on_agent_0(c: &mut NetCluster, agents: usize, specs: &[Value]) -> Vec<Vec<TaskView>> {
    let a0 = c.agent_id(0).unwrap();
    let mut tasks = Vec::new();
    for spec in specs {
        c.create_job(spec).unwrap();
        let k = key(spec["name"].as_str().unwrap());
        let view = c
            .wait_for(&format!("{k} RUNNING on agent 0"), WAIT, |c| {
                let view = c.job(&k).ok()?;
                let all = view.instances.iter().all(|i| {
                    i.current
                        .as_ref()
                        .is_some_and(|t| t.state == TaskState::Running)
                });
                all.then_some(view)
            })
            .unwrap();
        let current = currents(&view);
        assert!(current
            .iter()
            .all(|t| t.agent_id.as_deref() == Some(a0.as_str())));
        tasks.push(current);
    }
    for k in 1..agents {
        c.start_agent(k).unwrap();
    }
    for k in 1..agents {
        c.wait_reachable(k).unwrap();
    }
    tasks
}

/// Waits until every instance of `job` runs a task other than `old` on a host other
/// than `lost`.
fn wait_replaced(c: &mut NetCluster, job: &str, old: &[TaskView], lost: &str) -> JobView {
    c.wait_for(&format!("{job} replaced away from {lost}"), WAIT, |c| {
        let view = c.job(job).ok()?;
        let moved = currents(&view).iter().zip(old).all(|(t, o)| {
            t.task_id != o.task_id
                && t.state == TaskState::Running
                && t.agent_id.as_deref() != Some(lost)
        });
        moved.then_some(view)
    })
    .unwrap()
}

/// Each task of `old` ended LOST (`agent_lost`): the partition policy, not the
/// drain, ended it; its instance was replaced once.
fn lost_by_the_partition_policy(c: &NetCluster, job: &str, old: &[TaskView]) {
    let view = c.job(job).unwrap();
    for (instance, o) in view.instances.iter().zip(old) {
        let t = c.task(&o.task_id).unwrap();
        assert_eq!(t.state, TaskState::Lost, "{t:#?}");
        assert_eq!(t.exit_reason, Some(ExitReason::AgentLost), "{t:#?}");
        assert!(
            !t.events.iter().any(|e| e.state == TaskState::Draining),
            "the drain took {}: {t:#?}",
            o.task_id
        );
        assert_eq!(instance.history.len(), 1, "replaced twice: {instance:#?}");
    }
}

#[test]
fn a_host_lost_while_draining_leaves_its_tasks_to_the_partition_policy_even_past_the_deadline() {
    if !netns_available("a_host_lost_while_draining_leaves_its_tasks") {
        return;
    }
    let mut c = NetCluster::start_some(4, 1, FAULT_MASTER_CONFIG).unwrap();
    // Neither policy lets the drain take anything before the deadline: svc counts
    // an instance only after 10 minutes RUNNING, keep is 1 of 1.
    let svc = key("lostsvc");
    let keep = key("lostkeep");
    let tasks = all_on_agent_0(
        &mut c,
        4,
        &[
            job(
                "lostsvc",
                3,
                json!({}),
                json!({"min_healthy": 2, "min_time": "10m"}),
            ),
            job(
                "lostkeep",
                1,
                json!({"reschedule": false}),
                json!({"min_healthy": 1}),
            ),
        ],
    );
    let (old_svc, old_keep) = (&tasks[0], &tasks[1][0]);
    let a0 = c.agent_id(0).unwrap();
    let drained_at = Instant::now();
    drain(&c, &a0, Some(12_000));
    c.wait_for("the drain to be blocked by both policies", WAIT, |c| {
        let h = host(c, &a0);
        (h.mode == MaintenanceMode::Draining && h.blocked.len() == 2).then_some(())
    })
    .unwrap();
    let keep_pids = c.task_pids(&old_keep.task_id);
    assert!(!keep_pids.is_empty());

    c.ns(0).cut().unwrap();
    // svc: LOST (agent_lost) and replaced on the other hosts by its partition policy.
    wait_replaced(&mut c, &svc, old_svc, &a0);
    lost_by_the_partition_policy(&c, &svc, old_svc);
    // keep (`reschedule: false`) stays, even once the drain's deadline has passed:
    // no second copy while the first may still run.
    while drained_at.elapsed() < Duration::from_secs(17) {
        let view = c.job(&keep).unwrap();
        let t = view.instances[0].current.clone().unwrap();
        assert_eq!(t.task_id, old_keep.task_id, "keep was replaced: {view:#?}");
        assert_eq!(t.state, TaskState::Running, "{t:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let h = host(&c, &a0);
    assert_eq!(h.mode, MaintenanceMode::Draining, "{h:#?}");
    assert!(!h.reachable, "{h:#?}");
    assert_eq!(h.tasks_left, 1, "{h:#?}");
    assert!(
        h.blocked.iter().any(|b| b.contains("host unreachable")),
        "{h:#?}"
    );
    assert_eq!(c.task_pids(&old_keep.task_id), keep_pids, "keep restarted");

    // Back: the deadline has passed, so keep is forced off now; svc's copies die.
    c.ns(0).heal().unwrap();
    c.wait_for("the host to be DRAINED", WAIT, |c| {
        (host(c, &a0).mode == MaintenanceMode::Drained).then_some(())
    })
    .unwrap();
    let ended = c.task(&old_keep.task_id).unwrap();
    assert_eq!(ended.state, TaskState::Killed, "{ended:#?}");
    assert_eq!(ended.exit_reason, Some(ExitReason::Drained), "{ended:#?}");
    assert!(
        ended
            .events
            .iter()
            .any(|e| e.message.contains("forced off")),
        "{ended:#?}"
    );
    wait_replaced(&mut c, &keep, std::slice::from_ref(old_keep), &a0);
    c.wait_for(
        "the lost copies of svc to be killed on agent 0",
        WAIT,
        |c| {
            old_svc
                .iter()
                .all(|t| c.task_pids(&t.task_id).is_empty())
                .then_some(())
        },
    )
    .unwrap();
    lost_by_the_partition_policy(&c, &svc, old_svc);
    assert_eq!(host(&c, &a0).tasks_left, 0);
    c.check_invariants(&[svc, keep], SETTLE).unwrap();
}

#[test]
fn a_host_lost_while_draining_is_drained_by_the_partition_policy_and_stays_drained_when_back() {
    if !netns_available("a_host_lost_while_draining_is_drained") {
        return;
    }
    let mut c = NetCluster::start_some(3, 1, FAULT_MASTER_CONFIG).unwrap();
    let svc = key("gonesvc");
    let patient = key("gonepatient");
    let tasks = all_on_agent_0(
        &mut c,
        3,
        &[
            job(
                "gonesvc",
                2,
                json!({}),
                json!({"min_healthy": 1, "min_time": "10m"}),
            ),
            job(
                "gonepatient",
                1,
                json!({"delay": "6s"}),
                json!({"min_healthy": 1}),
            ),
        ],
    );
    let (old_svc, old_patient) = (&tasks[0], &tasks[1]);
    let a0 = c.agent_id(0).unwrap();
    drain(&c, &a0, None);
    c.wait_for("the drain to be blocked by both policies", WAIT, |c| {
        let h = host(c, &a0);
        (h.mode == MaintenanceMode::Draining && h.blocked.len() == 2).then_some(())
    })
    .unwrap();

    let cut_at = Instant::now();
    c.ns(0).cut().unwrap();
    wait_replaced(&mut c, &svc, old_svc, &a0);
    lost_by_the_partition_policy(&c, &svc, old_svc);
    // patient waits out its delay (agent timeout 5 s + delay 6 s) before it is LOST.
    wait_replaced(&mut c, &patient, old_patient, &a0);
    let patient_after = cut_at.elapsed();
    println!(
        "MEASURE lost draining host: patient (delay 6s) replaced {:.2}s after the cut",
        patient_after.as_secs_f64()
    );
    // The agent timeout runs from the last heartbeat, which can precede the cut by
    // up to one heartbeat interval (300 ms here).
    assert!(
        patient_after >= Duration::from_millis(11_000 - 300),
        "replaced within its partition delay: {patient_after:?}"
    );
    lost_by_the_partition_policy(&c, &patient, old_patient);
    // Everything on the host ended by the partition policy: DRAINED while it is away.
    let h = c
        .wait_for("the lost host to be DRAINED", WAIT, |c| {
            let h = host(c, &a0);
            (h.mode == MaintenanceMode::Drained).then_some(h)
        })
        .unwrap();
    assert!(!h.reachable, "{h:#?}");
    assert_eq!(h.tasks_left, 0, "{h:#?}");
    let copies: Vec<&TaskView> = old_svc.iter().chain(old_patient).collect();
    assert!(
        copies.iter().all(|t| !c.task_pids(&t.task_id).is_empty()),
        "the cut-off agent should still run its copies"
    );

    // Back after the drain completed: its agent kills the copies; the host stays
    // DRAINED and takes nothing.
    c.ns(0).heal().unwrap();
    c.wait_reachable(0).unwrap();
    c.wait_for("the lost copies to be killed on agent 0", WAIT, |c| {
        copies
            .iter()
            .all(|t| c.task_pids(&t.task_id).is_empty())
            .then_some(())
    })
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let h = host(&c, &a0);
    assert_eq!(h.mode, MaintenanceMode::Drained, "{h:#?}");
    assert_eq!(h.tasks_left, 0, "{h:#?}");
    assert!(h.reachable, "{h:#?}");
    lost_by_the_partition_policy(&c, &svc, old_svc);
    lost_by_the_partition_policy(&c, &patient, old_patient);
    for job in [&svc, &patient] {
        for t in currents(&c.job(job).unwrap()) {
            assert_eq!(t.state, TaskState::Running, "{t:#?}");
            assert_ne!(t.agent_id.as_deref(), Some(a0.as_str()), "{t:#?}");
        }
    }
    c.check_invariants(&[svc, patient], SETTLE).unwrap();
}
