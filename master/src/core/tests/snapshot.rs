//! A master restarted from its stored state.

use super::*;

#[test]
fn after_a_master_restart_nothing_is_replaced_before_the_grace() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("g", 1, true, ""));
    w.run(&t[0]);
    // A second agent that comes back keeps the eviction guard out of it (one of two
    // agents lost is not more than half the fleet).
    w.register("a2", 8.0, 16, &[]);
    let snap = w.snapshot();
    let start = w.now + 60_000;
    w.now = start;
    w.core = Core::load(cfg(), snap, w.at(), 9);
    assert_eq!(w.state(&t[0]), TaskState::Running);
    assert!(w.core.reconciling());
    for _ in 0..10 {
        w.advance(500);
        w.heartbeat("a2", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Running, "inside the grace");
    assert!(w.core.reconciling(), "a1 never reported its task");
    for _ in 0..3 {
        w.advance(500);
        w.heartbeat("a2", None);
    }
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
        ..Snapshot::default()
    };
    w.core = Core::load(cfg(), snap, w.at(), 3);
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
