//! Service discovery: an instance is announced only while RUNNING on a reachable
//! agent, and every kill the master decides withdraws it first and reaches the
//! agent only `announce.drain_delay` later: each kill path (kill, restart, update
//! batch, drain, preemption, cron collision, health failure, agent loss) and a
//! property test over random event sequences (reports, kills, restarts, drains,
//! agent silences, rolling updates with count changes and operator actions).

use std::collections::HashSet;

use super::*;

const ANNOUNCE: &str = r#","announce":{"primary_port":"http","drain_delay":"2s"}"#;

fn announced_spec(name: &str, instances: u32) -> JobSpec {
    spec(name, instances, true, ANNOUNCE)
}

/// The desired state agent `agent`'s set gives task `id`, if the set holds it.
fn sent(w: &World, id: &str) -> Option<DesiredState> {
    let agent = w.core.task(id)?.agent.clone()?;
    w.core
        .assignment_set(&agent)?
        .assignments
        .into_iter()
        .find(|a| a.task.task_id == id)
        .map(|a| a.desired)
}

fn endpoints(w: &World, name: &str) -> Vec<String> {
    w.core
        .service_view("www", "prod", name)
        .map(|v| v.endpoints.into_iter().map(|e| e.task_id).collect())
        .unwrap_or_default()
}

fn running_world(instances: u32) -> (World, Vec<String>) {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.register("a2", 8.0, 16, &[]);
    let ids = w.create(announced_spec("web", instances));
    for id in &ids {
        w.run(id);
    }
    (w, ids)
}

#[test]
fn an_instance_is_announced_only_while_running() {
    let mut w = World::new();
    let mut req = agent_req("a1", 8.0, 16, &[]);
    req.ip = Some("10.0.0.7".to_string());
    w.handle(Event::Register(Box::new(req))).reply.unwrap();
    let ids = w.create(announced_spec("web", 1));
    assert!(endpoints(&w, "web").is_empty(), "ASSIGNED is not announced");
    w.report(&ids[0], TaskState::Starting, None);
    assert!(endpoints(&w, "web").is_empty(), "STARTING is not announced");
    w.report(&ids[0], TaskState::Running, None);
    let v = w.core.service_view("www", "prod", "web").unwrap();
    assert_eq!(v.job, "www/prod/web");
    assert_eq!(v.primary_port, "http");
    assert_eq!(v.endpoints.len(), 1);
    let e = &v.endpoints[0];
    assert_eq!((e.instance, e.ip.as_str()), (0, "10.0.0.7"));
    assert_eq!(e.host, "a1.example");
    assert_eq!(e.ports.keys().collect::<Vec<_>>(), vec!["http"]);
    assert_eq!(v.index, w.core.task(&ids[0]).unwrap().rev);
    assert_eq!(w.core.service_views(), vec![v]);
    // A job without announce is no service.
    w.create(spec("plain", 1, true, ""));
    assert!(w.core.service_view("www", "prod", "plain").is_none());
    assert_eq!(w.core.service_views().len(), 1);
}

#[test]
fn the_announced_name_and_an_ip_literal_address() {
    let mut w = World::new();
    let mut req = agent_req("a1", 8.0, 16, &[]);
    req.address = "http://192.0.2.4:5051".to_string();
    w.handle(Event::Register(Box::new(req))).reply.unwrap();
    let ids = w.create(spec(
        "web",
        1,
        true,
        r#","announce":{"primary_port":"http","name":"front"}"#,
    ));
    w.run(&ids[0]);
    assert!(w.core.service_view("www", "prod", "web").is_none());
    let v = w.core.service_view("www", "prod", "front").unwrap();
    assert_eq!(v.endpoints[0].ip, "192.0.2.4");
    assert_eq!(super::super::address_host("http://[::1]:80"), Some("::1"));
    assert_eq!(
        super::super::address_host("https://h.example"),
        Some("h.example")
    );
}

/// Withdrawn at once, the kill held for the drain delay (2s), then sent.
fn assert_withdrawn_then_killed(w: &mut World, id: &str) {
    assert!(!endpoints(w, "web").contains(&id.to_string()), "withdrawn");
    assert_ne!(w.state(id), TaskState::Running);
    assert_eq!(sent(w, id), Some(DesiredState::Running), "kill held");
    w.advance(1_900);
    assert_eq!(sent(w, id), Some(DesiredState::Running), "kill still held");
    w.advance(200);
    assert_eq!(sent(w, id), Some(DesiredState::Shutdown), "kill sent");
    assert!(w.core.task(id).unwrap().withdrawn_ms.is_none());
}

#[test]
fn a_kill_withdraws_first_and_waits_the_drain_delay() {
    let (mut w, ids) = running_world(2);
    assert_eq!(endpoints(&w, "web").len(), 2);
    let before = w.core.service_view("www", "prod", "web").unwrap().index;
    w.handle(Event::Kill {
        job: "www/prod/web".to_string(),
        instances: Some(vec![0]),
    })
    .reply
    .unwrap();
    // The withdrawal is committed in the kill's batch: the index moves.
    assert!(w.core.service_view("www", "prod", "web").unwrap().index > before);
    assert_eq!(endpoints(&w, "web"), vec![ids[1].clone()]);
    assert_withdrawn_then_killed(&mut w, &ids[0]);
}

#[test]
fn restart_update_drain_and_preemption_withdraw_first() {
    // Restart.
    let (mut w, ids) = running_world(1);
    w.handle(Event::Restart {
        job: "www/prod/web".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    assert_withdrawn_then_killed(&mut w, &ids[0]);

    // An update batch.
    let (mut w, ids) = running_world(1);
    let mut next = announced_spec("web", 1);
    next.task.processes[0].cmdline = "sleep 200".to_string();
    w.handle(Event::StartUpdate {
        job: "www/prod/web".to_string(),
        spec: Box::new(next),
        instances: None,
        user: "op".to_string(),
    })
    .reply
    .unwrap();
    assert_withdrawn_then_killed(&mut w, &ids[0]);

    // A drain of the host.
    let (mut w, ids) = running_world(1);
    let host = w.core.task(&ids[0]).unwrap().agent.clone().unwrap();
    w.handle(Event::Maintenance {
        op: MaintenanceOp::Drain { deadline_ms: None },
        hosts: vec![host],
    })
    .reply
    .unwrap();
    assert_eq!(w.state(&ids[0]), TaskState::Draining);
    assert_withdrawn_then_killed(&mut w, &ids[0]);

    // Preemption by a production job that needs the room.
    let mut w = World::new();
    w.register("a1", 2.0, 4, &[]);
    let ids = w.create(spec(
        "web",
        2,
        false,
        r#","tier":"preemptible","announce":{"primary_port":"http","drain_delay":"2s"}"#,
    ));
    for id in &ids {
        w.run(id);
    }
    w.create(spec("prod", 1, false, r#","tier":"preferred""#));
    let victim = ids
        .iter()
        .find(|id| w.state(id) == TaskState::Preempting)
        .cloned()
        .expect("a victim");
    assert_withdrawn_then_killed(&mut w, &victim);
}

#[test]
fn a_cron_collision_withdraws_the_running_run_before_its_kill() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    // Every 10 s (the seconds switch is on in these tests); a firing while the
    // previous run is active kills it (KILL_EXISTING).
    w.create(spec(
        "web",
        1,
        false,
        r#","cron_schedule":"*/10 * * * * *","cron_collision_policy":"KILL_EXISTING","announce":{"primary_port":"http","drain_delay":"2s"}"#,
    ));
    w.pass(10_000);
    let first = w.current("www/prod/web", 0);
    w.run(&first);
    assert_eq!(
        endpoints(&w, "web"),
        vec![first.clone()],
        "the run is announced"
    );
    let before = w.core.service_view("www", "prod", "web").unwrap().index;
    // Up to the next firing, in small steps, the agent heartbeating.
    let mut waited = 0;
    while w.current("www/prod/web", 0) == first {
        assert!(waited < 10_000, "no firing within 10 s");
        w.advance(100);
        w.heartbeat("a1", None);
        waited += 100;
    }
    assert_eq!(w.state(&first), TaskState::Killing, "KILL_EXISTING");
    // The withdrawal is committed with the firing: the service's index moves.
    assert!(w.core.service_view("www", "prod", "web").unwrap().index > before);
    // The new run is not announced before it is RUNNING.
    let second = w.current("www/prod/web", 0);
    assert_ne!(w.state(&second), TaskState::Running);
    assert!(endpoints(&w, "web").is_empty());
    assert_withdrawn_then_killed(&mut w, &first);
    w.run(&second);
    assert_eq!(endpoints(&w, "web"), vec![second]);
}

#[test]
fn an_unannounced_or_zero_delay_kill_goes_at_once() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let ids = w.create(spec(
        "web",
        1,
        true,
        r#","announce":{"primary_port":"http","drain_delay":"0s"}"#,
    ));
    w.run(&ids[0]);
    w.handle(Event::Kill {
        job: "www/prod/web".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Shutdown));
    // STARTING is not announced: nothing to wait for.
    let (mut w, _) = running_world(1);
    let ids = w.create(announced_spec("other", 1));
    w.report(&ids[0], TaskState::Starting, None);
    w.handle(Event::Kill {
        job: "www/prod/other".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Shutdown));
}

#[test]
fn an_unreachable_agent_withdraws_its_instances_in_a_committed_change() {
    let (mut w, ids) = running_world(2);
    let a = w.core.task(&ids[0]).unwrap().agent.clone().unwrap();
    let other = if a == "a1" { "a2" } else { "a1" };
    let before = w.core.service_view("www", "prod", "web").unwrap().index;
    w.persisted.clear();
    only_heartbeating(&mut w, &[other], 4_000);
    assert_eq!(endpoints(&w, "web"), vec![ids[1].clone()]);
    assert!(w.core.service_view("www", "prod", "web").unwrap().index > before);
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::PutTask(t) if t.id == ids[0])));
    // Back: announced again.
    w.heartbeat(&a, None);
    assert_eq!(endpoints(&w, "web").len(), 2);
}

#[test]
fn a_held_kill_survives_a_restart_of_the_master() {
    let (mut w, ids) = running_world(1);
    w.handle(Event::Kill {
        job: "www/prod/web".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    w.advance(1_000);
    let snapshot = w.snapshot();
    w.core = Core::load(cfg(), snapshot, w.at(), 8);
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Running));
    assert!(endpoints(&w, "web").is_empty());
    w.advance(1_100);
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Shutdown));
}

#[derive(Clone, Debug)]
enum Op {
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
    RollingRestart,
    Drain {
        agent: usize,
    },
    Activate {
        agent: usize,
    },
    Advance {
        ms: u64,
    },
    Silence {
        agent: usize,
    },
    /// A rolling update onto a new command line (`cmd`), with `instances`
    /// instances (count changes add or kill instances too), in batches of `batch`.
    Update {
        cmd: u8,
        instances: u32,
        batch: u32,
    },
    /// Pause, resume, abort or roll back the running update.
    SteerUpdate {
        action: u8,
    },
    /// Every reachable agent's executors act on its set: kills end, starts run.
    Settle,
}

/// The announced job with process `sleep 100+cmd`, rolled in batches of `batch`.
fn updated_spec(cmd: u8, instances: u32, batch: u32) -> JobSpec {
    let mut s = spec(
        "web",
        instances,
        true,
        &format!(r#"{ANNOUNCE},"update":{{"batch_size":{batch},"watch":"1s"}}"#),
    );
    s.task.processes[0].cmdline = format!("sleep {}", 100 + u32::from(cmd));
    s
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..4).prop_map(|(pick, state)| Op::Report { pick, state }),
        1 => any::<usize>().prop_map(|pick| Op::Kill { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Restart { pick }),
        1 => Just(Op::RollingRestart),
        1 => (0usize..3).prop_map(|agent| Op::Drain { agent }),
        1 => (0usize..3).prop_map(|agent| Op::Activate { agent }),
        3 => (100u64..3_000).prop_map(|ms| Op::Advance { ms }),
        1 => (0usize..3).prop_map(|agent| Op::Silence { agent }),
        2 => (0u8..3, 3u32..6, 1u32..3)
            .prop_map(|(cmd, instances, batch)| Op::Update { cmd, instances, batch }),
        1 => (0u8..4).prop_map(|action| Op::SteerUpdate { action }),
        2 => Just(Op::Settle),
    ]
}

const AGENTS: [&str; 3] = ["a1", "a2", "a3"];
const DELAY_MS: u64 = 2_000;

/// After every event: each endpoint is a RUNNING task on a reachable agent, and a
/// kill in a reachable agent's set reaches a task that was last seen announced
/// (its agent reachable since) at least the drain delay earlier.
struct Watch {
    /// Task -> when it was last seen announced.
    seen: HashMap<String, u64>,
    /// Tasks seen announced whose kill later reached their agent.
    killed_after_withdrawal: HashSet<String>,
}

impl Watch {
    fn check(&mut self, w: &World) {
        let mut now_announced = HashSet::new();
        for v in w.core.service_views() {
            for e in v.endpoints {
                let t = w.core.task(&e.task_id).unwrap();
                assert_eq!(t.status.state, TaskState::Running, "{} announced", t.id);
                assert!(t.withdrawn_ms.is_none());
                now_announced.insert(e.task_id.clone());
                self.seen.insert(e.task_id, w.now);
            }
        }
        for a in &w.core.agents {
            if !a.reachable {
                // Its tasks were withdrawn by the sweep; nothing reaches it now.
                for id in &a.tasks {
                    self.seen.remove(id);
                }
                continue;
            }
            let set = w.core.assignment_set(&a.rec.id).unwrap();
            for s in set.assignments {
                if s.desired != DesiredState::Shutdown {
                    continue;
                }
                let id = &s.task.task_id;
                assert!(!now_announced.contains(id), "kill sent to announced {id}");
                if let Some(at) = self.seen.get(id) {
                    self.killed_after_withdrawal.insert(id.clone());
                    assert!(
                        w.now - at >= DELAY_MS,
                        "kill of {id} sent {} ms after it was announced",
                        w.now - at
                    );
                }
            }
        }
    }
}

/// What a sequence reached: update batches started, and announced tasks the
/// master withdrew and then sent a kill (so a sequence cannot pass vacuously).
#[derive(Debug, Default)]
struct Reached {
    update_batches: usize,
    withdrawn_then_killed: usize,
}

/// Plays `ops` on a 4-instance announced job over three agents, checking the
/// invariants (`Watch`) after every event and every timer.
fn play_ops(ops: Vec<Op>) -> Reached {
    let mut reached = Reached::default();
    {
        let mut w = World::new();
        for a in AGENTS {
            w.register(a, 8.0, 16, &[]);
        }
        w.create(announced_spec("web", 4));
        let mut watch = Watch {
            seen: HashMap::new(),
            killed_after_withdrawal: HashSet::new(),
        };
        let mut silenced = [false; 3];
        watch.check(&w);
        for op in ops {
            let tasks: Vec<String> = {
                let mut v: Vec<String> = w.core.tasks.keys().cloned().collect();
                v.sort();
                v
            };
            match op {
                Op::Report { pick, state } => {
                    let id = &tasks[pick % tasks.len()];
                    let t = w.core.task(id).unwrap();
                    let on = t
                        .agent
                        .as_ref()
                        .and_then(|a| AGENTS.iter().position(|x| x == a));
                    if t.status.state.is_on_agent() && on.is_some_and(|i| !silenced[i]) {
                        let (s, r) = match state {
                            0 => (TaskState::Starting, None),
                            1 => (TaskState::Running, None),
                            2 => (TaskState::Failed, Some(ExitReason::ExitCode { code: 1 })),
                            _ => (TaskState::Killed, Some(ExitReason::KilledByRequest)),
                        };
                        let id = id.clone();
                        w.report(&id, s, r);
                    }
                }
                Op::Settle => {
                    // Every heard agent does what its set asks: a task sent a
                    // kill ends KILLED, a task sent to run reaches RUNNING.
                    for id in tasks {
                        let Some(t) = w.core.task(&id) else { continue };
                        let on = t
                            .agent
                            .as_ref()
                            .and_then(|a| AGENTS.iter().position(|x| x == a));
                        if !t.status.state.is_on_agent() || on.is_none_or(|i| silenced[i]) {
                            continue;
                        }
                        let state = t.status.state;
                        match sent(&w, &id) {
                            Some(DesiredState::Shutdown) => {
                                w.report(&id, TaskState::Killed, Some(ExitReason::KilledByRequest));
                            }
                            Some(_)
                                if matches!(state, TaskState::Assigned | TaskState::Starting) =>
                            {
                                w.report(&id, TaskState::Running, None);
                            }
                            _ => {}
                        }
                        watch.check(&w);
                    }
                }
                Op::Kill { pick } => {
                    w.handle(Event::Kill {
                        job: "www/prod/web".to_string(),
                        instances: Some(vec![(pick % 4) as u32]),
                    });
                }
                Op::Restart { pick } => {
                    w.handle(Event::Restart {
                        job: "www/prod/web".to_string(),
                        instances: Some(vec![(pick % 4) as u32]),
                    });
                }
                Op::RollingRestart => {
                    w.handle(Event::RollingRestart {
                        job: "www/prod/web".to_string(),
                        user: "alice".to_string(),
                    });
                }
                Op::Drain { agent } => {
                    w.handle(Event::Maintenance {
                        op: MaintenanceOp::Drain { deadline_ms: None },
                        hosts: vec![AGENTS[agent].to_string()],
                    });
                }
                Op::Activate { agent } => {
                    w.handle(Event::Maintenance {
                        op: MaintenanceOp::Activate,
                        hosts: vec![AGENTS[agent].to_string()],
                    });
                }
                Op::Advance { ms } => {
                    let end = w.now + ms;
                    while w.now < end {
                        let step = (end - w.now).min(250);
                        // Check at every timer the core fires, too.
                        while let Some(at) = w.core.next_wake().filter(|at| *at <= w.now + step) {
                            w.now = w.now.max(at);
                            w.handle(Event::Tick);
                            watch.check(&w);
                        }
                        w.now += step;
                        w.handle(Event::Tick);
                        for (i, a) in AGENTS.iter().enumerate() {
                            if !silenced[i] {
                                w.heartbeat(a, None);
                            }
                        }
                        watch.check(&w);
                    }
                }
                Op::Silence { agent } => silenced[agent] = !silenced[agent],
                Op::Update {
                    cmd,
                    instances,
                    batch,
                } => {
                    // Refused while another update runs: the event is still played.
                    let _ = w.handle(Event::StartUpdate {
                        job: "www/prod/web".to_string(),
                        spec: Box::new(updated_spec(cmd, instances, batch)),
                        instances: None,
                        user: "alice".to_string(),
                    });
                }
                Op::SteerUpdate { action } => {
                    let action = match action {
                        0 => UpdateAction::Pause,
                        1 => UpdateAction::Resume,
                        2 => UpdateAction::Abort,
                        _ => UpdateAction::Rollback,
                    };
                    w.handle(Event::UpdateAction {
                        job: "www/prod/web".to_string(),
                        action,
                    });
                }
            }
            watch.check(&w);
        }
        reached.update_batches = w.update_batches.len();
        reached.withdrawn_then_killed = watch.killed_after_withdrawal.len();
    }
    reached
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn withdrawal_precedes_every_kill(ops in proptest::collection::vec(op(), 1..60)) {
        play_ops(ops);
    }
}

#[test]
fn the_event_sequences_reach_update_batches_and_held_kills() {
    // A fixed sequence of the property test's events: an update rolls the
    // RUNNING instances batch by batch, each withdrawn before its kill.
    // Three instances, one per agent: the fourth of the created job, PENDING
    // (a host limit), is killed first.
    let mut ops = vec![Op::Kill { pick: 3 }, Op::Settle];
    ops.push(Op::Update {
        cmd: 1,
        instances: 3,
        batch: 2,
    });
    for _ in 0..8 {
        ops.push(Op::Advance { ms: 2_500 });
        ops.push(Op::Settle);
    }
    let reached = play_ops(ops);
    assert!(reached.update_batches >= 2, "{reached:?}");
    assert!(reached.withdrawn_then_killed >= 3, "{reached:?}");
}

#[test]
fn an_executor_stopping_an_unhealthy_announced_task_withdraws_it_at_once() {
    let (mut w, ids) = running_world(1);
    let agent = w.core.task(&ids[0]).unwrap().agent.clone().unwrap();
    // The master tells the executor the drain delay.
    let set = w.core.assignment_set(&agent).unwrap();
    assert_eq!(set.assignments[0].task.drain_delay_ms, Some(2_000));
    let seq = w.seqs.entry(ids[0].clone()).or_insert(0);
    *seq += 1;
    let u = StatusUpdate {
        task_id: ids[0].clone(),
        seq: *seq,
        state: TaskState::Running,
        exit_reason: Some(ExitReason::HealthCheckFailed {
            last_error: "503".into(),
        }),
        message: "health check failed: 503; withdrawn, stopping the task in 2000 ms".into(),
        timestamp_ms: w.at().wall,
        processes: Vec::new(),
        processes_omitted: None,
    };
    w.handle(Event::StatusReports {
        agent,
        reports: vec![u],
    })
    .reply
    .unwrap();
    assert!(endpoints(&w, "web").is_empty(), "withdrawn at once");
    assert_eq!(w.state(&ids[0]), TaskState::Running);
    // A kill 500 ms later waits the rest of the drain delay since the withdrawal.
    w.advance(500);
    w.handle(Event::Kill {
        job: "www/prod/web".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Running), "held");
    w.advance(1_400);
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Running), "held");
    w.advance(100);
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Shutdown));
    assert!(endpoints(&w, "web").is_empty());
    // It ends FAILED as the executor says and is replaced (a kill aside).
    w.report(
        &ids[0],
        TaskState::Failed,
        Some(ExitReason::HealthCheckFailed {
            last_error: "503".into(),
        }),
    );
    assert!(w.state(&ids[0]).is_terminal());
}

#[test]
fn an_executor_stopping_an_announced_task_over_its_disk_limit_withdraws_it_at_once() {
    let (mut w, ids) = running_world(1);
    let agent = w.core.task(&ids[0]).unwrap().agent.clone().unwrap();
    let before = w.core.service_view("www", "prod", "web").unwrap().index;
    let seq = w.seqs.entry(ids[0].clone()).or_insert(0);
    *seq += 1;
    let reason = ExitReason::DiskLimitExceeded {
        used_bytes: 2 << 20,
        limit_bytes: 1 << 20,
    };
    let u = StatusUpdate {
        task_id: ids[0].clone(),
        seq: *seq,
        state: TaskState::Running,
        exit_reason: Some(reason.clone()),
        message: "over; withdrawn, stopping the task in 2000 ms".into(),
        timestamp_ms: w.at().wall,
        processes: Vec::new(),
        processes_omitted: None,
    };
    w.handle(Event::StatusReports {
        agent,
        reports: vec![u],
    })
    .reply
    .unwrap();
    assert!(endpoints(&w, "web").is_empty(), "withdrawn at once");
    let after = w.core.service_view("www", "prod", "web").unwrap().index;
    assert!(
        after > before,
        "the withdrawal is a change: {before} -> {after}"
    );
    assert_eq!(w.state(&ids[0]), TaskState::Running);
    // Past the drain delay since the withdrawal, a kill goes at once.
    w.advance(2_000);
    w.handle(Event::Kill {
        job: "www/prod/web".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    assert_eq!(sent(&w, &ids[0]), Some(DesiredState::Shutdown));
    w.report(&ids[0], TaskState::Failed, Some(reason));
    assert!(w.state(&ids[0]).is_terminal());
}

#[test]
fn the_list_index_moves_when_a_spec_stops_announcing() {
    let (mut w, _) = running_world(1);
    let listed = |w: &World| {
        let views = w.core.service_views();
        let index = views.iter().map(|v| v.index).max().unwrap_or(0);
        (views.len(), index.max(w.core.services_gone_index()))
    };
    let (n, before) = listed(&w);
    assert_eq!(n, 1);
    // An update to a spec without `announce`: the service leaves the list in
    // this batch, while no task changed yet.
    w.handle(Event::StartUpdate {
        job: "www/prod/web".to_string(),
        spec: Box::new(spec("web", 1, true, "")),
        instances: None,
        user: "alice".to_string(),
    })
    .reply
    .unwrap();
    let (n, after) = listed(&w);
    assert_eq!(n, 0);
    assert!(
        after > before,
        "the list's index moves: {before} -> {after}"
    );
}
