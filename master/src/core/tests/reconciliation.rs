//! Reconciliation of an agent's full task set.

use super::*;

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
