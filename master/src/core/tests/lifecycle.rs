//! The task lifecycle: status reports, replacement, throttling, history, LOST by timeout.

use super::*;

#[test]
fn a_service_task_that_ran_long_enough_is_replaced_at_once_with_history_kept() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("hello", 1, true, ""));
    w.run(&t[0]);
    assert_eq!(w.state(&t[0]), TaskState::Running);
    w.pass(20_000);
    w.heartbeat("a1", None);
    w.report(
        &t[0],
        TaskState::Failed,
        Some(ExitReason::ExitCode { code: 1 }),
    );
    assert_eq!(w.state(&t[0]), TaskState::Failed);
    let next = w.current(JOB, 0);
    assert_ne!(next, t[0]);
    assert_eq!(w.state(&next), TaskState::Assigned);
    let view = w.core.job_view(JOB).unwrap();
    assert_eq!(view.instances[0].history[0].task_id, t[0]);
    assert_eq!(
        view.instances[0].history[0].exit_reason,
        Some(ExitReason::ExitCode { code: 1 })
    );
}

#[test]
fn a_flapping_task_waits_throttled_with_a_doubling_penalty() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("flap", 1, true, ""));
    w.run(&t[0]);
    w.report(&t[0], TaskState::Failed, None);
    let second = w.current(JOB.replace("hello", "flap").as_str(), 0);
    let job = "www/prod/flap";
    assert_eq!(w.state(&second), TaskState::Throttled);
    let until = w.core.task(&second).unwrap().throttle_until.unwrap();
    assert_eq!(until - w.now, 1_000);
    w.advance(999);
    assert_eq!(w.state(&second), TaskState::Throttled);
    w.advance(1);
    assert_eq!(w.state(&second), TaskState::Assigned);
    w.run(&second);
    w.report(&second, TaskState::Failed, None);
    let third = w.current(job, 0);
    assert_eq!(
        w.core.task(&third).unwrap().throttle_until.unwrap() - w.now,
        2_000
    );
    let events: Vec<TaskState> = w
        .core
        .task(&second)
        .unwrap()
        .status
        .events
        .iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(
        events,
        [
            TaskState::Throttled,
            TaskState::Pending,
            TaskState::Assigned,
            TaskState::Starting,
            TaskState::Running,
            TaskState::Failed
        ]
    );
}

#[test]
fn batch_jobs_finish_once_and_retry_failures_up_to_the_limit() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("batch", 2, false, r#","max_task_failures":2"#));
    let job = "www/prod/batch";
    w.run(&t[0]);
    w.report(
        &t[0],
        TaskState::Finished,
        Some(ExitReason::ExitCode { code: 0 }),
    );
    assert_eq!(w.current(job, 0), t[0], "a finished batch instance is done");
    w.run(&t[1]);
    w.pass(20_000);
    w.report(&t[1], TaskState::Failed, None);
    let retry = w.current(job, 1);
    assert_ne!(retry, t[1]);
    w.run(&retry);
    w.pass(20_000);
    w.report(&retry, TaskState::Failed, None);
    assert_eq!(
        w.current(job, 1),
        retry,
        "two failures reach max_task_failures"
    );
}

#[test]
fn a_task_stuck_in_assigned_becomes_lost_and_is_replaced() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("stuck", 1, false, ""));
    for _ in 0..10 {
        w.advance(2_000);
        w.heartbeat("a1", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    assert_eq!(
        w.core.task(&t[0]).unwrap().status.exit_reason,
        Some(ExitReason::TransientStateTimeout {
            state: TaskState::Assigned
        })
    );
    assert_ne!(w.current("www/prod/stuck", 0), t[0]);
}

#[test]
fn repeated_and_stale_updates_change_nothing() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("idem", 1, false, ""));
    w.run(&t[0]);
    let before = w.core.task(&t[0]).unwrap().clone();
    let stale = StatusUpdate {
        task_id: t[0].clone(),
        seq: 1,
        state: TaskState::Finished,
        exit_reason: None,
        message: String::new(),
        timestamp_ms: 0,
        processes: Vec::new(),
        processes_omitted: None,
    };
    let out = w.handle(Event::StatusReports {
        agent: "a1".to_string(),
        reports: vec![stale.clone(), stale],
    });
    assert!(matches!(out.reply, Ok(Reply::Ack(ref a)) if a.acked == vec![(t[0].clone(), 1)]));
    assert_eq!(w.core.task(&t[0]).unwrap(), &before);
    // A backwards state with a new seq is ignored too.
    w.report(&t[0], TaskState::Starting, None);
    assert_eq!(w.state(&t[0]), TaskState::Running);
}

#[test]
fn terminal_history_is_pruned_beyond_the_limit_from_the_store_too() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("p", 1, true, ""));
    let mut first = t[0].clone();
    let mut all = vec![first.clone()];
    for _ in 0..6 {
        w.run(&first);
        w.pass(20_000);
        w.report(&first, TaskState::Failed, None);
        first = w.current("www/prod/p", 0);
        all.push(first.clone());
    }
    let view = w.core.job_view("www/prod/p").unwrap();
    assert_eq!(view.instances[0].history.len(), 3);
    assert!(w.core.task(&all[0]).is_none());
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::DeleteTask(id) if *id == all[0])));
}

#[test]
fn an_executor_lost_loop_is_throttled_but_an_agent_loss_is_replaced_at_once() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("el", 1, true, ""));
    w.report(&t[0], TaskState::Lost, Some(ExitReason::ExecutorLost));
    let next = w.current("www/prod/el", 0);
    assert_eq!(w.state(&next), TaskState::Throttled);

    let t = w.create(spec("al", 1, true, ""));
    w.run(&t[0]);
    w.register("a2", 8.0, 16, &[]);
    for _ in 0..10 {
        w.advance(500);
        w.heartbeat("a2", None);
    }
    assert_eq!(w.state(&t[0]), TaskState::Lost);
    let next = w.current("www/prod/al", 0);
    assert_eq!(
        w.state(&next),
        TaskState::Assigned,
        "no penalty for a lost agent"
    );
}

#[test]
fn a_task_its_agent_reported_ending_leaves_the_set_without_waking_the_agent() {
    let mut w = World::new();
    w.register("a1", 4.0, 8, &[]);
    let t = w.create(spec("once", 2, false, ""));
    w.run(&t[0]);
    w.run(&t[1]);
    // The first heartbeat after registering carries the full set.
    w.heartbeat("a1", Some(vec![t[0].as_str(), t[1].as_str()]));
    let (before, _) = w.core.agent_version("a1").unwrap();
    let notified = w.core.agent_notified_version("a1").unwrap();
    assert_eq!(before, notified);
    let agent = "a1".to_string();
    let out = w.handle(Event::StatusReports {
        agent: agent.clone(),
        reports: vec![StatusUpdate {
            task_id: t[0].clone(),
            seq: 3,
            state: TaskState::Finished,
            exit_reason: None,
            message: String::new(),
            timestamp_ms: w.now,
            processes: Vec::new(),
            processes_omitted: None,
        }],
    });
    assert!(!out
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Notify { .. })));
    let (after, seq) = w.core.agent_version("a1").unwrap();
    assert!(after > before, "the set changed, so its version did");
    assert_eq!(seq, w.core.seq(), "served only once committed");
    assert_eq!(w.core.agent_notified_version("a1"), Some(notified));
    assert_eq!(w.core.assignment_set("a1").unwrap().assignments.len(), 1);
    // An agent still at the notified version is checked against its digest: one
    // that agrees (it dropped the ended task too) is not asked for its full set.
    let request = HeartbeatRequest {
        task_digest: wire::task_set_digest([t[1].as_str()]),
        assignments_version: notified,
        tasks: None,
    };
    let Reply::Heartbeat(r) = w
        .handle(Event::Heartbeat {
            agent: agent.clone(),
            request,
        })
        .reply
        .unwrap()
    else {
        panic!()
    };
    assert!(!r.send_full_task_set);
    let request = HeartbeatRequest {
        task_digest: wire::task_set_digest(["someone-else"]),
        assignments_version: notified,
        tasks: None,
    };
    let Reply::Heartbeat(r) = w.handle(Event::Heartbeat { agent, request }).reply.unwrap() else {
        panic!()
    };
    assert!(r.send_full_task_set, "a real mismatch is still found");
    // A kill the master decides wakes the agent as before.
    let out = w.handle(Event::Kill {
        job: "www/prod/once".to_string(),
        instances: None,
    });
    assert!(out
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Notify { agent } if agent == "a1")));
}

#[test]
fn an_exclusive_task_lost_stuck_in_assigned_is_replaced_after_the_lease_and_kill_time() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let ex = r#","partition_policy":{"exclusive":true}"#;
    let t = w.create(spec("ex", 1, true, ex))[0].clone();
    w.pass(500);
    assert_eq!(w.state(&t), TaskState::Assigned);
    // a1 heartbeats but reports no start: LOST at the transient timeout (20 s).
    w.pass(20_000);
    assert_eq!(w.state(&t), TaskState::Lost);
    let new = w.current("www/prod/ex", 0);
    assert_ne!(new, t);
    // a1 may have started the old copy at the last moment: the replacement waits
    // the lease and kill time (2 s + 35 s) for a1 to kill it, not the 1 s
    // flapping penalty.
    w.pass(36_000);
    assert_eq!(w.state(&new), TaskState::Throttled);
    w.pass(2_000);
    assert_eq!(w.state(&new), TaskState::Assigned);
}
