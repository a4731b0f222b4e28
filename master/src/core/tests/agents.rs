//! Agents: registration, silence, partition policies.

use super::*;

#[test]
fn a_silent_agent_s_tasks_are_lost_and_replaced_elsewhere_and_killed_when_it_returns() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("svc", 1, true, ""));
    w.run(&t[0]);
    w.register("a2", 8.0, 16, &[]);
    for _ in 0..10 {
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
