//! Preemption: the pure victim search, the standing rules, and the whole flow
//! through the core (PREEMPTING, KILLED with the preemptor named, replacements
//! PENDING, the reservation and its timeout).

use super::*;

fn need(cpu_milli: u64, ram: u64) -> Need {
    Need {
        cpu_milli,
        ram,
        disk: 0,
        ports: 0,
    }
}

fn cand(cpu_milli: u64, ram: u64, priority: u32) -> Candidate {
    Candidate {
        need: need(cpu_milli, ram),
        priority,
    }
}

fn free(cpu_milli: i64, ram: i64) -> Free {
    Free {
        cpu_milli,
        ram,
        disk: 0,
        ports: 0,
    }
}

fn covers(f: Free, n: &Need, cands: &[Candidate], chosen: &[usize]) -> bool {
    let mut f = f;
    for &i in chosen {
        f.cpu_milli += cands[i].need.cpu_milli as i64;
        f.ram += cands[i].need.ram as i64;
        f.disk += cands[i].need.disk as i64;
        f.ports += i64::from(cands[i].need.ports);
    }
    f.cpu_milli >= n.cpu_milli as i64
        && f.ram >= n.ram as i64
        && f.disk >= n.disk as i64
        && f.ports >= i64::from(n.ports)
}

#[test]
fn one_victim_that_frees_enough_is_preferred_and_the_lowest_priority_goes_first() {
    // Two small low-priority tasks or one big one of priority 1: the big one alone.
    let cands = [cand(500, 0, 0), cand(500, 0, 0), cand(1000, 0, 1)];
    assert_eq!(
        victims_on_host(free(0, 0), &need(1000, 0), &cands),
        Some(vec![2])
    );
    // Both priorities can do it alone: the lower goes.
    let cands = [cand(1000, 0, 3), cand(1000, 0, 1)];
    assert_eq!(
        victims_on_host(free(0, 0), &need(1000, 0), &cands),
        Some(vec![1])
    );
}

#[test]
fn several_victims_are_pruned_to_those_needed() {
    // Greedy by priority takes 0 (cpu) then 1 (ram) then 2 (both); 0 and 1 are
    // then not needed: 2 alone would do, but it is not enough alone for ram.
    let cands = [cand(1000, 0, 0), cand(0, 100, 1), cand(1000, 50, 2)];
    let got = victims_on_host(free(0, 50), &need(1000, 100), &cands).unwrap();
    assert!(covers(free(0, 50), &need(1000, 100), &cands, &got));
    assert_eq!(got.len(), 1, "{got:?}");
    // Nothing fits even with every candidate gone.
    assert_eq!(
        victims_on_host(free(0, 0), &need(5000, 0), &[cand(1000, 0, 0)]),
        None
    );
    // Fits already: no victim.
    assert_eq!(
        victims_on_host(free(2000, 0), &need(1000, 0), &[cand(1000, 0, 0)]),
        Some(vec![])
    );
}

#[test]
fn production_is_never_a_victim_and_standing_strictly_drops() {
    let prod = |priority| Standing {
        production: true,
        priority,
    };
    let batch = |priority| Standing {
        production: false,
        priority,
    };
    assert!(may_preempt(prod(0), "a", batch(9), "b"));
    assert!(!may_preempt(prod(9), "a", prod(0), "a"));
    assert!(!may_preempt(batch(9), "a", prod(0), "a"));
    assert!(may_preempt(batch(2), "a", batch(1), "a"));
    assert!(!may_preempt(batch(2), "a", batch(1), "b"), "another role");
    assert!(!may_preempt(batch(1), "a", batch(1), "a"), "equal standing");
}

proptest! {
    /// The set found covers the need, and none of its victims could be spared:
    /// preemption never frees more than the preemptor needs plus one task.
    #[test]
    fn the_victims_cover_the_need_and_none_is_spare(
        f in (-2000i64..2000, -2000i64..2000),
        n in (0u64..4000, 0u64..4000),
        cs in proptest::collection::vec((0u64..2000, 0u64..2000, 0u32..4), 0..10),
    ) {
        let f = free(f.0, f.1);
        let n = need(n.0, n.1);
        let cands: Vec<Candidate> = cs.iter().map(|&(c, r, p)| cand(c, r, p)).collect();
        let all: Vec<usize> = (0..cands.len()).collect();
        match victims_on_host(f, &n, &cands) {
            None => prop_assert!(!covers(f, &n, &cands, &all)),
            Some(got) => {
                prop_assert!(covers(f, &n, &cands, &got));
                for k in 0..got.len() {
                    let mut less = got.clone();
                    less.remove(k);
                    prop_assert!(!covers(f, &n, &cands, &less), "victim {} is spare in {:?}", got[k], got);
                }
            }
        }
    }

    /// Random clusters full of tasks of random tiers and priorities, then random
    /// arrivals: no production task is ever PREEMPTING, and every victim stands
    /// strictly below the task it was preempted for.
    #[test]
    fn a_production_task_is_never_a_victim(
        jobs in proptest::collection::vec((any::<bool>(), 0u32..3, 1u32..4), 1..8),
        arrivals in proptest::collection::vec((any::<bool>(), 0u32..3), 1..6),
    ) {
        let mut w = World::new();
        for i in 0..3 {
            w.register(&format!("a{i}"), 4.0, 64, &[]);
        }
        for (i, (prod, prio, n)) in jobs.iter().enumerate() {
            let tier = if *prod { "preferred" } else { "preemptible" };
            let t = w.create(spec(&format!("f{i}"), *n, false, &format!(r#","tier":"{tier}","priority":{prio}"#)));
            for id in t {
                if w.state(&id) == TaskState::Assigned {
                    w.run(&id);
                }
            }
        }
        for (i, (prod, prio)) in arrivals.iter().enumerate() {
            let tier = if *prod { "preferred" } else { "preemptible" };
            w.create(spec(&format!("n{i}"), 1, false, &format!(r#","tier":"{tier}","priority":{prio}"#)));
        }
        for t in w.core.tasks.values() {
            if t.status.state != TaskState::Preempting {
                continue;
            }
            let victim = w.core.jobs[&t.job].spec.clone();
            prop_assert!(!victim.is_production(), "{} is production", t.id);
            let Some(ExitReason::Preempted { by }) = &t.kill_reason else {
                return Err(TestCaseError::fail(format!("{} has no preemptor", t.id)));
            };
            let p = w.core.jobs[&w.core.tasks[by].job].spec.clone();
            let ps = Standing { production: p.is_production(), priority: p.priority };
            let vs = Standing { production: false, priority: victim.priority };
            prop_assert!(ps > vs);
            prop_assert!(may_preempt(ps, &p.role, vs, &victim.role));
        }
    }
}

/// One agent of 2 cpus full of two preemptible tasks; a production task of 1 cpu.
fn full_world() -> (World, Vec<String>) {
    let mut w = World::new();
    w.register("a1", 2.0, 16, &[]);
    let batch = w.create(spec("batch", 2, false, r#","tier":"preemptible""#));
    for t in &batch {
        w.run(t);
    }
    (w, batch)
}

#[test]
fn a_production_task_preempts_one_batch_task_and_takes_its_place() {
    let (mut w, batch) = full_world();
    let prod = w.create(spec("prod", 1, true, ""));
    let p = &prod[0];
    assert_eq!(w.state(p), TaskState::Pending);
    let victims: Vec<&String> = batch
        .iter()
        .filter(|t| w.state(t) == TaskState::Preempting)
        .collect();
    assert_eq!(victims.len(), 1, "one victim is enough");
    let v = victims[0].clone();
    let vt = w.core.task(&v).unwrap();
    assert_eq!(vt.desired, DesiredState::Shutdown);
    assert_eq!(
        vt.kill_reason,
        Some(ExitReason::Preempted { by: p.clone() })
    );
    // The agent is told to kill it.
    let set = w.core.assignment_set("a1").unwrap();
    let a = set
        .assignments
        .iter()
        .find(|a| a.task.task_id == v)
        .unwrap();
    assert_eq!(a.desired, DesiredState::Shutdown);
    // Its replacement waits PENDING, saying who preempted it.
    let inst = w.core.task(&v).unwrap().instance;
    let repl = w.current("www/prod/batch", inst);
    assert_ne!(repl, v);
    assert_eq!(w.state(&repl), TaskState::Pending);
    let view = w.core.task_view(&repl).unwrap();
    assert_eq!(view.preempted_by.as_deref(), Some(p.as_str()));
    assert!(
        view.pending_reason
            .as_deref()
            .unwrap_or("")
            .contains(&format!("preempted by {p}")),
        "{view:?}"
    );
    // Nothing else takes the freed room: another preemptible job waits.
    let other = w.create(spec("other", 1, false, r#","tier":"preemptible""#));
    // The victim ends: KILLED, its reason naming the preemptor; the preemptor is
    // placed on the freed room.
    w.report(&v, TaskState::Killed, None);
    assert_eq!(w.state(&v), TaskState::Killed);
    let vt = w.core.task(&v).unwrap();
    assert_eq!(
        vt.status.exit_reason,
        Some(ExitReason::Preempted { by: p.clone() })
    );
    assert_eq!(w.state(p), TaskState::Assigned);
    assert_eq!(w.core.task(p).unwrap().agent.as_deref(), Some("a1"));
    assert_eq!(w.state(&other[0]), TaskState::Pending);
    assert_eq!(w.state(&repl), TaskState::Pending);
    assert_eq!(w.core.agents[0].reserved, Need::default());
}

#[test]
fn production_never_preempts_production() {
    let mut w = World::new();
    w.register("a1", 2.0, 16, &[]);
    for t in w.create(spec("p1", 2, false, r#","priority":0"#)) {
        w.run(&t);
    }
    let p2 = w.create(spec("p2", 1, false, r#","priority":9"#));
    assert_eq!(w.state(&p2[0]), TaskState::Pending);
    assert!(w
        .core
        .tasks
        .values()
        .all(|t| t.status.state != TaskState::Preempting));
}

#[test]
fn a_reservation_whose_preemptor_stays_unplaced_is_released_in_time() {
    // One batch task holds the whole agent; its kill never completes.
    let mut w = World::new();
    w.register("a1", 2.0, 16, &[]);
    let mut big = spec("big", 1, false, r#","tier":"preemptible""#);
    big.task.resources.cpu = 2.0;
    let victim = w.create(big).remove(0);
    w.run(&victim);
    let prod = w.create(spec("prod", 1, true, ""));
    assert_eq!(w.state(&victim), TaskState::Preempting);
    assert_eq!(w.core.agents[0].reserved.cpu_milli, 1000);
    w.pass(29_000);
    assert_eq!(w.core.agents[0].reserved.cpu_milli, 1000, "still reserved");
    w.pass(2_000);
    assert_eq!(w.core.agents[0].reserved, Need::default(), "released");
    assert!(!w.core.reservations.contains_key(&prod[0]));
    assert_eq!(w.state(&prod[0]), TaskState::Pending);
    // Once the victim ends, the preemptor (PENDING as any other) is placed.
    w.report(&victim, TaskState::Killed, None);
    assert_eq!(w.state(&prod[0]), TaskState::Assigned);
}

#[test]
fn a_higher_priority_preemptible_task_preempts_a_lower_one_of_its_role_only() {
    let (mut w, batch) = full_world();
    let hi = w.create(spec(
        "hi",
        1,
        false,
        r#","tier":"preemptible","priority":5"#,
    ));
    assert_eq!(
        batch
            .iter()
            .filter(|t| w.state(t) == TaskState::Preempting)
            .count(),
        1
    );
    assert_eq!(w.state(&hi[0]), TaskState::Pending);
    // Equal standing preempts nothing: the replacement of the victim waits.
    let repl: Vec<String> = (0..2).map(|i| w.current("www/prod/batch", i)).collect();
    let waiting = repl
        .iter()
        .filter(|t| w.state(t) == TaskState::Pending)
        .count();
    assert_eq!(waiting, 1);
    assert_eq!(
        w.core
            .tasks
            .values()
            .filter(|t| t.status.state == TaskState::Preempting)
            .count(),
        1
    );
}

#[test]
fn a_victims_sla_policy_bounds_how_many_of_its_instances_go_at_once() {
    let mut w = World::new();
    w.register("a1", 2.0, 16, &[]);
    let batch = w.create(spec(
        "batch",
        2,
        false,
        r#","tier":"preemptible","sla_policy":{"max_disrupted":1}"#,
    ));
    for t in &batch {
        w.run(t);
    }
    // Needs both instances gone: the policy allows one at a time.
    let mut big = spec("big", 1, false, "");
    big.task.resources.cpu = 2.0;
    let big = w.create(big);
    assert_eq!(w.state(&big[0]), TaskState::Pending);
    assert!(batch.iter().all(|t| w.state(t) == TaskState::Running));
    w.handle(Event::Kill {
        job: "www/prod/big".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    // One instance is within the policy.
    let small = w.create(spec("small", 1, false, ""));
    assert_eq!(
        batch
            .iter()
            .filter(|t| w.state(t) == TaskState::Preempting)
            .count(),
        1
    );
    assert_eq!(w.state(&small[0]), TaskState::Pending);
}

/// A preemptible job of role `role` and priority `priority`.
fn role_job(role: &str, name: &str, instances: u32, priority: u32, service: bool) -> JobSpec {
    let mut v =
        serde_json::to_value(spec(name, instances, service, r#","tier":"preemptible""#)).unwrap();
    v["role"] = serde_json::json!(role);
    v["priority"] = serde_json::json!(priority);
    serde_json::from_value(v).unwrap()
}

#[test]
fn freed_room_goes_to_the_waiting_task_of_highest_standing_by_its_own_config() {
    let mut w = World::new();
    w.register("a1", 1.0, 16, &[]);
    w.register("a2", 1.0, 16, &[]);
    // Roles apart: no preemptible task here may preempt another.
    let filler = w.create(role_job("f", "filler", 2, 0, false));
    for t in &filler {
        w.run(t);
    }
    // Job a waits with priority 9; a canary update moves instance 0 to priority 1,
    // so its newest config stands below job b's 5 while instance 1 stands above.
    let a = w.create(role_job("ra", "a", 2, 9, true));
    let canary = role_job("ra", "a", 2, 1, true);
    w.handle(Event::StartUpdate {
        job: "ra/prod/a".to_string(),
        spec: Box::new(canary),
        instances: Some(vec![0]),
        user: "alice".to_string(),
    })
    .reply
    .unwrap();
    assert_eq!(w.core.jobs["ra/prod/a"].spec.priority, 1, "newest config");
    let inst1 = w.current("ra/prod/a", 1);
    assert_eq!(inst1, a[1], "instance 1 keeps its config");
    let b = w.create(role_job("rb", "b", 1, 5, false));
    assert_eq!(w.state(&inst1), TaskState::Pending);
    assert_eq!(w.state(&b[0]), TaskState::Pending);
    // One cpu frees up: it goes to instance 1 (priority 9 by its own config), not to
    // job b (5), though job a's newest config stands at 1.
    w.handle(Event::Kill {
        job: "f/prod/filler".to_string(),
        instances: Some(vec![0]),
    })
    .reply
    .unwrap();
    w.report(&filler[0], TaskState::Killed, None);
    assert_eq!(w.state(&inst1), TaskState::Assigned);
    assert_eq!(w.state(&b[0]), TaskState::Pending);
    let inst0 = w.current("ra/prod/a", 0);
    assert_eq!(w.state(&inst0), TaskState::Pending);
    // The next cpu goes to job b (5) before instance 0's new config (1).
    w.handle(Event::Kill {
        job: "f/prod/filler".to_string(),
        instances: Some(vec![1]),
    })
    .reply
    .unwrap();
    w.report(&filler[1], TaskState::Killed, None);
    assert_eq!(w.state(&b[0]), TaskState::Assigned);
    assert_eq!(w.state(&inst0), TaskState::Pending);
}
