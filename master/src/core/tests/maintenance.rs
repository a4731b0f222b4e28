//! Host maintenance: cordon, drains within SLA budgets, deadlines, DRAINED only
//! once every ending was heard, activation, restarts mid-drain, and a property
//! test that a drain never takes a job below its policy and always finishes.

use drover_common::wire::MaintenanceMode;

use super::*;

fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

impl World {
    fn maint(&mut self, op: MaintenanceOp, names: &[&str]) -> Result<Reply, CoreError> {
        self.handle(Event::Maintenance {
            op,
            hosts: hosts(names),
        })
        .reply
    }

    fn drain(&mut self, names: &[&str], deadline_ms: Option<u64>) {
        self.maint(MaintenanceOp::Drain { deadline_ms }, names)
            .unwrap();
    }

    fn mode(&self, agent: &str) -> MaintenanceMode {
        self.core.host_views_named(&hosts(&[agent])).unwrap()[0].mode
    }

    /// Runs every task that is ASSIGNED and ends every task DRAINING (KILLED), as
    /// agents would.
    fn agents_act(&mut self) {
        let ids: Vec<String> = self.core.tasks.keys().cloned().collect();
        for id in ids {
            match self.state(&id) {
                TaskState::Assigned => self.run(&id),
                TaskState::Draining => self.report(&id, TaskState::Killed, None),
                _ => {}
            }
        }
    }

    /// Current tasks of `job` that are RUNNING.
    fn running(&self, job: &str) -> usize {
        self.core.jobs[job]
            .slots
            .iter()
            .filter_map(|s| s.current.as_ref())
            .filter(|id| self.state(id) == TaskState::Running)
            .count()
    }

    fn on_agent(&self, agent: &str) -> Vec<String> {
        self.core.agents[self.core.agent_idx[agent] as usize]
            .tasks
            .iter()
            .cloned()
            .collect()
    }
}

/// `n` agents a1..an with room for 4 tasks each.
fn world(n: usize) -> World {
    let mut w = World::new();
    for i in 1..=n {
        w.register(&format!("a{i}"), 4.0, 16, &[]);
    }
    w
}

#[test]
fn cordon_keeps_running_tasks_refuses_new_ones_and_activate_takes_them_again() {
    let mut w = world(1);
    let t = w.create(spec("c", 1, false, ""));
    w.run(&t[0]);
    w.maint(MaintenanceOp::Cordon, &["a1.example"]).unwrap();
    assert_eq!(w.mode("a1"), MaintenanceMode::Scheduled);
    assert_eq!(w.state(&t[0]), TaskState::Running, "cordon keeps it");
    let more = w.create(spec("more", 1, false, ""));
    assert_eq!(w.state(&more[0]), TaskState::Pending);
    let view = w.core.task_view(&more[0]).unwrap();
    assert!(
        view.pending_reason
            .as_deref()
            .is_some_and(|r| r.contains("host in maintenance")),
        "{view:?}"
    );
    w.maint(MaintenanceOp::Activate, &["a1"]).unwrap();
    assert_eq!(w.mode("a1"), MaintenanceMode::None);
    assert_eq!(w.state(&more[0]), TaskState::Assigned);
}

#[test]
fn bad_names_and_conflicts_are_refused_and_nothing_is_half_applied() {
    let mut w = world(2);
    assert_eq!(
        w.maint(MaintenanceOp::Cordon, &["a1", "nope"]),
        Err(CoreError::UnknownHosts(vec!["nope".to_string()]))
    );
    assert_eq!(w.mode("a1"), MaintenanceMode::None, "nothing half-applied");
    assert_eq!(w.maint(MaintenanceOp::Cordon, &[]), Err(CoreError::NoHosts));
    // Two agents reporting one host name: the name is ambiguous, ids are not.
    let mut req = agent_req("a3", 4.0, 16, &[]);
    req.hostname = "a1.example".to_string();
    w.handle(Event::Register(Box::new(req))).reply.unwrap();
    assert!(matches!(
        w.maint(MaintenanceOp::Cordon, &["a1.example"]),
        Err(CoreError::AmbiguousHost { .. })
    ));
    w.drain(&["a2"], None);
    assert!(matches!(
        w.maint(MaintenanceOp::Cordon, &["a1", "a2"]),
        Err(CoreError::HostConflict { .. })
    ));
    assert_eq!(w.mode("a1"), MaintenanceMode::None, "nothing half-applied");
}

#[test]
fn a_drain_moves_tasks_through_draining_and_is_done_only_when_the_agent_said_so() {
    let mut w = world(3);
    let t = w.create(spec("d", 2, true, ""));
    w.agents_act();
    let victim = t
        .iter()
        .find(|id| w.core.task(id).unwrap().agent.as_deref() == Some("a1"))
        .cloned()
        .unwrap();
    w.drain(&["a1"], None);
    assert_eq!(w.mode("a1"), MaintenanceMode::Draining);
    assert_eq!(w.state(&victim), TaskState::Draining);
    let task = w.core.task(&victim).unwrap();
    assert_eq!(task.desired, DesiredState::Shutdown);
    assert_eq!(task.kill_reason, Some(ExitReason::Drained));
    let instance = task.instance;
    let replacement = w.current("www/prod/d", instance);
    assert_ne!(replacement, victim);
    let placed_on = w.core.task(&replacement).unwrap().agent.clone();
    assert!(placed_on.is_some() && placed_on.as_deref() != Some("a1"));
    // The master decided the kill; the host is not DRAINED before the agent says so.
    w.pass(2_000);
    assert_eq!(w.mode("a1"), MaintenanceMode::Draining);
    w.report(&victim, TaskState::Killed, None);
    assert_eq!(w.mode("a1"), MaintenanceMode::Drained);
    let ended = w.core.task(&victim).unwrap();
    assert_eq!(ended.status.state, TaskState::Killed);
    assert_eq!(ended.status.exit_reason, Some(ExitReason::Drained));
    w.maint(MaintenanceOp::Activate, &["a1"]).unwrap();
    assert_eq!(w.mode("a1"), MaintenanceMode::None);
}

#[test]
fn without_a_policy_a_job_loses_one_instance_at_a_time_across_all_draining_hosts() {
    let mut w = world(5);
    w.create(spec("one", 3, true, ""));
    w.agents_act();
    let busy: Vec<String> = (1..=5)
        .map(|i| format!("a{i}"))
        .filter(|a| !w.on_agent(a).is_empty())
        .take(2)
        .collect();
    let names: Vec<&str> = busy.iter().map(String::as_str).collect();
    w.drain(&names, None);
    let draining = |w: &World| {
        w.core
            .tasks
            .values()
            .filter(|t| t.status.state == TaskState::Draining)
            .count()
    };
    assert_eq!(draining(&w), 1, "one instance at a time");
    let blocked: Vec<String> = w
        .core
        .host_views()
        .into_iter()
        .flat_map(|h| h.blocked)
        .collect();
    assert!(
        blocked.iter().any(|b| b.contains("allows 1 at once")),
        "{blocked:?}"
    );
    for _ in 0..4 {
        w.agents_act();
    }
    for a in &names {
        assert_eq!(w.mode(a), MaintenanceMode::Drained);
    }
    assert_eq!(w.running("www/prod/one"), 3);
}

#[test]
fn a_policy_that_can_never_be_met_is_reported_and_the_deadline_forces_it() {
    let mut w = world(2);
    let t = w.create(spec("solo", 1, true, r#","sla_policy":{"min_healthy":1}"#));
    w.agents_act();
    let host = w.core.task(&t[0]).unwrap().agent.clone().unwrap();
    w.drain(&[&host], Some(10_000));
    assert_eq!(w.state(&t[0]), TaskState::Running);
    let view = &w.core.host_views_named(&hosts(&[&host])).unwrap()[0];
    assert!(
        view.blocked[0].contains("no instance can ever be drained"),
        "{view:?}"
    );
    assert!(view.events.iter().any(|e| e.message.contains("blocked")));
    w.pass(9_000);
    assert_eq!(w.state(&t[0]), TaskState::Running);
    w.pass(1_500);
    assert_eq!(w.state(&t[0]), TaskState::Draining);
    let events = &w.core.task(&t[0]).unwrap().status.events;
    assert!(
        events.last().unwrap().message.contains("deadline"),
        "{events:?}"
    );
}

/// One clock case of the timer tests: the wall clock steps by `live_step` while the
/// master runs; with `restart_at`, the master stops after that long, the wall clock
/// steps by `down_step` while it is down, and it loads its snapshot again.
fn step_clocks(w: &mut World, live_step: i64, down_step: i64, restart_at: Option<u64>) {
    w.wall_skew += live_step;
    if let Some(at) = restart_at {
        w.pass(at);
        let snap = w.snapshot();
        w.wall_skew += down_step;
        w.core = Core::load(cfg(), snap, w.at(), 9);
    }
}

#[test]
fn a_drain_deadline_runs_on_the_monotonic_clock_and_survives_restarts_capped() {
    const HOUR: i64 = 3_600_000;
    // (wall clock step while running, wall step while the master is down, restart
    // after, forced by): a step while running moves nothing; a backward step while
    // down cannot push the deadline past the whole drain's time; a forward one
    // while down ends it at once, as it ends THROTTLED penalties.
    for (live_step, down_step, restart_at, forced_by) in [
        (HOUR, 0, None, 10_000),
        (-HOUR, 0, None, 10_000),
        (0, 0, Some(4_000), 10_000),
        (0, -HOUR, Some(4_000), 14_000),
        (0, HOUR, Some(4_000), 4_000),
    ] {
        let case = format!("live {live_step}, down {down_step}, restart {restart_at:?}");
        let mut w = world(2);
        let t = w.create(spec("solo", 1, true, r#","sla_policy":{"min_healthy":1}"#));
        w.agents_act();
        let host = w.core.task(&t[0]).unwrap().agent.clone().unwrap();
        let start = w.now;
        w.drain(&[&host], Some(10_000));
        step_clocks(&mut w, live_step, down_step, restart_at);
        while w.now + 500 < start + forced_by {
            assert_eq!(
                w.state(&t[0]),
                TaskState::Running,
                "{case} at {}",
                w.now - start
            );
            w.pass(250);
        }
        w.pass(1_000);
        assert_eq!(w.state(&t[0]), TaskState::Draining, "{case}");
    }
}

/// `drain --start-at`: the host is SCHEDULED (cordoned) at once and DRAINING at
/// the start time, which runs on the monotonic clock and survives restarts like a
/// deadline (capped at the whole wait); the deadline counts from the start.
#[test]
fn a_drain_with_a_start_time_cordons_now_and_drains_at_the_start() {
    const HOUR: i64 = 3_600_000;
    // (wall step while running, wall step while down, restart after, starts by)
    for (live_step, down_step, restart_at, starts_by) in [
        (0, 0, None, 10_000),
        (HOUR, 0, None, 10_000),
        (-HOUR, 0, None, 10_000),
        (0, 0, Some(4_000), 10_000),
        (0, -HOUR, Some(4_000), 14_000),
        (0, HOUR, Some(4_000), 4_000),
    ] {
        let case = format!("live {live_step}, down {down_step}, restart {restart_at:?}");
        let mut w = world(2);
        let t = w.create(spec("solo", 1, true, r#","sla_policy":{"min_healthy":1}"#));
        w.agents_act();
        let host = w.core.task(&t[0]).unwrap().agent.clone().unwrap();
        let start = w.now;
        let at_ms = w.at().wall + 10_000;
        w.maint(
            MaintenanceOp::DrainAt {
                at_ms,
                deadline_ms: Some(5_000),
            },
            &[&host],
        )
        .unwrap();
        let v = &w.core.host_views_named(&hosts(&[&host])).unwrap()[0];
        assert_eq!(v.mode, MaintenanceMode::Scheduled, "{case}");
        assert_eq!(v.drain_at_ms, Some(at_ms), "{case}");
        // Cordoned: a new job goes to the other host.
        let other = w.create(spec("other", 1, true, ""));
        assert_ne!(
            w.core.task(&other[0]).unwrap().agent.as_deref(),
            Some(host.as_str())
        );
        step_clocks(&mut w, live_step, down_step, restart_at);
        while w.now + 300 < start + starts_by {
            assert_eq!(
                w.mode(&host),
                MaintenanceMode::Scheduled,
                "{case} at {}",
                w.now - start
            );
            w.pass(250);
        }
        w.pass(600);
        assert_eq!(w.mode(&host), MaintenanceMode::Draining, "{case}");
        let v = &w.core.host_views_named(&hosts(&[&host])).unwrap()[0];
        assert_eq!(v.drain_at_ms, None, "{case}");
        assert!(v.deadline_ms.is_some(), "{case}");
        // min_healthy 1 of 1 blocks it until the deadline, 5 s after the start.
        assert_eq!(w.state(&t[0]), TaskState::Running, "{case}");
        w.pass(4_000);
        assert_eq!(w.state(&t[0]), TaskState::Running, "{case}");
        w.pass(1_500);
        assert_eq!(w.state(&t[0]), TaskState::Draining, "{case}");
    }
}

#[test]
fn a_scheduled_drain_is_ended_by_activate_replaced_by_a_drain_now_and_refused_when_draining() {
    let mut w = world(2);
    w.create(spec("solo", 1, true, ""));
    w.agents_act();
    let at_ms = w.at().wall + 10_000;
    let later = MaintenanceOp::DrainAt {
        at_ms,
        deadline_ms: None,
    };
    w.maint(later, &["a1"]).unwrap();
    w.maint(MaintenanceOp::Activate, &["a1"]).unwrap();
    w.pass(11_000);
    assert_eq!(
        w.mode("a1"),
        MaintenanceMode::None,
        "activate cancels the start"
    );
    w.maint(later, &["a1"]).unwrap();
    w.drain(&["a1"], None);
    let v = &w.core.host_views_named(&hosts(&["a1"])).unwrap()[0];
    assert_eq!(v.mode, MaintenanceMode::Draining);
    assert_eq!(
        v.drain_at_ms, None,
        "a drain now replaces the scheduled one"
    );
    let at_ms = w.at().wall + 10_000;
    let e = w
        .maint(
            MaintenanceOp::DrainAt {
                at_ms,
                deadline_ms: None,
            },
            &["a1", "a2"],
        )
        .unwrap_err();
    assert!(matches!(e, CoreError::HostConflict { .. }), "{e:?}");
    assert_eq!(w.mode("a2"), MaintenanceMode::None, "nothing half-applied");
    // A start time not in the future drains at once.
    let now = w.at().wall;
    w.maint(
        MaintenanceOp::DrainAt {
            at_ms: now,
            deadline_ms: None,
        },
        &["a2"],
    )
    .unwrap();
    assert_eq!(w.mode("a2"), MaintenanceMode::Draining);
}

#[test]
fn min_healthy_with_min_time_waits_for_replacements_to_be_healthy_long_enough() {
    let mut w = world(4);
    w.create(spec(
        "mh",
        3,
        true,
        r#","sla_policy":{"min_healthy":2,"min_time":"5s"}"#,
    ));
    w.agents_act();
    w.pass(6_000);
    let busy: Vec<String> = (1..=4)
        .map(|i| format!("a{i}"))
        .filter(|a| !w.on_agent(a).is_empty())
        .take(2)
        .collect();
    w.drain(&[&busy[0], &busy[1]], None);
    assert_eq!(
        w.core
            .tasks
            .values()
            .filter(|t| t.status.state == TaskState::Draining)
            .count(),
        1
    );
    w.agents_act();
    // The replacement runs but is not healthy for 5 s yet: the second waits.
    w.pass(3_000);
    let modes = [w.mode(&busy[0]), w.mode(&busy[1])];
    assert!(modes.contains(&MaintenanceMode::Draining), "{modes:?}");
    assert!(modes.contains(&MaintenanceMode::Drained), "{modes:?}");
    w.pass(3_000);
    w.agents_act();
    assert_eq!(w.mode(&busy[0]), MaintenanceMode::Drained);
    assert_eq!(w.mode(&busy[1]), MaintenanceMode::Drained);
}

#[test]
fn a_drain_goes_on_after_a_master_restart() {
    let mut w = world(4);
    w.create(spec("r", 2, true, ""));
    w.agents_act();
    let busy: Vec<String> = (1..=4)
        .map(|i| format!("a{i}"))
        .filter(|a| !w.on_agent(a).is_empty())
        .collect();
    w.drain(&[&busy[0], &busy[1]], None);
    let snap = w.snapshot();
    w.now += 1_000;
    w.core = Core::load(cfg(), snap, w.at(), 9);
    assert_eq!(w.mode(&busy[0]), MaintenanceMode::Draining);
    for _ in 0..4 {
        w.agents_act();
        w.pass(500);
    }
    assert_eq!(w.mode(&busy[0]), MaintenanceMode::Drained);
    assert_eq!(w.mode(&busy[1]), MaintenanceMode::Drained);
    assert_eq!(w.running("www/prod/r"), 2);
}

#[test]
fn a_host_lost_while_draining_finishes_through_the_partition_policy() {
    let mut w = world(2);
    let t = w.create(spec("p", 1, true, ""));
    w.agents_act();
    let host = w.core.task(&t[0]).unwrap().agent.clone().unwrap();
    let other = if host == "a1" { "a2" } else { "a1" };
    w.drain(&[&host], None);
    // The host goes silent; only the other agent heartbeats.
    for _ in 0..20 {
        w.advance(500);
        w.heartbeat(other, None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Killed);
    assert_eq!(w.mode(&host), MaintenanceMode::Drained);
}

#[test]
fn a_lost_draining_host_leaves_its_tasks_to_the_partition_policy_even_past_the_deadline() {
    // Both jobs on a1 (the only agent yet); neither policy ever lets the drain go.
    let mut w = world(1);
    let keep = w.create(spec(
        "keep",
        1,
        true,
        r#","partition_policy":{"reschedule":false},"sla_policy":{"min_healthy":1}"#,
    ))[0]
        .clone();
    let patient = w.create(spec(
        "patient",
        1,
        true,
        r#","partition_policy":{"delay":"20s"},"sla_policy":{"min_healthy":1}"#,
    ))[0]
        .clone();
    w.agents_act();
    for a in ["a2", "a3"] {
        w.register(a, 4.0, 16, &[]);
    }
    w.drain(&["a1"], Some(5_000));
    assert_eq!(w.mode("a1"), MaintenanceMode::Draining);
    // a1 goes silent: past its timeout and the drain's deadline, but within the
    // 20 s delay, nothing of a1's is replaced.
    for _ in 0..20 {
        w.advance(500);
        w.heartbeat("a2", None);
        w.heartbeat("a3", None);
    }
    for (id, job) in [(&keep, "www/prod/keep"), (&patient, "www/prod/patient")] {
        assert_eq!(w.state(id), TaskState::Running, "{job} was forced off");
        assert_eq!(&w.current(job, 0), id, "{job} was replaced");
    }
    let view = &w.core.host_views_named(&hosts(&["a1"])).unwrap()[0];
    assert_eq!(view.mode, MaintenanceMode::Draining);
    assert_eq!(view.tasks_left, 2);
    assert!(
        view.blocked.iter().any(|b| b.contains("host unreachable")),
        "{view:?}"
    );
    // The delay ends: `patient` is LOST and replaced; `keep` stays.
    for _ in 0..30 {
        w.advance(500);
        w.heartbeat("a2", None);
        w.heartbeat("a3", None);
    }
    assert_eq!(w.state(&patient), TaskState::Lost);
    assert_ne!(w.current("www/prod/patient", 0), patient);
    assert_eq!(w.state(&keep), TaskState::Running);
    assert_eq!(w.mode("a1"), MaintenanceMode::Draining);
    // a1 is back: the deadline has passed, so `keep` is forced off now.
    w.heartbeat("a1", Some(vec![keep.as_str(), patient.as_str()]));
    assert_eq!(w.state(&keep), TaskState::Draining);
    w.report(&keep, TaskState::Killed, None);
    w.pass(500);
    assert_eq!(w.mode("a1"), MaintenanceMode::Drained);
    assert_ne!(w.current("www/prod/keep", 0), keep);
}

#[test]
fn drained_hosts_going_silent_are_no_eviction_storm() {
    // Three of five hosts drained and powered off for maintenance: the guard stays
    // out of it, so a real loss on the two left is still replaced.
    let mut w = world(5);
    let t = w.create(spec("svc", 2, true, ""));
    w.agents_act();
    let busy: Vec<String> = t
        .iter()
        .map(|id| w.core.task(id).unwrap().agent.clone().unwrap())
        .collect();
    let idle: Vec<String> = (1..=5)
        .map(|i| format!("a{i}"))
        .filter(|a| !busy.contains(a))
        .collect();
    let idle: Vec<&str> = idle.iter().map(String::as_str).collect();
    w.drain(&idle, None);
    for a in &idle {
        assert_eq!(w.mode(a), MaintenanceMode::Drained);
    }
    for _ in 0..20 {
        w.advance(500);
        for a in &busy {
            w.heartbeat(a, None);
        }
    }
    assert!(!w.core.guard_engaged(), "{:?}", w.core.cluster_view());
    // Then one of the two hosts with tasks is lost: replaced as usual.
    for _ in 0..20 {
        w.advance(500);
        w.heartbeat(&busy[1], None);
    }
    assert!(!w.core.guard_engaged(), "{:?}", w.core.cluster_view());
    assert_eq!(w.state(&t[0]), TaskState::Lost);
}

#[test]
fn a_round_moves_at_most_drain_round_max_tasks_and_the_next_ones_go_on_where_it_stopped() {
    let mut w = World::with(CoreConfig {
        drain_round_max_tasks: 3,
        drain_round_interval_ms: 100,
        ..cfg()
    });
    w.register("a1", 4.0, 16, &[]);
    w.register("a2", 4.0, 16, &[]);
    w.create(spec(
        "wide",
        8,
        true,
        r#","sla_policy":{"max_disrupted":8},"constraints":{"host":"limit:4"}"#,
    ));
    w.agents_act();
    w.register("a3", 4.0, 16, &[]);
    w.register("a4", 4.0, 16, &[]);
    let draining = |w: &World, agent: &str| {
        w.on_agent(agent)
            .iter()
            .filter(|id| w.state(id) == TaskState::Draining)
            .count()
    };
    assert_eq!((w.on_agent("a1").len(), w.on_agent("a2").len()), (4, 4));
    w.drain(&["a1", "a2"], None);
    assert_eq!((draining(&w, "a1"), draining(&w, "a2")), (3, 0));
    // The next round runs one interval later, with no other event to bring it,
    // and goes on with the host the first one stopped on.
    w.advance(100);
    assert_eq!((draining(&w, "a1"), draining(&w, "a2")), (4, 2));
    w.advance(100);
    assert_eq!((draining(&w, "a1"), draining(&w, "a2")), (4, 4));
    w.agents_act();
    w.pass(500);
    w.agents_act();
    assert_eq!(w.mode("a1"), MaintenanceMode::Drained);
    assert_eq!(w.mode("a2"), MaintenanceMode::Drained);
    assert_eq!(w.running("www/prod/wide"), 8);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Draining random hosts under random policies never takes a job below its
    /// policy, and every drain finishes once replacements can run.
    #[test]
    fn drains_keep_every_policy_and_finish(
        agents in 5usize..8,
        jobs in proptest::collection::vec((1u32..4, 0u8..3), 1..4),
        drained in proptest::collection::btree_set(1usize..8, 1..3),
    ) {
        let mut w = world(agents);
        let mut keys = Vec::new();
        for (j, (instances, kind)) in jobs.iter().enumerate() {
            let policy = match kind {
                0 => String::new(),
                1 => format!(r#","sla_policy":{{"min_healthy":{}}}"#, instances - 1),
                _ => r#","sla_policy":{"max_disrupted":2}"#.to_string(),
            };
            let s = spec(&format!("j{j}"), *instances, true, &policy);
            keys.push((format!("www/prod/j{j}"), *instances, *kind));
            w.create(s);
        }
        w.agents_act();
        let names: Vec<String> = drained
            .iter()
            .filter(|i| **i <= agents)
            .map(|i| format!("a{i}"))
            .collect();
        prop_assume!(!names.is_empty());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        w.drain(&refs, None);
        for _ in 0..12 {
            for (key, instances, kind) in &keys {
                let running = w.running(key) as u32;
                let floor = match kind {
                    0 => instances - 1,
                    1 => instances - 1,
                    _ => instances.saturating_sub(2),
                };
                prop_assert!(running >= floor, "{key}: {running} running, floor {floor}");
            }
            w.agents_act();
            w.pass(500);
        }
        for n in &names {
            prop_assert_eq!(w.mode(n), MaintenanceMode::Drained);
        }
    }
}

#[test]
fn a_host_where_tasks_of_several_jobs_fail_host_side_is_quarantined_until_activated() {
    let mut w = world(1);
    let setup_failed = || {
        Some(ExitReason::SandboxSetupFailed {
            error: "read-only file system".to_string(),
        })
    };
    // One job failing alone does not quarantine (it may be the job's fault).
    let solo = w.create(spec("solo", 1, false, r#","max_task_failures":10"#));
    let host = w.core.task(&solo[0]).unwrap().agent.clone().unwrap();
    for _ in 0..3 {
        w.pass(5_000);
        let id = w.current("www/prod/solo", 0);
        assert_eq!(w.state(&id), TaskState::Assigned);
        w.report(&id, TaskState::Failed, setup_failed());
    }
    assert_eq!(w.mode(&host), MaintenanceMode::None);
    // A second job failing there too does.
    let other = w.create(spec("other", 1, false, ""));
    w.report(&other[0], TaskState::Failed, setup_failed());
    let view = &w.core.host_views_named(&hosts(&[&host])).unwrap()[0];
    assert_eq!(view.mode, MaintenanceMode::Scheduled, "{view:?}");
    assert_eq!(view.reason.as_deref(), Some("quarantined"));
    let last = &view.events.last().unwrap().message;
    assert!(
        last.contains("www/prod/other") && last.contains("sandbox setup failed"),
        "{last}"
    );
    // Nothing new goes there; activate ends the quarantine.
    w.pass(3_000);
    for id in w.on_agent(&host) {
        assert_ne!(
            w.state(&id),
            TaskState::Assigned,
            "placed on a quarantined host"
        );
    }
    w.maint(MaintenanceOp::Activate, &[&host]).unwrap();
    assert_eq!(w.mode(&host), MaintenanceMode::None);
}

#[test]
fn quarantine_counts_survive_a_master_restart_within_their_window() {
    let setup_failed = || {
        Some(ExitReason::SandboxSetupFailed {
            error: "read-only file system".to_string(),
        })
    };
    // (time the master is down, quarantined after the restart): two failures
    // before the restart and one after reach the threshold (3) only while the
    // first two are still within the window (60 s).
    for (down, quarantined) in [(1_000, true), (70_000, false)] {
        let mut w = world(1);
        let a = w.create(spec("a", 1, false, r#","max_task_failures":10"#));
        let b = w.create(spec("b", 1, false, ""));
        let host = w.core.task(&a[0]).unwrap().agent.clone().unwrap();
        w.report(&a[0], TaskState::Failed, setup_failed());
        w.report(&b[0], TaskState::Failed, setup_failed());
        assert_eq!(w.mode(&host), MaintenanceMode::None);
        let snap = w.snapshot();
        w.now += down;
        w.core = Core::load(cfg(), snap, w.at(), 9);
        w.pass(6_000);
        let id = w.current("www/prod/a", 0);
        assert_eq!(w.state(&id), TaskState::Assigned, "down {down}");
        w.report(&id, TaskState::Failed, setup_failed());
        let expected = if quarantined {
            MaintenanceMode::Scheduled
        } else {
            MaintenanceMode::None
        };
        assert_eq!(w.mode(&host), expected, "down {down}");
    }
}

#[test]
fn quarantine_can_be_turned_off() {
    let mut w = World::new();
    w.core = Core::new(
        CoreConfig {
            quarantine_failures: 0,
            ..cfg()
        },
        w.at(),
        7,
    );
    w.register("a1", 8.0, 16, &[]);
    for j in 0..4 {
        let t = w.create(spec(&format!("q{j}"), 1, false, ""));
        w.report(&t[0], TaskState::Failed, Some(ExitReason::ExecutorLost));
    }
    assert_eq!(w.mode("a1"), MaintenanceMode::None);
}

#[test]
fn a_dry_run_predicts_waves_and_blocking_policies_and_changes_nothing() {
    let mut w = world(4);
    w.create(spec("p", 3, true, ""));
    let solo = w.create(spec("solo", 1, true, r#","sla_policy":{"min_healthy":1}"#));
    w.agents_act();
    w.pass(1_000);
    let solo_host = w.core.task(&solo[0]).unwrap().agent.clone().unwrap();
    let p_hosts: Vec<String> = (1..=4)
        .map(|i| format!("a{i}"))
        .filter(|a| {
            w.on_agent(a)
                .iter()
                .any(|id| w.core.task(id).unwrap().job == "www/prod/p")
        })
        .take(2)
        .collect();
    let probe = w.core.drain_probe(&p_hosts, w.at()).unwrap();
    assert_eq!(probe.len(), 2);
    let p = probe[0]
        .jobs
        .iter()
        .find(|j| j.job == "www/prod/p")
        .unwrap();
    assert_eq!(
        (p.tasks_on_host, p.tasks_on_hosts, p.at_once, p.waves),
        (1, 2, 1, 2)
    );
    assert!(p.within_policy && p.estimate_ms > 0, "{p:?}");
    let probe = w
        .core
        .drain_probe(std::slice::from_ref(&solo_host), w.at())
        .unwrap();
    let s = probe[0]
        .jobs
        .iter()
        .find(|j| j.job == "www/prod/solo")
        .unwrap();
    assert!(!s.within_policy, "{s:?}");
    assert!(s
        .reason
        .as_deref()
        .is_some_and(|r| r.contains("can ever be drained")));
    assert!(!probe[0].within_policy);
    for h in p_hosts.iter().chain([&solo_host]) {
        assert_eq!(
            w.mode(h),
            MaintenanceMode::None,
            "a dry run changes nothing"
        );
    }
    assert_eq!(
        w.core.drain_probe(&hosts(&["nope"]), w.at()),
        Err(CoreError::UnknownHosts(vec!["nope".to_string()]))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever cordons, drains, activations and task endings happen, a master
    /// restarted from what was persisted has every host in the mode it had.
    #[test]
    fn maintenance_modes_survive_every_restart(
        ops in proptest::collection::vec((0u8..4, 1usize..5), 1..20),
    ) {
        let mut w = world(4);
        w.create(spec("m", 2, true, ""));
        w.agents_act();
        for (op, host) in ops {
            let name = format!("a{host}");
            match op {
                0 => { let _ = w.maint(MaintenanceOp::Cordon, &[&name]); }
                1 => w.drain(&[&name], None),
                2 => { let _ = w.maint(MaintenanceOp::Activate, &[&name]); }
                _ => w.agents_act(),
            }
            let before: Vec<(String, MaintenanceMode)> = w
                .core
                .host_views()
                .into_iter()
                .map(|h| (h.agent_id, h.mode))
                .collect();
            let snap = w.snapshot();
            w.now += 10;
            w.core = Core::load(cfg(), snap, w.at(), 9);
            let after: Vec<(String, MaintenanceMode)> = w
                .core
                .host_views()
                .into_iter()
                .map(|h| (h.agent_id, h.mode))
                .collect();
            prop_assert_eq!(before, after);
        }
    }
}

#[test]
fn a_drain_whose_replacements_have_nowhere_to_go_is_stuck_and_says_why() {
    // 4 instances, at most 2 per host, on 2 hosts, one disrupted at a time: the
    // first replacement from a1 finds a1 in maintenance and a2 at its limit.
    let mut w = world(2);
    w.create(spec(
        "x",
        4,
        true,
        r#","constraints":{"host":"limit:2"},"sla_policy":{"max_disrupted":1}"#,
    ));
    w.agents_act();
    assert_eq!(w.running("www/prod/x"), 4);
    w.drain(&["a1"], None);
    for _ in 0..8 {
        w.agents_act();
        w.pass(500);
    }
    let view = &w.core.host_views_named(&hosts(&["a1"])).unwrap()[0];
    assert_eq!(view.mode, MaintenanceMode::Draining, "{view:?}");
    let stuck = view.stuck.clone().unwrap_or_default();
    assert!(
        stuck.contains("www/prod/x: 1 instance(s) PENDING: ")
            && stuck.contains("host limit reached on 1 agent"),
        "{view:?}"
    );
    // A third host takes the replacements: no longer stuck, and the drain ends.
    w.register("a3", 4.0, 16, &[]);
    for _ in 0..8 {
        w.agents_act();
        w.pass(500);
    }
    let view = &w.core.host_views_named(&hosts(&["a1"])).unwrap()[0];
    assert_eq!(view.stuck, None, "{view:?}");
    assert_eq!(view.mode, MaintenanceMode::Drained, "{view:?}");
}
