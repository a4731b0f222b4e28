//! A property test: random event sequences keep every invariant of the core.

use super::*;

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
    // Soft placement's order of agents by use is current.
    assert!(core.usage_is_current(), "usage index stale");
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
