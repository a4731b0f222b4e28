//! Placement: fit, constraints, dedicated hosts, blocked jobs.

use super::*;

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

/// One step of the limit-count property test.
#[derive(Clone, Debug)]
enum LimitOp {
    Create {
        instances: u32,
        rack: bool,
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
    /// The agent registers again with another rack (its attributes change).
    Rerack {
        agent: usize,
        rack: u8,
    },
    Drain {
        agent: usize,
    },
    Activate {
        agent: usize,
    },
    Pass {
        ms: u64,
    },
}

fn limit_op() -> impl Strategy<Value = LimitOp> {
    prop_oneof![
        (1u32..5, any::<bool>()).prop_map(|(instances, rack)| LimitOp::Create { instances, rack }),
        (any::<usize>(), 0u8..5).prop_map(|(pick, state)| LimitOp::Report { pick, state }),
        any::<usize>().prop_map(|pick| LimitOp::Kill { pick }),
        any::<usize>().prop_map(|pick| LimitOp::Restart { pick }),
        (0usize..5, 0u8..3).prop_map(|(agent, rack)| LimitOp::Rerack { agent, rack }),
        (0usize..5).prop_map(|agent| LimitOp::Drain { agent }),
        (0usize..5).prop_map(|agent| LimitOp::Activate { agent }),
        (100u64..8_000).prop_map(|ms| LimitOp::Pass { ms }),
    ]
}

/// Where every task is, by id.
fn placements(w: &World) -> BTreeMap<String, (TaskState, Option<String>)> {
    w.core
        .tasks
        .values()
        .map(|t| (t.id.clone(), (t.status.state, t.agent.clone())))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The `limit:N` counts the scheduler keeps between passes equal a fresh count
    /// after every event (checked in `World::handle`), and a world that counts
    /// afresh before every event places every task on the same agent.
    #[test]
    fn kept_limit_counts_place_as_a_fresh_count_would(
        ops in proptest::collection::vec(limit_op(), 1..60),
    ) {
        let mut kept = World::new();
        let mut fresh = World::new();
        fresh.fresh_limit_counts = true;
        let racks = ["r0", "r1", "r2"];
        for w in [&mut kept, &mut fresh] {
            for i in 0..5 {
                w.register(&format!("a{i}"), 4.0, 8, &[("rack", racks[i % 3])]);
            }
        }
        let mut jobs: Vec<String> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            for w in [&mut kept, &mut fresh] {
                match &op {
                    LimitOp::Create { instances, rack } => {
                        let extra = if *rack { r#","constraints":{"rack":"limit:2"}"# } else { "" };
                        let name = format!("j{n}");
                        let _ = w.handle(Event::CreateJob(Box::new(spec(&name, *instances, true, extra))));
                    }
                    LimitOp::Report { pick, state } => {
                        let mut placed: Vec<String> = w.core.tasks.values()
                            .filter(|t| t.status.state.is_on_agent())
                            .map(|t| t.id.clone())
                            .collect();
                        placed.sort();
                        if !placed.is_empty() {
                            let id = placed[pick % placed.len()].clone();
                            let s = [TaskState::Starting, TaskState::Running, TaskState::Failed,
                                     TaskState::Killed, TaskState::Lost][*state as usize];
                            w.report(&id, s, None);
                        }
                    }
                    LimitOp::Kill { pick } if !jobs.is_empty() => {
                        let job = jobs[pick % jobs.len()].clone();
                        let _ = w.handle(Event::Kill { job, instances: Some(vec![0]) });
                    }
                    LimitOp::Restart { pick } if !jobs.is_empty() => {
                        let job = jobs[pick % jobs.len()].clone();
                        let _ = w.handle(Event::Restart { job, instances: None });
                    }
                    LimitOp::Rerack { agent, rack } => {
                        w.register(&format!("a{agent}"), 4.0, 8, &[("rack", racks[*rack as usize])]);
                    }
                    LimitOp::Drain { agent } => {
                        let _ = w.handle(Event::Maintenance {
                            op: MaintenanceOp::Drain { deadline_ms: Some(5_000) },
                            hosts: vec![format!("a{agent}")],
                        });
                    }
                    LimitOp::Activate { agent } => {
                        let _ = w.handle(Event::Maintenance {
                            op: MaintenanceOp::Activate,
                            hosts: vec![format!("a{agent}")],
                        });
                    }
                    LimitOp::Pass { ms } => w.pass(*ms),
                    _ => {}
                }
            }
            if let LimitOp::Create { .. } = op {
                jobs.push(format!("www/prod/j{n}"));
            }
            prop_assert_eq!(placements(&kept), placements(&fresh), "after {:?}", op);
        }
    }
}

/// Instances per value of `attr` over the tasks' agents (unplaced: "-").
fn per_value(w: &World, tasks: &[String], attr: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for id in tasks {
        let v = match &w.core.task(id).unwrap().agent {
            Some(a) => {
                let idx = w.core.agent_idx[a];
                w.core.agents[idx as usize]
                    .attr(attr)
                    .unwrap_or("-")
                    .to_string()
            }
            None => "-".to_string(),
        };
        *out.entry(v).or_default() += 1;
    }
    out
}

#[test]
fn spread_evens_instances_over_racks_of_uneven_size() {
    let mut w = World::new();
    let racks = [("r1", 6), ("r2", 2), ("r3", 1)];
    for (rack, n) in racks {
        for i in 0..n {
            w.register(&format!("{rack}-{i}"), 8.0, 16, &[("rack", rack)]);
        }
    }
    let t = w.create(spec(
        "even",
        9,
        false,
        r#","spread":[{"attribute":"rack","weight":50}]"#,
    ));
    let got = per_value(&w, &t, "rack");
    assert_eq!(
        got,
        BTreeMap::from([("r1".into(), 3), ("r2".into(), 3), ("r3".into(), 3)])
    );
    // Without spread the rotating cursor follows the hosts: rack r1 takes most.
    let t = w.create(spec("plain", 9, false, ""));
    assert_ne!(per_value(&w, &t, "rack").get("r1"), Some(&3));
}

#[test]
fn spread_never_refuses_when_one_rack_has_room() {
    let mut w = World::new();
    w.register("big", 16.0, 32, &[("rack", "r1")]);
    w.register("tiny", 0.5, 16, &[("rack", "r2")]);
    w.register("bare", 0.5, 16, &[]);
    let t = w.create(spec(
        "one",
        5,
        false,
        r#","spread":[{"attribute":"rack","weight":100}]"#,
    ));
    assert_eq!(
        per_value(&w, &t, "rack"),
        BTreeMap::from([("r1".into(), 5)])
    );
}

#[test]
fn affinity_prefers_matching_hosts_and_negative_weight_avoids() {
    let mut w = World::new();
    w.register("a", 8.0, 16, &[("disk", "hdd")]);
    w.register("b", 8.0, 16, &[("disk", "ssd")]);
    w.register("c", 8.0, 16, &[("disk", "hdd")]);
    let t = w.create(spec(
        "fast",
        4,
        false,
        r#","affinity":[{"attribute":"disk","value":"ssd","weight":80}]"#,
    ));
    assert_eq!(
        per_value(&w, &t, "disk"),
        BTreeMap::from([("ssd".into(), 4)])
    );
    let t = w.create(spec(
        "avoid",
        4,
        false,
        r#","affinity":[{"attribute":"disk","value":"ssd","weight":-80}]"#,
    ));
    assert_eq!(
        per_value(&w, &t, "disk"),
        BTreeMap::from([("hdd".into(), 4)])
    );
}

#[test]
fn binpack_fills_one_host_before_the_next_and_spread_does_the_opposite() {
    let mut w = World::new();
    w.register("h1", 4.0, 16, &[]);
    w.register("h2", 4.0, 16, &[]);
    let t = w.create(spec("pack", 4, false, r#","placement":"binpack""#));
    assert_eq!(
        per_value(&w, &t, "host").len(),
        1,
        "{:?}",
        per_value(&w, &t, "host")
    );
    let mut w = World::new();
    w.register("h1", 4.0, 16, &[]);
    w.register("h2", 4.0, 16, &[]);
    w.register("h3", 4.0, 16, &[]);
    let first = w.create(spec("first", 2, false, r#","placement":"spread""#));
    let t = w.create(spec("wide", 3, false, r#","placement":"spread""#));
    let hosts: Vec<Option<String>> = first
        .iter()
        .chain(&t)
        .map(|id| w.core.task(id).unwrap().agent.clone())
        .collect();
    let mut per: BTreeMap<String, u32> = BTreeMap::new();
    for h in hosts.into_iter().flatten() {
        *per.entry(h).or_default() += 1;
    }
    // 5 tasks on 3 hosts, least used first: 2/2/1.
    let mut counts: Vec<u32> = per.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![1, 2, 2]);
}
