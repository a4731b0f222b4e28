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

#[test]
fn a_restart_of_an_exclusive_task_on_a_lost_host_replaces_it_only_once_it_ended() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let ex = r#","partition_policy":{"exclusive":true}"#;
    let restarted = w.create(spec("ex", 1, true, ex))[0].clone();
    let killed = w.create(spec("gone", 1, true, ex))[0].clone();
    w.run(&restarted);
    w.run(&killed);
    w.register("a2", 8.0, 16, &[]);
    // a1 goes silent past the agent timeout (3 s): the master cannot reach it.
    only_heartbeating(&mut w, &["a2"], 4_000);
    for job in ["www/prod/ex", "www/prod/gone"] {
        w.handle(Event::Restart {
            job: job.to_string(),
            instances: None,
        })
        .reply
        .unwrap();
    }
    for (id, job) in [(&restarted, "www/prod/ex"), (&killed, "www/prod/gone")] {
        assert_eq!(w.state(id), TaskState::Restarting);
        assert_eq!(
            &w.current(job, 0),
            id,
            "{job} replaced beside a copy the master cannot stop"
        );
    }
    // A kill overrides the restart that waits: that instance is not replaced.
    w.handle(Event::Kill {
        job: "www/prod/gone".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    // The partition policy ends them after the lease and kill time (2 s + 35 s
    // after a1's last heartbeat); the restart's replacement comes then.
    only_heartbeating(&mut w, &["a2"], 30_000);
    assert_eq!(w.state(&restarted), TaskState::Restarting);
    assert_eq!(w.current("www/prod/ex", 0), restarted);
    only_heartbeating(&mut w, &["a2"], 6_000);
    let t = w.core.task(&restarted).unwrap();
    assert_eq!(t.status.state, TaskState::Killed);
    assert_eq!(t.status.exit_reason, Some(ExitReason::Restarted));
    let new = w.current("www/prod/ex", 0);
    assert_ne!(new, restarted);
    assert_eq!(w.core.task(&new).unwrap().agent.as_deref(), Some("a2"));
    let t = w.core.task(&killed).unwrap();
    assert_eq!(t.status.state, TaskState::Killed);
    assert_eq!(t.status.exit_reason, Some(ExitReason::KilledByRequest));
    assert_eq!(
        w.current("www/prod/gone", 0),
        killed,
        "a killed instance came back"
    );
}

#[test]
fn a_restart_waiting_for_a_lost_host_is_replaced_when_its_agent_reports_the_end() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let ex = r#","partition_policy":{"exclusive":true,"reschedule":false}"#;
    let old = w.create(spec("ex", 1, true, ex))[0].clone();
    w.run(&old);
    only_heartbeating(&mut w, &[], 4_000);
    w.handle(Event::Restart {
        job: "www/prod/ex".to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    // `reschedule: false`: nothing ends it while a1 is away.
    only_heartbeating(&mut w, &[], 60_000);
    assert_eq!(w.state(&old), TaskState::Restarting);
    assert_eq!(w.current("www/prod/ex", 0), old);
    // a1 is back and reports the kill: the replacement is made now.
    w.heartbeat("a1", Some(vec![old.as_str()]));
    w.report(&old, TaskState::Killed, None);
    assert_eq!(w.state(&old), TaskState::Killed);
    assert_ne!(w.current("www/prod/ex", 0), old);
}
