//! Job creation, kill, restart and re-creation of a job key.

use super::*;

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
    let agent = w.core.task(&t[0]).unwrap().agent.clone().unwrap();
    let set = w.core.assignment_set(&agent).unwrap();
    let old = set
        .assignments
        .iter()
        .find(|a| a.task.task_id == t[0])
        .unwrap();
    assert_eq!(old.kill_reason, Some(ExitReason::Restarted));
    w.report(&t[0], TaskState::Killed, None);
    assert_eq!(w.state(&t[0]), TaskState::Killed);
    let reason = w.core.task(&t[0]).unwrap().status.exit_reason.clone();
    assert_eq!(reason, Some(ExitReason::Restarted));
    assert_eq!(
        reason.unwrap().to_string(),
        "restarted by request (replaced)",
        "the replaced task says it was restarted, not killed"
    );
    assert_eq!(
        w.current("www/prod/r", 0),
        a.tasks[0],
        "no second replacement"
    );
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
