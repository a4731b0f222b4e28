//! Rolling restart of a whole job (`restart.rs`): batches of the update's size,
//! each withdrawn and killed only after its drain delay, the next started only
//! when the replacements ran their watch; never more than a batch down; refused
//! while an update runs, no rollback; `Event::Restart` stays all at once.

use drover_common::wire::{ActionResponse, UpdateState};

use super::*;

const KEY: &str = "www/prod/web";

fn world() -> (World, Vec<String>) {
    let mut w = World::new();
    for a in ["a1", "a2", "a3"] {
        w.register(a, 8.0, 16, &[]);
    }
    let extra = r#","announce":{"primary_port":"http","drain_delay":"2s"},
        "update":{"batch_size":1,"watch":"3s"}"#;
    let ids = w.create(spec("web", 3, true, extra));
    for id in &ids {
        w.run(id);
    }
    (w, ids)
}

fn endpoints(w: &World) -> Vec<String> {
    w.core
        .service_view("www", "prod", "web")
        .map(|v| v.endpoints.into_iter().map(|e| e.task_id).collect())
        .unwrap_or_default()
}

/// Whether the agent's set asks task `id` to stop.
fn told_to_stop(w: &World, id: &str) -> bool {
    let Some(agent) = w.core.task(id).and_then(|t| t.agent.clone()) else {
        return false;
    };
    w.core.assignment_set(&agent).is_some_and(|s| {
        s.assignments
            .iter()
            .any(|a| a.task.task_id == id && a.desired == DesiredState::Shutdown)
    })
}

fn restart(w: &mut World) -> Result<ActionResponse, CoreError> {
    w.handle(Event::RollingRestart {
        job: KEY.to_string(),
        user: "alice".to_string(),
    })
    .reply
    .map(|r| match r {
        Reply::Action(a) => a,
        r => panic!("{r:?}"),
    })
}

/// Plays agents and executors for `ms`: placed tasks start, tasks told to stop
/// end. After every step: never fewer than 2 of 3 announced, and no stop order
/// reaches an announced task. Returns the most instances ever stopping at once.
fn play(w: &mut World, ms: u64) -> usize {
    let mut most = 0;
    for _ in 0..ms / 250 {
        let ids: Vec<String> = w.core.tasks.keys().cloned().collect();
        for id in &ids {
            let Some(t) = w.core.task(id) else { continue };
            match t.status.state {
                TaskState::Assigned => w.run(id),
                s if s.is_stopping() && told_to_stop(w, id) => {
                    w.report(id, TaskState::Killed, None)
                }
                _ => {}
            }
        }
        w.pass(250);
        let shown = endpoints(w);
        assert!(shown.len() >= 2, "announced: {shown:?}");
        let stopping = w
            .core
            .tasks
            .values()
            .filter(|t| t.status.state.is_stopping())
            .count();
        most = most.max(stopping);
        for id in shown {
            assert!(!told_to_stop(w, &id), "{id} is announced and told to stop");
        }
    }
    most
}

#[test]
fn a_whole_job_restarts_batch_by_batch_each_withdrawn_before_its_kill() {
    let (mut w, old) = world();
    let reply = restart(&mut w).unwrap();
    let id = reply
        .update
        .clone()
        .expect("a rolling restart names its update");
    assert!(reply.tasks.is_empty());
    let v = w.core.update_view(KEY).unwrap();
    assert_eq!(v.id, id);
    assert!(v.events[0].message.contains("rolling restart"), "{v:?}");
    // Batch 1: instance 0 withdrawn now, its kill held for the drain delay.
    assert_eq!(w.state(&old[0]), TaskState::Restarting);
    assert!(!endpoints(&w).contains(&old[0]));
    assert!(!told_to_stop(&w, &old[0]));
    assert_eq!(w.state(&old[1]), TaskState::Running);
    assert_eq!(w.state(&old[2]), TaskState::Running);
    w.advance(1_900);
    assert!(!told_to_stop(&w, &old[0]), "held through the drain delay");
    w.advance(200);
    assert!(told_to_stop(&w, &old[0]));
    // Instance 1 waits for instance 0's replacement to run its watch.
    let most = play(&mut w, 2_000);
    assert_eq!(w.state(&old[1]), TaskState::Running, "not before the watch");
    let most = most.max(play(&mut w, 30_000));
    assert_eq!(most, 1, "one batch (of 1) down at a time");
    let v = w.core.update_view(KEY).unwrap();
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    for (i, old) in old.iter().enumerate() {
        let t = w.core.task(old).unwrap();
        assert_eq!(t.status.state, TaskState::Killed);
        assert_eq!(t.status.exit_reason, Some(ExitReason::Restarted));
        let now = w.core.current_of(KEY, i as u32).unwrap();
        assert_ne!(&now, old);
        assert_eq!(w.state(&now), TaskState::Running);
    }
    assert_eq!(endpoints(&w).len(), 3);
}

#[test]
fn a_rolling_restart_is_refused_while_an_update_runs_and_has_no_rollback() {
    let (mut w, _) = world();
    restart(&mut w).unwrap();
    assert!(matches!(
        restart(&mut w),
        Err(CoreError::UpdateRunning { .. })
    ));
    let back = w.handle(Event::UpdateAction {
        job: KEY.to_string(),
        action: UpdateAction::Rollback,
    });
    let err = back.reply.unwrap_err().to_string();
    assert!(err.contains("no rollback"), "{err}");
    // Aborted, it stops: what was restarted stays, the rest runs on.
    w.handle(Event::UpdateAction {
        job: KEY.to_string(),
        action: UpdateAction::Abort,
    })
    .reply
    .unwrap();
    play(&mut w, 10_000);
    let v = w.core.update_view(KEY).unwrap();
    assert_eq!(v.state, UpdateState::Aborted);
    assert_eq!(endpoints(&w).len(), 3);
}

#[test]
fn a_failed_replacement_fails_the_restart_without_rolling_back() {
    let (mut w, _) = world();
    restart(&mut w).unwrap();
    // Instance 0's replacement fails at once, every time.
    for _ in 0..40 {
        let now = w.core.current_of(KEY, 0).unwrap();
        match w.state(&now) {
            TaskState::Assigned => {
                w.run(&now);
                w.report(
                    &now,
                    TaskState::Failed,
                    Some(ExitReason::ExitCode { code: 1 }),
                );
            }
            s if s.is_stopping() => w.report(&now, TaskState::Killed, None),
            _ => {}
        }
        let ids: Vec<String> = w.core.tasks.keys().cloned().collect();
        for id in ids {
            if w.core
                .task(&id)
                .is_some_and(|t| t.status.state.is_stopping())
                && told_to_stop(&w, &id)
            {
                w.report(&id, TaskState::Killed, None);
            }
        }
        w.pass(2_000);
        if w.core.update_view(KEY).unwrap().state.is_terminal() {
            break;
        }
    }
    let v = w.core.update_view(KEY).unwrap();
    assert_eq!(v.state, UpdateState::Failed, "{v:#?}");
    assert!(!v.settings.rollback_on_failure);
    // Instances 1 and 2 were never touched.
    assert_eq!(w.core.update_view(KEY).unwrap().batch, 1);
}

#[test]
fn an_empty_job_has_nothing_to_restart() {
    let (mut w, _) = world();
    w.handle(Event::Kill {
        job: KEY.to_string(),
        instances: None,
    })
    .reply
    .unwrap();
    play(&mut w, 0);
    let ids: Vec<String> = w.core.tasks.keys().cloned().collect();
    w.pass(3_000);
    for id in ids {
        if w.core
            .task(&id)
            .is_some_and(|t| t.status.state.is_stopping())
        {
            w.report(&id, TaskState::Killed, None);
        }
    }
    let reply = restart(&mut w).unwrap();
    assert_eq!(reply.update, None);
    assert!(w.core.update_view(KEY).is_none());
}

#[test]
fn a_restarted_master_goes_on_with_the_rolling_restart() {
    let (mut w, old) = world();
    restart(&mut w).unwrap();
    play(&mut w, 3_000);
    assert_eq!(w.state(&old[1]), TaskState::Running, "batch 2 not begun");
    // Rebuild from what was persisted, as the store would load it.
    let snap = w.snapshot();
    let wall = w.at().wall + 1_000;
    w.now = 50_000;
    w.wall_skew = wall as i64 - 50_000;
    w.core = Core::load(cfg(), snap, w.at(), 9);
    let v = w.core.update_view(KEY).unwrap();
    assert_eq!(v.state, UpdateState::RollingForward);
    // Heartbeats bring the agents back; the restart goes on and ends.
    play(&mut w, 40_000);
    let v = w.core.update_view(KEY).unwrap();
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    for (i, old) in old.iter().enumerate() {
        let now = w.core.current_of(KEY, i as u32).unwrap();
        assert_ne!(&now, old, "instance {i} restarted, not skipped");
    }
}
