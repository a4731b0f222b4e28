//! The eviction-storm guard: a fleet that vanished at once keeps its tasks, one lost
//! agent is replaced as usual, an operator can release the guard, and losses below
//! the share go at a bounded rate.

use super::*;

/// Five agents, one task of a five-instance service on each, all RUNNING; returns
/// the task ids by agent (`a0`..`a4`).
fn five_agents(w: &mut World) -> Vec<(String, String)> {
    for k in 0..5 {
        w.register(&format!("a{k}"), 8.0, 16, &[]);
    }
    let ids = w.create(spec("svc", 5, true, ""));
    for id in &ids {
        w.run(id);
    }
    ids.iter()
        .map(|id| (w.core.task(id).unwrap().agent.clone().unwrap(), id.clone()))
        .collect()
}

/// Lets `ms` pass while only `alive` heartbeat.
fn pass_with(w: &mut World, alive: &[&str], ms: u64) {
    let mut left = ms;
    while left > 0 {
        let step = left.min(250);
        w.advance(step);
        left -= step;
        for a in alive {
            w.heartbeat(a, None);
        }
    }
}

fn lost(w: &World) -> usize {
    w.core
        .tasks
        .values()
        .filter(|t| t.status.state == TaskState::Lost)
        .count()
}

#[test]
fn three_of_five_agents_silent_hold_every_task_until_they_return() {
    let mut w = World::new();
    let placed = five_agents(&mut w);
    pass_with(&mut w, &["a3", "a4"], 30_000);
    assert_eq!(lost(&w), 0, "a storm made tasks LOST");
    assert_eq!(w.core.task_count(), 5, "a storm created replacements");
    let view = w.core.cluster_view();
    assert!(view.eviction_guard.engaged, "{view:?}");
    assert_eq!(view.eviction_guard.unreachable_agents, 3);
    assert_eq!(view.eviction_guard.fleet_agents, 5);
    assert_eq!(view.eviction_guard.held_tasks, 3);
    assert_eq!(view.reachable_agents, 2);
    pass_with(&mut w, &["a0", "a1", "a2", "a3", "a4"], 20_000);
    assert!(!w.core.guard_engaged());
    assert_eq!(lost(&w), 0);
    for (agent, id) in &placed {
        assert_eq!(w.state(id), TaskState::Running, "{id} on {agent}");
    }
    assert_eq!(w.core.task_count(), 5);
}

#[test]
fn one_of_five_agents_silent_is_replaced_as_usual() {
    let mut w = World::new();
    let placed = five_agents(&mut w);
    pass_with(&mut w, &["a1", "a2", "a3", "a4"], 6_000);
    assert!(!w.core.guard_engaged());
    let (_, id) = placed.iter().find(|(a, _)| a == "a0").unwrap();
    assert_eq!(w.state(id), TaskState::Lost);
    assert_eq!(lost(&w), 1);
}

#[test]
fn the_guard_releases_as_agents_return_and_the_rest_get_one_more_timeout() {
    let mut w = World::new();
    let placed = five_agents(&mut w);
    pass_with(&mut w, &["a3", "a4"], 10_000);
    assert!(w.core.guard_engaged());
    // Two of the three come back: one of five out is under the share.
    pass_with(&mut w, &["a1", "a2", "a3", "a4"], 2_000);
    assert!(!w.core.guard_engaged());
    assert_eq!(lost(&w), 0, "released, but a0 gets one more agent timeout");
    pass_with(&mut w, &["a1", "a2", "a3", "a4"], 4_000);
    let (_, id) = placed.iter().find(|(a, _)| a == "a0").unwrap();
    assert_eq!(w.state(id), TaskState::Lost);
    assert_eq!(lost(&w), 1);
}

#[test]
fn an_operator_release_lets_the_held_losses_go_and_the_same_agents_do_not_reengage_it() {
    let mut w = World::new();
    five_agents(&mut w);
    pass_with(&mut w, &["a3", "a4"], 10_000);
    assert!(w.core.guard_engaged());
    let out = w.handle(Event::ReleaseEvictionGuard);
    let Ok(Reply::Cluster(view)) = out.reply else {
        panic!("{:?}", out.reply);
    };
    assert!(!view.eviction_guard.engaged);
    assert!(out
        .effects
        .iter()
        .any(|e| matches!(e, Effect::EvictionGuard { engaged: false, .. })));
    pass_with(&mut w, &["a3", "a4"], 2_000);
    assert_eq!(lost(&w), 3);
    assert!(!w.core.guard_engaged());
    // Released with nothing engaged: a no-op answering the view.
    let out = w.handle(Event::ReleaseEvictionGuard);
    assert!(matches!(out.reply, Ok(Reply::Cluster(_))));
}

#[test]
fn engaging_is_an_effect_the_runtime_logs() {
    let mut w = World::new();
    five_agents(&mut w);
    let mut engaged = Vec::new();
    for _ in 0..40 {
        w.now += 250;
        let out = w.handle(Event::Tick);
        engaged.extend(out.effects.into_iter().filter_map(|e| match e {
            Effect::EvictionGuard { engaged, message } => Some((engaged, message)),
            _ => None,
        }));
        w.heartbeat("a4", None);
    }
    assert_eq!(engaged.len(), 1, "{engaged:?}");
    assert!(engaged[0].0);
    assert!(engaged[0].1.contains("4 of 5 agents"), "{}", engaged[0].1);
}

#[test]
fn exclusive_tasks_keep_their_lease_under_the_guard() {
    let mut w = World::new();
    for k in 0..5 {
        w.register(&format!("a{k}"), 8.0, 16, &[]);
    }
    let ids = w.create(spec(
        "ex",
        5,
        true,
        r#","partition_policy":{"exclusive":true}"#,
    ));
    for id in &ids {
        w.run(id);
    }
    // After the lease plus the task's worst-case kill time.
    let wait = w.core.cfg.exclusive_lease_ms
        + super::super::agents::kill_time_ms(&w.core.jobs["www/prod/ex"].spec);
    pass_with(&mut w, &["a4"], wait + 1_000);
    assert!(w.core.guard_engaged());
    assert_eq!(
        lost(&w),
        4,
        "exclusive tasks are replaced after their lease"
    );
}

#[test]
fn losses_below_the_share_go_at_the_configured_rate() {
    let mut c = cfg();
    c.agent_loss_rate = 2;
    let mut w = World::with(c);
    for k in 0..3 {
        w.register(&format!("a{k}"), 64.0, 64, &[]);
    }
    // Six batch tasks per agent (no one-per-host limit).
    let ids = w.create(spec("batch", 18, false, ""));
    for id in &ids {
        w.run(id);
    }
    let on_a0: Vec<&String> = ids
        .iter()
        .filter(|id| w.core.task(id).unwrap().agent.as_deref() == Some("a0"))
        .collect();
    assert_eq!(on_a0.len(), 6);
    // a0 found silent after 3 s + a sweep, acted on after the settle (1 s).
    pass_with(&mut w, &["a1", "a2"], 4_750);
    let first = lost(&w);
    assert!((1..=2).contains(&first), "{first} lost in the first second");
    pass_with(&mut w, &["a1", "a2"], 1_000);
    assert!(lost(&w) <= first + 2, "{} after two seconds", lost(&w));
    pass_with(&mut w, &["a1", "a2"], 3_000);
    assert_eq!(lost(&w), 6);
}
