//! Tests of the pure core: lifecycle, scheduling, faults and reconciliation, driven
//! by events and virtual time, plus a property test over random event sequences.

use std::collections::{BTreeMap, HashMap};

use drover_common::spec::JobSpec;
use drover_common::state::{DesiredState, ExitReason, TaskState};
use drover_common::wire::{
    self, AgentResources, AgentTaskReport, HeartbeatRequest, HeartbeatResponse, RegisterRequest,
    StatusUpdate,
};
use proptest::prelude::*;

use super::*;

const GIB: u64 = 1 << 30;

fn cfg() -> CoreConfig {
    CoreConfig {
        flapping_threshold_ms: 10_000,
        throttle_initial_ms: 1_000,
        throttle_max_ms: 4_000,
        transient_timeout_ms: 20_000,
        agent_timeout_ms: 3_000,
        heartbeat_interval_ms: 500,
        task_history_limit: 3,
        reconcile_interval_ms: 600_000,
        reconcile_backoff_initial_ms: 1_000,
        reconcile_backoff_max_ms: 8_000,
        restart_grace_ms: 6_000,
        exclusive_lease_ms: 2_000,
        missing_grace_ms: 1_000,
    }
}

fn agent_req(id: &str, cpu: f64, ram_gib: u64, attrs: &[(&str, &str)]) -> RegisterRequest {
    RegisterRequest {
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: id.to_string(),
        hostname: format!("{id}.example"),
        address: format!("http://{id}:1"),
        resources: AgentResources {
            cpu,
            ram_bytes: ram_gib * GIB,
            disk_bytes: 100 * GIB,
            port_range: (31000, 31009),
        },
        attributes: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn spec(name: &str, instances: u32, service: bool, extra: &str) -> JobSpec {
    let text = format!(
        r#"{{"role":"www","environment":"prod","name":"{name}","instances":{instances},
        "service":{service},
        "task":{{"processes":[{{"name":"main","cmdline":"sleep 100"}}],
                "resources":{{"cpu":1,"ram":"1GiB","disk":"1GiB","ports":["http"]}}}}
        {extra}}}"#
    );
    serde_json::from_str(&text).unwrap()
}

struct World {
    core: Core,
    now: u64,
    seqs: HashMap<String, u64>,
    persisted: Vec<Change>,
}

impl World {
    fn new() -> World {
        World {
            core: Core::new(cfg(), 1_000_000, 7),
            now: 1_000_000,
            seqs: HashMap::new(),
            persisted: Vec::new(),
        }
    }

    fn handle(&mut self, e: Event) -> Output {
        let out = self.core.handle(e, self.now);
        for e in &out.effects {
            if let Effect::Persist { changes, .. } = e {
                self.persisted.extend(changes.iter().cloned());
            }
        }
        out
    }

    fn register(&mut self, id: &str, cpu: f64, ram: u64, attrs: &[(&str, &str)]) {
        self.handle(Event::Register(Box::new(agent_req(id, cpu, ram, attrs))))
            .reply
            .unwrap();
    }

    fn create(&mut self, s: JobSpec) -> Vec<String> {
        match self.handle(Event::CreateJob(Box::new(s))).reply.unwrap() {
            Reply::JobCreated { tasks, .. } => tasks,
            r => panic!("{r:?}"),
        }
    }

    fn report(&mut self, task: &str, state: TaskState, reason: Option<ExitReason>) {
        let agent = self.core.task(task).unwrap().agent.clone().unwrap();
        let seq = self.seqs.entry(task.to_string()).or_insert(0);
        *seq += 1;
        let u = StatusUpdate {
            task_id: task.to_string(),
            seq: *seq,
            state,
            exit_reason: reason,
            message: String::new(),
            timestamp_ms: self.now,
            processes: Vec::new(),
        };
        self.handle(Event::Updates {
            agent,
            updates: vec![u],
        })
        .reply
        .unwrap();
    }

    fn advance(&mut self, ms: u64) {
        let end = self.now + ms;
        while let Some(at) = self.core.next_wake().filter(|at| *at <= end) {
            self.now = self.now.max(at);
            self.handle(Event::Tick);
        }
        self.now = end;
        self.handle(Event::Tick);
    }

    /// Lets time pass while every reachable agent heartbeats.
    fn pass(&mut self, ms: u64) {
        let mut left = ms;
        while left > 0 {
            let step = left.min(500);
            self.advance(step);
            left -= step;
            let ids: Vec<String> = self.core.agents.iter().map(|a| a.rec.id.clone()).collect();
            for id in ids {
                self.heartbeat(&id, None);
            }
        }
    }

    fn heartbeat(&mut self, agent: &str, tasks: Option<Vec<&str>>) -> HeartbeatResponse {
        let (version, _) = self.core.agent_version(agent).unwrap_or((0, 0));
        let held: Vec<String> = self
            .core
            .assignment_set(agent)
            .map(|s| s.assignments.into_iter().map(|a| a.task.task_id).collect())
            .unwrap_or_default();
        let request = HeartbeatRequest {
            task_digest: wire::task_set_digest(held.iter().map(String::as_str)),
            assignments_version: version,
            tasks: tasks.map(|t| {
                t.into_iter()
                    .map(|id| AgentTaskReport {
                        task_id: id.to_string(),
                        state: TaskState::Running,
                        seq: 1,
                    })
                    .collect()
            }),
        };
        match self
            .handle(Event::Heartbeat {
                agent: agent.to_string(),
                request,
            })
            .reply
            .unwrap()
        {
            Reply::Heartbeat(r) => r,
            r => panic!("{r:?}"),
        }
    }

    fn state(&self, task: &str) -> TaskState {
        self.core.task(task).unwrap().status.state
    }

    fn current(&self, job: &str, instance: u32) -> String {
        self.core.jobs[job].slots[instance as usize]
            .current
            .clone()
            .unwrap()
    }

    fn run(&mut self, task: &str) {
        self.report(task, TaskState::Starting, None);
        self.report(task, TaskState::Running, None);
    }
}

const JOB: &str = "www/prod/hello";

#[test]
fn a_new_job_is_assigned_and_stored_before_its_agent_is_woken() {
    let mut w = World::new();
    w.register("a1", 4.0, 8, &[]);
    let out = w.handle(Event::CreateJob(Box::new(spec("hello", 2, false, ""))));
    let Reply::JobCreated { tasks, .. } = out.reply.unwrap() else {
        panic!()
    };
    let persist_at = out
        .effects
        .iter()
        .position(|e| matches!(e, Effect::Persist { .. }))
        .unwrap();
    let notify_at = out
        .effects
        .iter()
        .position(|e| matches!(e, Effect::Notify { agent } if agent == "a1"))
        .unwrap();
    assert!(persist_at < notify_at);
    for t in &tasks {
        assert_eq!(w.state(t), TaskState::Assigned);
        assert!(t.len() <= 48, "{t}");
    }
    let set = w.core.assignment_set("a1").unwrap();
    assert_eq!(set.assignments.len(), 2);
    let ports: Vec<u16> = set
        .assignments
        .iter()
        .map(|a| a.task.ports["http"])
        .collect();
    assert_ne!(ports[0], ports[1], "each task gets its own port");
    let (version, seq) = w.core.agent_version("a1").unwrap();
    assert_eq!(set.version, version);
    assert_eq!(seq, w.core.seq());
}

#[test]
fn assignments_say_whether_the_task_was_started_so_a_lost_sandbox_never_reruns_it() {
    let mut w = World::new();
    w.register("a1", 4.0, 8, &[]);
    let tasks = w.create(spec("hello", 1, true, ""));
    let started = |w: &World| w.core.assignment_set("a1").unwrap().assignments[0].started;
    assert!(!started(&w), "a fresh assignment may be started");
    w.report(&tasks[0], TaskState::Starting, None);
    assert!(
        started(&w),
        "once reported, the agent must not start it again"
    );
}

#[test]
fn an_unplaceable_task_stays_pending_with_a_reason_in_words() {
    let mut w = World::new();
    w.register("a1", 4.0, 1, &[]);
    w.register("a2", 4.0, 1, &[]);
    let mut s = spec("big", 1, false, "");
    s.task.resources.ram = drover_common::units::ByteSize(2 * GIB);
    let t = w.create(s);
    assert_eq!(w.state(&t[0]), TaskState::Pending);
    let view = w.core.task_view(&t[0]).unwrap();
    assert_eq!(
        view.pending_reason.as_deref(),
        Some("insufficient ram on 2 agents")
    );
}

#[test]
fn services_spread_one_instance_per_host_unless_they_set_host() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.register("a2", 8.0, 16, &[]);
    let t = w.create(spec("svc", 3, true, ""));
    let agents: Vec<Option<String>> = t
        .iter()
        .map(|id| w.core.task(id).unwrap().agent.clone())
        .collect();
    assert!(agents[0].is_some() && agents[1].is_some() && agents[0] != agents[1]);
    assert_eq!(w.state(&t[2]), TaskState::Pending);
    assert_eq!(
        w.core.task_view(&t[2]).unwrap().pending_reason.as_deref(),
        Some("host limit reached on 2 agents")
    );
    let t = w.create(spec(
        "dense",
        3,
        true,
        r#","constraints":{"host":"limit:3"}"#,
    ));
    assert!(t.iter().all(|id| w.state(id) == TaskState::Assigned));
}

#[test]
fn dedicated_agents_only_take_jobs_that_name_them() {
    let mut w = World::new();
    w.register("d1", 8.0, 16, &[("dedicated", "www/db")]);
    let t = w.create(spec("plain", 1, false, ""));
    assert_eq!(w.state(&t[0]), TaskState::Pending);
    assert!(w
        .core
        .task_view(&t[0])
        .unwrap()
        .pending_reason
        .unwrap()
        .contains("dedicated to other jobs on 1 agent"));
    let t = w.create(spec(
        "db",
        1,
        false,
        r#","constraints":{"dedicated":"www/db"}"#,
    ));
    assert_eq!(w.state(&t[0]), TaskState::Assigned);
}

#[test]
fn value_constraints_and_rack_limits_hold() {
    let mut w = World::new();
    for (id, rack, zone) in [
        ("a1", "r1", "z1"),
        ("a2", "r1", "z1"),
        ("a3", "r2", "z1"),
        ("a4", "r3", "z2"),
    ] {
        w.register(id, 8.0, 16, &[("rack", rack), ("zone", zone)]);
    }
    let t = w.create(spec(
        "spread",
        4,
        false,
        r#","constraints":{"rack":"limit:1","zone":"z1"}"#,
    ));
    let placed: Vec<&str> = t
        .iter()
        .filter_map(|id| w.core.task(id).unwrap().agent.as_deref())
        .collect();
    assert_eq!(placed.len(), 2, "two z1 racks, one task each");
    assert!(!placed.contains(&"a4"));
    let reason = w.core.task_view(&t[3]).unwrap().pending_reason.unwrap();
    assert!(
        reason.contains("rack limit reached on 3 agents"),
        "{reason}"
    );
    assert!(
        reason.contains("zone constraint not met on 1 agent"),
        "{reason}"
    );
}

#[test]
fn a_service_task_that_ran_long_enough_is_replaced_at_once_with_history_kept() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("hello", 1, true, ""));
    w.run(&t[0]);
    assert_eq!(w.state(&t[0]), TaskState::Running);
    w.pass(20_000);
    w.heartbeat("a1", None);
    w.report(
        &t[0],
        TaskState::Failed,
        Some(ExitReason::ExitCode { code: 1 }),
    );
    assert_eq!(w.state(&t[0]), TaskState::Failed);
    let next = w.current(JOB, 0);
    assert_ne!(next, t[0]);
    assert_eq!(w.state(&next), TaskState::Assigned);
    let view = w.core.job_view(JOB).unwrap();
    assert_eq!(view.instances[0].history[0].task_id, t[0]);
    assert_eq!(
        view.instances[0].history[0].exit_reason,
        Some(ExitReason::ExitCode { code: 1 })
    );
}

#[test]
fn a_flapping_task_waits_throttled_with_a_doubling_penalty() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("flap", 1, true, ""));
    w.run(&t[0]);
    w.report(&t[0], TaskState::Failed, None);
    let second = w.current(JOB.replace("hello", "flap").as_str(), 0);
    let job = "www/prod/flap";
    assert_eq!(w.state(&second), TaskState::Throttled);
    let until = w.core.task(&second).unwrap().throttle_until.unwrap();
    assert_eq!(until - w.now, 1_000);
    w.advance(999);
    assert_eq!(w.state(&second), TaskState::Throttled);
    w.advance(1);
    assert_eq!(w.state(&second), TaskState::Assigned);
    w.run(&second);
    w.report(&second, TaskState::Failed, None);
    let third = w.current(job, 0);
    assert_eq!(
        w.core.task(&third).unwrap().throttle_until.unwrap() - w.now,
        2_000
    );
    let events: Vec<TaskState> = w
        .core
        .task(&second)
        .unwrap()
        .status
        .events
        .iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(
        events,
        [
            TaskState::Throttled,
            TaskState::Pending,
            TaskState::Assigned,
            TaskState::Starting,
            TaskState::Running,
            TaskState::Failed
        ]
    );
}

#[test]
fn batch_jobs_finish_once_and_retry_failures_up_to_the_limit() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("batch", 2, false, r#","max_task_failures":2"#));
    let job = "www/prod/batch";
    w.run(&t[0]);
    w.report(
        &t[0],
        TaskState::Finished,
        Some(ExitReason::ExitCode { code: 0 }),
    );
    assert_eq!(w.current(job, 0), t[0], "a finished batch instance is done");
    w.run(&t[1]);
    w.pass(20_000);
    w.report(&t[1], TaskState::Failed, None);
    let retry = w.current(job, 1);
    assert_ne!(retry, t[1]);
    w.run(&retry);
    w.pass(20_000);
    w.report(&retry, TaskState::Failed, None);
    assert_eq!(
        w.current(job, 1),
        retry,
        "two failures reach max_task_failures"
    );
}

#[test]
fn kill_moves_placed_tasks_through_killing_and_pending_ones_straight_to_killed() {
    let mut w = World::new();
    w.register("a1", 1.0, 16, &[]);
    let t = w.create(spec("k", 2, false, ""));
    assert_eq!(w.state(&t[1]), TaskState::Pending, "one cpu: one task fits");
    w.run(&t[0]);
    let out = w.handle(Event::Kill {
        job: "www/prod/k".to_string(),
        instances: None,
    });
    assert!(matches!(out.reply, Ok(Reply::Action(ref a)) if a.tasks.len() == 2));
    assert!(out
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Notify { agent } if agent == "a1")));
    assert_eq!(w.state(&t[0]), TaskState::Killing);
    assert_eq!(w.state(&t[1]), TaskState::Killed);
    let set = w.core.assignment_set("a1").unwrap();
    assert_eq!(set.assignments[0].desired, DesiredState::Shutdown);
    assert_eq!(
        set.assignments[0].kill_reason,
        Some(ExitReason::KilledByRequest)
    );
    w.report(&t[0], TaskState::Killing, None);
    assert_eq!(w.state(&t[0]), TaskState::Killing);
    w.report(
        &t[0],
        TaskState::Failed,
        Some(ExitReason::Signal { signal: 15 }),
    );
    assert_eq!(w.state(&t[0]), TaskState::Killed);
    assert_eq!(
        w.core.task(&t[0]).unwrap().status.exit_reason,
        Some(ExitReason::KilledByRequest)
    );
    assert_eq!(
        w.current("www/prod/k", 0),
        t[0],
        "killed tasks are not replaced"
    );
    assert!(w.core.assignment_set("a1").unwrap().assignments.is_empty());
}

#[test]
fn restart_kills_and_replaces_in_parallel() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.register("a2", 8.0, 16, &[]);
    let t = w.create(spec("r", 1, true, ""));
    w.run(&t[0]);
    let Reply::Action(a) = w
        .handle(Event::Restart {
            job: "www/prod/r".to_string(),
            instances: Some(vec![0]),
        })
        .reply
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(w.state(&t[0]), TaskState::Restarting);
    assert_eq!(a.tasks.len(), 1);
    assert_eq!(w.state(&a.tasks[0]), TaskState::Assigned);
    w.report(&t[0], TaskState::Killed, None);
    assert_eq!(w.state(&t[0]), TaskState::Killed);
    assert_eq!(
        w.current("www/prod/r", 0),
        a.tasks[0],
        "no second replacement"
    );
}

#[test]
fn a_task_stuck_in_assigned_becomes_lost_and_is_replaced() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("stuck", 1, false, ""));
    for _ in 0..10 {
        w.advance(2_000);
        w.heartbeat("a1", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    assert_eq!(
        w.core.task(&t[0]).unwrap().status.exit_reason,
        Some(ExitReason::TransientStateTimeout {
            state: TaskState::Assigned
        })
    );
    assert_ne!(w.current("www/prod/stuck", 0), t[0]);
}

#[test]
fn repeated_and_stale_updates_change_nothing() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("idem", 1, false, ""));
    w.run(&t[0]);
    let before = w.core.task(&t[0]).unwrap().clone();
    let stale = StatusUpdate {
        task_id: t[0].clone(),
        seq: 1,
        state: TaskState::Finished,
        exit_reason: None,
        message: String::new(),
        timestamp_ms: 0,
        processes: Vec::new(),
    };
    let out = w.handle(Event::Updates {
        agent: "a1".to_string(),
        updates: vec![stale.clone(), stale],
    });
    assert!(matches!(out.reply, Ok(Reply::Ack(ref a)) if a.acked == vec![(t[0].clone(), 1)]));
    assert_eq!(w.core.task(&t[0]).unwrap(), &before);
    // A backwards state with a new seq is ignored too.
    w.report(&t[0], TaskState::Starting, None);
    assert_eq!(w.state(&t[0]), TaskState::Running);
}

#[test]
fn a_silent_agent_s_tasks_are_lost_and_replaced_elsewhere_and_killed_when_it_returns() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("svc", 1, true, ""));
    w.run(&t[0]);
    w.register("a2", 8.0, 16, &[]);
    for _ in 0..8 {
        w.advance(500);
        w.heartbeat("a2", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    assert_eq!(
        w.core.task(&t[0]).unwrap().status.exit_reason,
        Some(ExitReason::AgentLost)
    );
    let next = w.current("www/prod/svc", 0);
    assert_eq!(w.core.task(&next).unwrap().agent.as_deref(), Some("a2"));
    // a1 comes back: it is asked for its tasks, and the old one is not in its set.
    let r = w.heartbeat("a1", None);
    assert!(r.send_full_task_set);
    w.heartbeat("a1", Some(vec![&t[0]]));
    assert!(w.core.assignment_set("a1").unwrap().assignments.is_empty());
}

#[test]
fn tasks_of_jobs_that_do_not_reschedule_wait_for_their_agent() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec(
        "stay",
        1,
        true,
        r#","partition_policy":{"reschedule":false}"#,
    ));
    w.run(&t[0]);
    w.advance(30_000);
    assert_eq!(w.state(&t[0]), TaskState::Running);
    w.heartbeat("a1", Some(vec![&t[0]]));
    assert_eq!(w.state(&t[0]), TaskState::Running);
}

#[test]
fn exclusive_wait_is_lease_plus_kill_time_after_the_last_heartbeat() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let mut s = spec("ex", 1, true, r#","partition_policy":{"exclusive":true}"#);
    s.task.finalization_wait = drover_common::units::Duration::from_secs(3);
    let t = w.create(s);
    w.run(&t[0]);
    let last = w.now;
    // lease 2s + finalization 3s + 5s slack = 10s after the last heartbeat.
    w.advance(9_900);
    assert_eq!(w.state(&t[0]), TaskState::Running);
    w.advance(200);
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    assert!(w.now >= last + 10_000);
}

#[test]
fn a_task_the_agent_lacks_is_lost_only_if_the_agent_saw_it_and_after_the_grace() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("rec", 1, true, ""));
    w.run(&t[0]);
    let r = w.handle(Event::Heartbeat {
        agent: "a1".to_string(),
        request: HeartbeatRequest {
            task_digest: wire::task_set_digest([]),
            assignments_version: 0,
            tasks: Some(Vec::new()),
        },
    });
    let _ = r;
    assert_eq!(
        w.state(&t[0]),
        TaskState::Running,
        "version 0 has not seen it"
    );
    let mismatch = w.heartbeat("a1", None);
    let _ = mismatch;
    let r = w.handle(Event::Heartbeat {
        agent: "a1".to_string(),
        request: HeartbeatRequest {
            task_digest: wire::task_set_digest([]),
            assignments_version: w.core.agent_version("a1").unwrap().0,
            tasks: None,
        },
    });
    assert!(matches!(r.reply, Ok(Reply::Heartbeat(ref h)) if h.send_full_task_set));
    w.heartbeat("a1", Some(vec![]));
    assert_eq!(w.state(&t[0]), TaskState::Running, "missing grace not over");
    w.advance(1_000);
    w.heartbeat("a1", Some(vec![]));
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    assert_eq!(
        w.core.task(&t[0]).unwrap().status.exit_reason,
        Some(ExitReason::ExecutorLost)
    );
}

#[test]
fn after_a_master_restart_nothing_is_replaced_before_the_grace() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("g", 1, true, ""));
    w.run(&t[0]);
    // Rebuild a snapshot from what was persisted.
    let mut snap = Snapshot::default();
    let mut tasks = BTreeMap::new();
    let mut agents = BTreeMap::new();
    for c in &w.persisted {
        match c {
            Change::PutJob(spec, key, created) => snap.jobs.push(JobRecord {
                key: key.clone(),
                spec: spec.as_ref().clone(),
                created_ms: *created,
            }),
            Change::PutTask(t) => {
                tasks.insert(t.id.clone(), t.as_ref().clone());
            }
            Change::PutAgent(a) => {
                agents.insert(a.id.clone(), a.as_ref().clone());
            }
            _ => {}
        }
    }
    snap.tasks = tasks.into_values().collect();
    snap.agents = agents.into_values().collect();
    let start = w.now + 60_000;
    w.core = Core::load(cfg(), snap, start, 9);
    w.now = start;
    assert_eq!(w.state(&t[0]), TaskState::Running);
    assert!(w.core.reconciling());
    w.advance(5_000);
    assert_eq!(w.state(&t[0]), TaskState::Running, "inside the grace");
    w.advance(1_500);
    assert_eq!(
        w.state(&t[0]),
        TaskState::Lost,
        "grace over, agent never came back"
    );
}

#[test]
fn an_agent_that_returns_during_the_grace_keeps_its_tasks() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("g", 1, true, ""));
    w.run(&t[0]);
    let snap = Snapshot {
        jobs: vec![JobRecord {
            key: "www/prod/g".to_string(),
            spec: w.core.jobs["www/prod/g"].spec.as_ref().clone(),
            created_ms: 0,
        }],
        tasks: vec![w.core.task(&t[0]).unwrap().clone()],
        agents: vec![w.core.agents[0].rec.clone()],
    };
    w.core = Core::load(cfg(), snap, w.now, 3);
    let r = w.heartbeat("a1", None);
    assert!(r.send_full_task_set, "reconcile after a master start");
    w.heartbeat("a1", Some(vec![&t[0]]));
    for _ in 0..40 {
        w.advance(500);
        w.heartbeat("a1", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Running);
    assert!(
        !w.core.reconciling(),
        "every task reported: reconciliation done"
    );
}

#[test]
fn terminal_history_is_pruned_beyond_the_limit_from_the_store_too() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("p", 1, true, ""));
    let mut first = t[0].clone();
    let mut all = vec![first.clone()];
    for _ in 0..6 {
        w.run(&first);
        w.pass(20_000);
        w.report(&first, TaskState::Failed, None);
        first = w.current("www/prod/p", 0);
        all.push(first.clone());
    }
    let view = w.core.job_view("www/prod/p").unwrap();
    assert_eq!(view.instances[0].history.len(), 3);
    assert!(w.core.task(&all[0]).is_none());
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::DeleteTask(id) if *id == all[0])));
}

#[test]
fn a_live_job_key_cannot_be_created_again_but_a_dead_one_is_replaced() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(spec("dup", 1, false, ""));
    let e = w.handle(Event::CreateJob(Box::new(spec("dup", 1, false, ""))));
    assert_eq!(
        e.reply,
        Err(CoreError::JobExists("www/prod/dup".to_string()))
    );
    w.handle(Event::Kill {
        job: "www/prod/dup".to_string(),
        instances: None,
    });
    let old = w.current("www/prod/dup", 0);
    w.report(&old, TaskState::Killed, None);
    let t = w.create(spec("dup", 1, false, ""));
    assert_eq!(w.state(&t[0]), TaskState::Assigned);
    assert!(w.core.task(&old).is_none());
}

#[test]
fn unknown_agents_are_told_to_register_and_other_protocols_are_refused() {
    let mut w = World::new();
    let r = w.heartbeat("ghost", None);
    assert!(r.reregister);
    let mut req = agent_req("a1", 1.0, 1, &[]);
    req.protocol_version = 99;
    let out = w.handle(Event::Register(Box::new(req)));
    assert!(matches!(
        out.reply,
        Err(CoreError::Protocol { got: 99, .. })
    ));
}

// ------------------------------------------------------------ property test

#[derive(Clone, Debug)]
enum Op {
    Create {
        instances: u32,
        service: bool,
        rack_limit: bool,
    },
    Report {
        pick: usize,
        state: u8,
    },
    Kill {
        pick: usize,
    },
    Restart {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    Silence {
        agent: usize,
    },
    Heartbeat {
        agent: usize,
        full: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..4, any::<bool>(), any::<bool>()).prop_map(|(instances, service, rack_limit)| {
            Op::Create {
                instances,
                service,
                rack_limit,
            }
        }),
        (any::<usize>(), 0u8..6).prop_map(|(pick, state)| Op::Report { pick, state }),
        any::<usize>().prop_map(|pick| Op::Kill { pick }),
        any::<usize>().prop_map(|pick| Op::Restart { pick }),
        (100u64..15_000).prop_map(|ms| Op::Advance { ms }),
        (0usize..4).prop_map(|agent| Op::Silence { agent }),
        (0usize..4, any::<bool>()).prop_map(|(agent, full)| Op::Heartbeat { agent, full }),
    ]
}

fn reachable(from: TaskState, to: TaskState) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        for s in seen[i].successors() {
            if !seen.contains(s) {
                seen.push(*s);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}

fn check_invariants(core: &Core, history: &mut HashMap<String, TaskState>, silenced: &[bool]) {
    // No agent over-committed, and its bookkeeping matches its tasks.
    for a in &core.agents {
        let mut cpu = 0;
        let mut ram = 0;
        let mut ports = std::collections::BTreeSet::new();
        for id in &a.tasks {
            let t = &core.tasks[id];
            assert!(t.status.state.is_on_agent());
            let need = core.jobs[&t.job].need;
            cpu += need.cpu_milli;
            ram += need.ram;
            for (_, p) in &t.ports {
                assert!(ports.insert(*p), "port {p} given twice on {}", a.rec.id);
            }
        }
        assert_eq!(cpu, a.used_cpu_milli);
        assert_eq!(ram, a.used_ram);
        assert!(cpu <= a.cpu_milli, "cpu over-committed on {}", a.rec.id);
        assert!(ram <= a.rec.resources.ram_bytes);
    }
    // Every placed task is in its agent's set; constraints hold.
    for t in core.tasks.values() {
        if t.status.state.is_on_agent() {
            let idx = core.agent_idx[t.agent.as_ref().unwrap()];
            assert!(core.agents[idx as usize].tasks.contains(&t.id));
        }
        // States only move forward along the table.
        if let Some(prev) = history.insert(t.id.clone(), t.status.state) {
            assert!(
                reachable(prev, t.status.state),
                "{} went {prev} -> {}",
                t.id,
                t.status.state
            );
        }
    }
    for job in core.jobs.values() {
        // Limits hold (rack limit:1 and the implicit host limit).
        for (attr, n) in &job.constraints.limits {
            let mut per: HashMap<String, u32> = HashMap::new();
            for slot in &job.slots {
                for id in slot.current.iter().chain(slot.history.iter()) {
                    let t = &core.tasks[id];
                    if t.status.state.is_on_agent() {
                        let a = &core.agents[core.agent_idx[t.agent.as_ref().unwrap()] as usize];
                        *per.entry(a.attr(attr).unwrap().to_string()).or_default() += 1;
                    }
                }
            }
            assert!(per.values().all(|c| c <= n), "{attr} limit broken: {per:?}");
        }
        // At most one non-terminal task that should run per instance, unless an
        // agent was silenced (partition).
        if silenced.iter().all(|s| !s) {
            for slot in &job.slots {
                let live = slot
                    .current
                    .iter()
                    .chain(slot.history.iter())
                    .filter(|id| {
                        let t = &core.tasks[*id];
                        !t.status.state.is_terminal() && t.desired == DesiredState::Running
                    })
                    .count();
                assert!(live <= 1, "two live tasks in one slot of {}", job.key);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn random_event_sequences_keep_every_invariant(ops in proptest::collection::vec(op(), 1..80)) {
        let mut w = World::new();
        for (i, rack) in ["r1", "r1", "r2", "r3"].iter().enumerate() {
            w.register(&format!("a{i}"), 3.0, 6, &[("rack", rack)]);
        }
        let mut jobs: Vec<String> = Vec::new();
        let mut history = HashMap::new();
        let mut silenced = [false; 4];
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Create { instances, service, rack_limit } => {
                    let extra = if rack_limit { r#","constraints":{"rack":"limit:1"}"# } else { "" };
                    let name = format!("j{n}");
                    let _ = w.handle(Event::CreateJob(Box::new(spec(&name, instances, service, extra))));
                    jobs.push(format!("www/prod/{name}"));
                }
                Op::Report { pick, state } => {
                    let placed: Vec<String> = {
                        let mut v: Vec<String> = w.core.tasks.values().filter(|t| t.status.state.is_on_agent()).map(|t| t.id.clone()).collect();
                        v.sort();
                        v
                    };
                    if !placed.is_empty() {
                        let id = placed[pick % placed.len()].clone();
                        let s = [TaskState::Starting, TaskState::Running, TaskState::Finished, TaskState::Failed, TaskState::Killed, TaskState::Lost][state as usize];
                        w.report(&id, s, None);
                    }
                }
                Op::Kill { pick } if !jobs.is_empty() => {
                    let job = jobs[pick % jobs.len()].clone();
                    let _ = w.handle(Event::Kill { job, instances: None });
                }
                Op::Restart { pick } if !jobs.is_empty() => {
                    let job = jobs[pick % jobs.len()].clone();
                    let _ = w.handle(Event::Restart { job, instances: None });
                }
                Op::Advance { ms } => {
                    // Live agents heartbeat while time passes.
                    let mut left = ms;
                    while left > 0 {
                        let step = left.min(500);
                        w.advance(step);
                        left -= step;
                        for (i, s) in silenced.iter().enumerate() {
                            if !s {
                                w.heartbeat(&format!("a{i}"), None);
                            }
                        }
                    }
                }
                Op::Silence { agent } => silenced[agent] = true,
                Op::Heartbeat { agent, full } => {
                    silenced[agent] = false;
                    let id = format!("a{agent}");
                    let held: Vec<String> = w.core.assignment_set(&id).unwrap().assignments.into_iter().map(|a| a.task.task_id).collect();
                    let tasks = full.then(|| held.iter().map(String::as_str).collect());
                    w.heartbeat(&id, tasks);
                }
                _ => {}
            }
            check_invariants(&w.core, &mut history, &silenced);
        }
    }
}

#[test]
fn an_executor_lost_loop_is_throttled_but_an_agent_loss_is_replaced_at_once() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("el", 1, true, ""));
    w.report(&t[0], TaskState::Lost, Some(ExitReason::ExecutorLost));
    let next = w.current("www/prod/el", 0);
    assert_eq!(w.state(&next), TaskState::Throttled);

    let t = w.create(spec("al", 1, true, ""));
    w.run(&t[0]);
    w.register("a2", 8.0, 16, &[]);
    for _ in 0..10 {
        w.advance(500);
        w.heartbeat("a2", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    let next = w.current("www/prod/al", 0);
    assert_eq!(
        w.state(&next),
        TaskState::Assigned,
        "no penalty for a lost agent"
    );
}

#[test]
fn blocked_tasks_are_placed_once_capacity_frees_up_or_an_agent_joins() {
    let mut w = World::new();
    w.register("a1", 1.0, 16, &[]);
    let t = w.create(spec("wait", 3, false, ""));
    assert_eq!(w.state(&t[1]), TaskState::Pending);
    assert_eq!(
        w.core.task_view(&t[2]).unwrap().pending_reason.as_deref(),
        Some("insufficient cpu on 1 agent")
    );
    w.run(&t[0]);
    w.report(&t[0], TaskState::Finished, None);
    assert_eq!(
        w.state(&t[1]),
        TaskState::Assigned,
        "freed cpu goes to the oldest"
    );
    assert_eq!(w.state(&t[2]), TaskState::Pending);
    w.register("a2", 1.0, 16, &[]);
    assert_eq!(w.state(&t[2]), TaskState::Assigned);
    assert_eq!(w.core.task_view(&t[2]).unwrap().pending_reason, None);
}

#[test]
fn killed_blocked_tasks_do_not_hold_back_a_recreated_job() {
    let mut w = World::new();
    w.register("a1", 1.0, 16, &[]);
    let big = w.create(spec(
        "first",
        1,
        false,
        r#","constraints":{"zone":"nowhere"}"#,
    ));
    assert_eq!(w.state(&big[0]), TaskState::Pending);
    w.handle(Event::Kill {
        job: "www/prod/first".to_string(),
        instances: None,
    });
    assert_eq!(w.state(&big[0]), TaskState::Killed);
    let t = w.create(spec("first", 1, false, ""));
    assert_eq!(w.state(&t[0]), TaskState::Assigned);
}

#[test]
fn a_task_its_agent_reported_ending_leaves_the_set_without_waking_the_agent() {
    let mut w = World::new();
    w.register("a1", 4.0, 8, &[]);
    let t = w.create(spec("once", 2, false, ""));
    w.run(&t[0]);
    w.run(&t[1]);
    // The first heartbeat after registering carries the full set.
    w.heartbeat("a1", Some(vec![t[0].as_str(), t[1].as_str()]));
    let (before, _) = w.core.agent_version("a1").unwrap();
    let notified = w.core.agent_notified_version("a1").unwrap();
    assert_eq!(before, notified);
    let agent = "a1".to_string();
    let out = w.handle(Event::Updates {
        agent: agent.clone(),
        updates: vec![StatusUpdate {
            task_id: t[0].clone(),
            seq: 3,
            state: TaskState::Finished,
            exit_reason: None,
            message: String::new(),
            timestamp_ms: w.now,
            processes: Vec::new(),
        }],
    });
    assert!(!out
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Notify { .. })));
    let (after, seq) = w.core.agent_version("a1").unwrap();
    assert!(after > before, "the set changed, so its version did");
    assert_eq!(seq, w.core.seq(), "served only once committed");
    assert_eq!(w.core.agent_notified_version("a1"), Some(notified));
    assert_eq!(w.core.assignment_set("a1").unwrap().assignments.len(), 1);
    // An agent still at the notified version is checked against its digest: one
    // that agrees (it dropped the ended task too) is not asked for its full set.
    let request = HeartbeatRequest {
        task_digest: wire::task_set_digest([t[1].as_str()]),
        assignments_version: notified,
        tasks: None,
    };
    let Reply::Heartbeat(r) = w
        .handle(Event::Heartbeat {
            agent: agent.clone(),
            request,
        })
        .reply
        .unwrap()
    else {
        panic!()
    };
    assert!(!r.send_full_task_set);
    let request = HeartbeatRequest {
        task_digest: wire::task_set_digest(["someone-else"]),
        assignments_version: notified,
        tasks: None,
    };
    let Reply::Heartbeat(r) = w.handle(Event::Heartbeat { agent, request }).reply.unwrap() else {
        panic!()
    };
    assert!(r.send_full_task_set, "a real mismatch is still found");
    // A kill the master decides wakes the agent as before.
    let out = w.handle(Event::Kill {
        job: "www/prod/once".to_string(),
        instances: None,
    });
    assert!(out
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Notify { agent } if agent == "a1")));
}
