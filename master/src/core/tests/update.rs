//! Rolling updates in the pure core: batches gated on the watch time, canaries,
//! count changes, the seed-001 reverse-order rollback, operator actions, a master
//! restart mid-update, and property tests of the engine's guarantees.

use drover_common::configs::config_hash;
use drover_common::wire::{InstanceUpdateState, MaintenanceMode, UpdateState, UpdateView};

use std::collections::BTreeSet;

use super::*;

const KEY: &str = "www/prod/web";

/// A service whose process is `cmd`; `false` stands for a config that fails at once.
fn web(instances: u32, cmd: &str, batch: u32, extra: &str) -> JobSpec {
    let text = format!(
        r#"{{"role":"www","environment":"prod","name":"web","instances":{instances},
        "service":true,
        "task":{{"processes":[{{"name":"main","cmdline":"{cmd}"}}],
                "resources":{{"cpu":0.5,"ram":"64MiB","disk":"64MiB","ports":["http"]}}}},
        "update":{{"batch_size":{batch},"watch":"2s"{extra}}}}}"#
    );
    serde_json::from_str(&text).unwrap()
}

fn world(agents: usize) -> World {
    let mut w = World::new();
    for i in 0..agents {
        w.register(&format!("a{i}"), 8.0, 16, &[]);
    }
    w
}

/// Plays every agent and executor: placed tasks start (and those whose config runs
/// `false` fail right after RUNNING), stopping tasks end. Returns after `ms`.
fn play(w: &mut World, ms: u64) {
    play_failing(w, ms, &|_| false);
}

/// `play`, where tasks for which `fails` says so also fail right after RUNNING.
fn play_failing(w: &mut World, ms: u64, fails: &dyn Fn(&Task) -> bool) {
    let mut left = ms;
    while left > 0 {
        let ids: Vec<String> = w.core.tasks.keys().cloned().collect();
        for id in ids {
            let Some(t) = w.core.task(&id) else { continue };
            let bad = fails(t)
                || w.core.jobs[&t.job].spec_of(&t.config).task.processes[0].cmdline == "false";
            match t.status.state {
                TaskState::Assigned => {
                    w.run(&id);
                    if bad {
                        w.report(
                            &id,
                            TaskState::Failed,
                            Some(ExitReason::ExitCode { code: 1 }),
                        );
                    }
                }
                TaskState::Killing | TaskState::Restarting | TaskState::Draining => {
                    w.report(&id, TaskState::Killed, None);
                }
                _ => {}
            }
        }
        let step = left.min(250);
        w.pass(step);
        left -= step;
    }
}

fn update(
    w: &mut World,
    spec: JobSpec,
    instances: Option<Vec<u32>>,
) -> Result<UpdateView, CoreError> {
    let job = spec.key().to_string();
    w.handle(Event::StartUpdate {
        job,
        spec: Box::new(spec),
        instances,
        user: "alice".to_string(),
    })
    .reply
    .map(|r| match r {
        Reply::Update(v) => *v,
        r => panic!("{r:?}"),
    })
}

fn view(w: &World) -> UpdateView {
    w.core.update_view(KEY).unwrap()
}

/// Plays until the update ends (or panics after `limit_ms`).
fn until_done(w: &mut World, limit_ms: u64) -> UpdateView {
    let mut waited = 0;
    while !view(w).state.is_terminal() {
        assert!(waited < limit_ms, "update did not end: {:#?}", view(w));
        play(w, 250);
        waited += 250;
    }
    view(w)
}

fn configs(w: &World) -> Vec<String> {
    w.core.instance_configs(KEY)
}

fn running(w: &World) -> usize {
    w.core.jobs[KEY]
        .slots
        .iter()
        .filter(|s| {
            s.current
                .as_ref()
                .is_some_and(|id| w.state(id) == TaskState::Running)
        })
        .count()
}

fn batches(v: &UpdateView, prefix: &str) -> Vec<String> {
    v.events
        .iter()
        .filter_map(|e| e.message.strip_prefix(prefix).map(str::to_string))
        .collect()
}

#[test]
fn an_update_rolls_forward_batch_by_batch_keeping_the_rest_running() {
    let mut w = world(12);
    w.create(web(9, "sleep 100", 3, ""));
    play(&mut w, 1_000);
    assert_eq!(running(&w), 9);
    let old = config_hash(&web(9, "sleep 100", 3, ""));
    let new_spec = web(9, "sleep 200", 3, "");
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    let mut waited = 0;
    while !view(&w).state.is_terminal() {
        assert!(running(&w) >= 6, "at most a batch is down: {}", running(&w));
        assert!(
            view(&w)
                .instances
                .iter()
                .filter(|p| p.state == InstanceUpdateState::Updating)
                .count()
                <= 3
        );
        play(&mut w, 250);
        waited += 250;
        assert!(waited < 60_000);
    }
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert_eq!(
        batches(&v, "batch: instances "),
        ["0,1,2", "3,4,5", "6,7,8"]
    );
    assert!(configs(&w).iter().all(|c| *c == new));
    assert_ne!(old, new);
    // The replaced tasks ended KILLED, reason updated, kept in history, not flapping.
    let slot = &w.core.jobs[KEY].slots[4];
    let first = w.core.task(&slot.history[0]).unwrap();
    assert_eq!(first.status.state, TaskState::Killed);
    assert_eq!(first.status.exit_reason, Some(ExitReason::Updated));
    let now = w.core.task(slot.current.as_ref().unwrap()).unwrap();
    assert_eq!((now.flaps, now.throttle_until), (0, None));
}

#[test]
fn a_failing_config_rolls_back_in_reverse_order_from_the_point_of_failure() {
    let mut w = world(12);
    w.create(web(9, "sleep 100", 3, ""));
    play(&mut w, 1_000);
    let old = configs(&w)[0].clone();
    // Instances 0-5 move to `good` first, so the job runs two configs.
    let good = web(9, "sleep 300", 3, "");
    update(&mut w, good.clone(), Some((0..6).collect())).unwrap();
    until_done(&mut w, 60_000);
    // Then every instance to a config that fails at once: the first batch fails
    // and goes back, each instance to the config it had.
    let bad = web(9, "false", 3, "");
    update(&mut w, bad, None).unwrap();
    let v = until_done(&mut w, 120_000);
    assert_eq!(v.state, UpdateState::RolledBack, "{v:#?}");
    assert_eq!(batches(&v, "batch: instances "), ["0,1,2"]);
    assert_eq!(batches(&v, "rollback batch: instances "), ["2,1,0"]);
    let cs = configs(&w);
    let good_hash = config_hash(&good);
    assert!(cs[..6].iter().all(|c| *c == good_hash), "{cs:?}");
    assert!(cs[6..].iter().all(|c| *c == old), "{cs:?}");
}

#[test]
fn seed_001_batches_0_1_2_then_3_4_5_then_6_7_8_fail_roll_back_8_7_6_5_4_3_2_1_0() {
    let mut w = world(12);
    w.create(web(9, "sleep 100", 3, ""));
    play(&mut w, 1_000);
    let old = configs(&w);
    // A config that is healthy on instances 0-5 and fails on 6-8: the driver below
    // fails tasks of instance >= 6 on the new config.
    let new_spec = web(9, "sleep 200", 3, "");
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    let mut waited = 0;
    while !view(&w).state.is_terminal() {
        play_failing(&mut w, 250, &|t| t.instance >= 6 && t.config == new);
        waited += 250;
        assert!(waited < 120_000, "{:#?}", view(&w));
    }
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RolledBack, "{v:#?}");
    assert_eq!(
        batches(&v, "batch: instances "),
        ["0,1,2", "3,4,5", "6,7,8"]
    );
    assert_eq!(
        batches(&v, "rollback batch: instances "),
        ["8,7,6", "5,4,3", "2,1,0"]
    );
    // Each batch was reported once as it started, for the metrics.
    use UpdateDirection::{Forward, Rollback};
    assert_eq!(
        w.update_batches,
        [
            (Forward, 3),
            (Forward, 3),
            (Forward, 3),
            (Rollback, 3),
            (Rollback, 3),
            (Rollback, 3)
        ]
    );
    assert_eq!(configs(&w), old, "every instance back on the config it had");
    assert_eq!(w.core.jobs[KEY].config, old[0]);
}

#[test]
fn a_canary_updates_instance_0_only_and_replacements_keep_their_config() {
    let mut w = world(6);
    w.create(web(4, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    let old = configs(&w)[1].clone();
    let canary = web(4, "sleep 200", 1, "");
    let new = config_hash(&canary);
    let v = update(&mut w, canary, Some(vec![0])).unwrap();
    assert_eq!(v.instances.len(), 1);
    assert_eq!(until_done(&mut w, 30_000).state, UpdateState::RolledForward);
    assert_eq!(
        configs(&w),
        [new.clone(), old.clone(), old.clone(), old.clone()]
    );
    // Instance 3 dies: its replacement runs the old config (seed 001).
    let t3 = w.current(KEY, 3);
    w.report(
        &t3,
        TaskState::Failed,
        Some(ExitReason::ExitCode { code: 1 }),
    );
    assert_eq!(w.core.task(&w.current(KEY, 3)).unwrap().config, old);
    let job = w.core.job_view(KEY).unwrap();
    assert_eq!(job.configs.len(), 2);
    assert_eq!(job.instances[0].config.as_deref(), Some(new.as_str()));
}

#[test]
fn instance_counts_go_3_to_5_to_2() {
    let mut w = world(8);
    w.create(web(3, "sleep 100", 2, ""));
    play(&mut w, 1_000);
    update(&mut w, web(5, "sleep 100", 2, ""), None).unwrap();
    let v = until_done(&mut w, 30_000);
    assert_eq!(v.state, UpdateState::RolledForward);
    assert_eq!(
        v.instances.iter().map(|p| p.instance).collect::<Vec<_>>(),
        [3, 4]
    );
    assert_eq!(running(&w), 5);
    let before = w.current(KEY, 0);
    update(&mut w, web(2, "sleep 100", 2, ""), None).unwrap();
    let v = until_done(&mut w, 30_000);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert_eq!(w.core.jobs[KEY].slots.len(), 2);
    assert_eq!(w.core.jobs[KEY].spec.instances, 2);
    assert_eq!(
        w.current(KEY, 0),
        before,
        "unchanged instances are not touched"
    );
    assert_eq!(w.core.job_view(KEY).unwrap().instances.len(), 2);
}

#[test]
fn one_update_per_job_and_the_operator_pauses_resumes_and_aborts() {
    let mut w = world(6);
    w.create(web(4, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    let first = update(&mut w, web(4, "sleep 200", 1, ""), None).unwrap();
    let err = update(&mut w, web(4, "sleep 300", 1, ""), None).unwrap_err();
    assert!(
        matches!(&err, CoreError::UpdateRunning { id, .. } if *id == first.id),
        "{err}"
    );
    let act = |w: &mut World, action| {
        w.handle(Event::UpdateAction {
            job: KEY.to_string(),
            action,
        })
        .reply
    };
    act(&mut w, UpdateAction::Pause).unwrap();
    play(&mut w, 10_000);
    let v = view(&w);
    assert_eq!(v.state, UpdateState::Paused);
    let updated = |v: &UpdateView| {
        v.instances
            .iter()
            .filter(|p| p.state == InstanceUpdateState::Updated)
            .count()
    };
    assert_eq!(
        updated(&v),
        1,
        "the batch in flight finished, no new one started"
    );
    act(&mut w, UpdateAction::Resume).unwrap();
    play(&mut w, 2_500);
    assert!(updated(&view(&w)) >= 2);
    act(&mut w, UpdateAction::Abort).unwrap();
    assert_eq!(view(&w).state, UpdateState::Aborted);
    assert!(act(&mut w, UpdateAction::Resume).is_err());
    // A new update may start now.
    update(&mut w, web(4, "sleep 300", 1, ""), None).unwrap();
    act(&mut w, UpdateAction::Rollback).unwrap();
    assert_eq!(until_done(&mut w, 30_000).state, UpdateState::RolledBack);
}

#[test]
fn a_restarted_master_finishes_the_update() {
    let mut w = world(6);
    w.create(web(4, "sleep 100", 2, ""));
    play(&mut w, 1_000);
    let new_spec = web(4, "sleep 200", 2, "");
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    play(&mut w, 1_000);
    assert_eq!(view(&w).state, UpdateState::RollingForward);
    // Rebuild from what was persisted, as the store would load it.
    let snap = w.snapshot();
    // The new process's monotonic clock starts elsewhere (here: far lower); the
    // wall clock went on 3 s while the master was down.
    let wall = w.at().wall + 3_000;
    w.now = 50_000;
    w.wall_skew = wall as i64 - 50_000;
    w.core = Core::load(cfg(), snap, w.at(), 9);
    assert_eq!(view(&w).state, UpdateState::RollingForward);
    let v = until_done(&mut w, 60_000);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert!(configs(&w).iter().all(|c| *c == new));
}

/// Watches run on the monotonic clock: a wall clock step forward does not end a
/// watch early, a step back does not stretch it; events carry the wall clock.
#[test]
fn wall_clock_steps_neither_shorten_nor_stretch_a_watch() {
    let mut w = world(3);
    w.create(web(2, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    update(&mut w, web(2, "sleep 200", 1, ""), None).unwrap();
    play(&mut w, 250); // instance 0's new task RUNNING; its 2 s watch begins
    let state_of = |w: &World, i: usize| view(w).instances[i].state;
    assert_eq!(state_of(&w, 0), InstanceUpdateState::Updating);
    w.wall_skew += 3_600_000;
    play(&mut w, 1_000);
    assert_eq!(
        state_of(&w, 0),
        InstanceUpdateState::Updating,
        "an hour's wall clock step forward does not end a 2 s watch"
    );
    w.wall_skew -= 7_200_000;
    play(&mut w, 1_500);
    assert_eq!(
        state_of(&w, 0),
        InstanceUpdateState::Updated,
        "a step back does not stretch it"
    );
    let last = view(&w).events.last().unwrap().at_ms;
    assert!(
        last.abs_diff(w.at().wall) < 5_000,
        "events on the wall clock"
    );
    assert_eq!(until_done(&mut w, 30_000).state, UpdateState::RolledForward);
}

/// A drain during an update: the tasks it takes (new config or old) are a
/// disruption, not a failure of the new config; the update rolls forward with no
/// failure counted (it allows none), and the drained host ends up empty.
#[test]
fn tasks_a_drain_takes_during_an_update_are_no_update_failures() {
    let mut w = world(8); // one instance per host
    w.create(web(6, "sleep 100", 2, ""));
    play(&mut w, 1_000);
    let new_spec = web(6, "sleep 200", 2, "");
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    // Batch (0,1) RUNNING on the new config, being watched.
    for _ in 0..20 {
        if w.state(&w.current(KEY, 0)) == TaskState::Running {
            break;
        }
        play(&mut w, 250);
    }
    let watched = w.current(KEY, 0);
    assert_eq!(w.state(&watched), TaskState::Running);
    assert_eq!(view(&w).instances[0].state, InstanceUpdateState::Updating);
    let host = w.core.task(&watched).unwrap().agent.clone().unwrap();
    w.handle(Event::Maintenance {
        op: MaintenanceOp::Drain { deadline_ms: None },
        hosts: vec![host.clone()],
    })
    .reply
    .unwrap();
    let v = until_done(&mut w, 60_000);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert!(
        v.instances.iter().all(|p| p.failures == 0),
        "no failure counted: {v:#?}"
    );
    assert!(!v.events.iter().any(|e| e.message.contains("failure")));
    assert!(configs(&w).iter().all(|c| *c == new));
    let drained: Vec<&Box<Task>> = w
        .core
        .tasks
        .values()
        .filter(|t| t.status.exit_reason == Some(ExitReason::Drained))
        .collect();
    assert!(
        !drained.is_empty(),
        "the drain took tasks during the update"
    );
    assert_eq!(w.state(&watched), TaskState::Killed);
    let on_host = w.core.agents[w.core.agent_idx[&host] as usize].tasks.len();
    assert_eq!(on_host, 0, "the drained host is empty");
}

/// Instances of the job whose current task is not RUNNING (down or on the way).
fn down(w: &World) -> usize {
    w.core.jobs[KEY].slots.len() - running(w)
}

/// A drain and an update together: the update's batches count the instances a
/// drain has down, and the drain counts the batch in flight, so the job never has
/// more than `batch_size` instances down at once, wherever the two meet.
#[test]
fn a_drain_and_an_update_together_never_take_more_than_a_batch_down() {
    let mut w = world(12);
    w.create(web(
        9,
        "sleep 100",
        3,
        r#"},"constraints":{"host":"limit:1""#,
    ));
    play(&mut w, 1_000);
    assert_eq!(running(&w), 9);
    let host_of = |w: &World, i: u32| {
        w.core
            .task(&w.current(KEY, i))
            .unwrap()
            .agent
            .clone()
            .unwrap()
    };
    // A drain first: instance 4's task is taken (the default policy lets one go).
    let h4 = host_of(&w, 4);
    w.handle(Event::Maintenance {
        op: MaintenanceOp::Drain { deadline_ms: None },
        hosts: vec![h4.clone()],
    })
    .reply
    .unwrap();
    assert_eq!(down(&w), 1, "the drain took instance 4");
    // The update's first batch counts it: two instances, not three.
    let new_spec = web(9, "sleep 200", 3, r#"},"constraints":{"host":"limit:1""#);
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    let v = view(&w);
    assert_eq!(batches(&v, "batch: instances "), vec!["0,1"], "{v:#?}");
    assert!(down(&w) <= 3, "{} down", down(&w));
    // While batches run, drain two more hosts carrying later instances.
    let (h6, h8) = (host_of(&w, 6), host_of(&w, 8));
    let mut drained_more = false;
    let mut most = 0;
    for _ in 0..400 {
        if view(&w).state.is_terminal() {
            break;
        }
        play(&mut w, 250);
        most = most.max(down(&w));
        assert!(
            down(&w) <= 3,
            "{} instances down: {:#?}",
            down(&w),
            view(&w)
        );
        if !drained_more && view(&w).batch == 2 {
            w.handle(Event::Maintenance {
                op: MaintenanceOp::Drain { deadline_ms: None },
                hosts: vec![h6.clone(), h8.clone()],
            })
            .reply
            .unwrap();
            drained_more = true;
            assert!(down(&w) <= 3, "{} instances down after the drain", down(&w));
        }
    }
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert!(drained_more);
    assert_eq!(most, 3, "batches ran full when nothing else was down");
    assert!(configs(&w).iter().all(|c| *c == new));
    assert!(v.instances.iter().all(|p| p.failures == 0), "{v:#?}");
    for h in [&h4, &h6, &h8] {
        let a = &w.core.agents[w.core.agent_idx[h] as usize];
        assert_eq!(a.rec.maintenance.mode, MaintenanceMode::Drained, "{h}");
    }
}

/// While a drain has as many instances down as the batch size, the next batch
/// waits and says why; it starts once the replacements run.
#[test]
fn an_update_waits_while_a_drain_has_a_whole_batch_down() {
    let mut w = world(8);
    let mut spec = web(4, "sleep 100", 1, r#"},"constraints":{"host":"limit:1""#);
    spec.sla_policy = None;
    w.create(spec);
    play(&mut w, 1_000);
    let host = w
        .core
        .task(&w.current(KEY, 3))
        .unwrap()
        .agent
        .clone()
        .unwrap();
    w.handle(Event::Maintenance {
        op: MaintenanceOp::Drain { deadline_ms: None },
        hosts: vec![host],
    })
    .reply
    .unwrap();
    update(
        &mut w,
        web(4, "sleep 200", 1, r#"},"constraints":{"host":"limit:1""#),
        None,
    )
    .unwrap();
    let v = view(&w);
    assert!(batches(&v, "batch: instances ").is_empty(), "{v:#?}");
    let why = v.waiting.clone().unwrap_or_default();
    assert!(why.contains("down by a host drain"), "{why}");
    assert_eq!(v.state, UpdateState::RollingForward);
    let v = until_done(&mut w, 60_000);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert_eq!(batches(&v, "batch: instances "), vec!["0", "1", "2", "3"]);
    assert_eq!(v.waiting, None);
}

/// `play`, but agent `silent` neither heartbeats nor acts on its tasks (cut off).
fn play_without(w: &mut World, ms: u64, silent: &str) {
    let mut left = ms;
    while left > 0 {
        let ids: Vec<String> = w.core.tasks.keys().cloned().collect();
        for id in ids {
            let Some(t) = w.core.task(&id) else { continue };
            if t.agent.as_deref() == Some(silent) {
                continue;
            }
            match t.status.state {
                TaskState::Assigned => w.run(&id),
                TaskState::Killing | TaskState::Restarting | TaskState::Draining => {
                    w.report(&id, TaskState::Killed, None);
                }
                _ => {}
            }
        }
        let step = left.min(250);
        w.advance(step);
        left -= step;
        let ids: Vec<String> = w.core.agents.iter().map(|a| a.rec.id.clone()).collect();
        for id in ids.iter().filter(|id| *id != silent) {
            w.heartbeat(id, None);
        }
    }
}

/// Instances whose task was LOST with its agent and whose replacement is not
/// RUNNING yet.
fn lost_down(w: &World) -> usize {
    w.core.jobs[KEY]
        .slots
        .iter()
        .filter(|s| {
            let up = s
                .current
                .as_ref()
                .is_some_and(|id| w.state(id) == TaskState::Running);
            let lost = s.history.back().is_some_and(|id| {
                w.core.task(id).unwrap().status.exit_reason == Some(ExitReason::AgentLost)
            });
            lost && !up
        })
        .count()
}

/// Six instances on three hosts with room for two each, updated 2 at a time and
/// watched for 10 s (longer than the agent timeout), with batch (0,1) RUNNING on
/// the new config; the new config's hash.
fn six_on_three_full_hosts_mid_update() -> (World, String) {
    let mut w = world(3);
    let limit = r#"},"constraints":{"host":"limit:2""#;
    w.create(web(6, "sleep 100", 2, limit));
    play(&mut w, 1_000);
    assert_eq!(running(&w), 6);
    let mut new_spec = web(6, "sleep 200", 2, limit);
    new_spec.update.watch = drover_common::units::Duration(std::time::Duration::from_secs(10));
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    for _ in 0..20 {
        if (0..2).all(|i| w.state(&w.current(KEY, i)) == TaskState::Running) {
            break;
        }
        play(&mut w, 250);
    }
    for i in 0..2 {
        assert_eq!(w.state(&w.current(KEY, i)), TaskState::Running);
        assert_eq!(
            view(&w).instances[i as usize].state,
            InstanceUpdateState::Updating
        );
    }
    (w, new)
}

/// The agent of `task`.
fn agent_of(w: &World, task: &str) -> String {
    w.core.task(task).unwrap().agent.clone().unwrap()
}

/// The agent comes back (with nothing: its tasks were replaced); the update then
/// rolls forward with no failure.
fn back_and_rolled_forward(w: &mut World, agent: &str, new: &str) {
    w.heartbeat(agent, Some(Vec::new()));
    let v = until_done(w, 60_000);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert!(v.instances.iter().all(|p| p.failures == 0), "{v:#?}");
    assert!(!v.events.iter().any(|e| e.message.contains("failure")));
    assert!(configs(w).iter().all(|c| c == new));
    assert_eq!(running(w), 6);
}

/// A new task being watched is LOST with its agent: the partition policy replaces
/// it, which is no failure of the new config (as a drain's is not): its
/// replacement is watched in its place and the update rolls forward.
#[test]
fn a_watched_task_lost_with_its_agent_is_no_update_failure() {
    let (mut w, new) = six_on_three_full_hosts_mid_update();
    let watched = w.current(KEY, 0);
    let silent = agent_of(&w, &watched);
    play_without(&mut w, 6_000, &silent);
    assert_eq!(w.state(&watched), TaskState::Lost);
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RollingForward, "{v:#?}");
    assert!(v.instances.iter().all(|p| p.failures == 0), "{v:#?}");
    back_and_rolled_forward(&mut w, &silent, &new);
}

/// A host without any instance of the batch is lost mid-update and the hosts left
/// have no room for its two instances: once the batch is done, no batch starts on
/// top of the two down (the update says why) until their replacements run.
#[test]
fn no_batch_starts_over_instances_a_lost_agent_has_down() {
    let (mut w, new) = six_on_three_full_hosts_mid_update();
    let batch: Vec<String> = (0..2).map(|i| agent_of(&w, &w.current(KEY, i))).collect();
    let silent = (0..3)
        .map(|i| format!("a{i}"))
        .find(|a| !batch.contains(a))
        .unwrap();
    let mut most_by_update = 0;
    for _ in 0..60 {
        play_without(&mut w, 250, &silent);
        most_by_update = most_by_update.max(down(&w) - lost_down(&w));
    }
    assert_eq!(lost_down(&w), 2, "both of the host's instances are down");
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RollingForward, "{v:#?}");
    assert!(v.instances[..2]
        .iter()
        .all(|p| p.state == InstanceUpdateState::Updated));
    let why = v.waiting.clone().unwrap_or_default();
    assert!(
        why.contains("2 instance(s) down after their agent was lost"),
        "{why}"
    );
    assert_eq!(down(&w), 2, "no batch on top of the loss: {v:#?}");
    assert_eq!(batches(&v, "batch: instances "), vec!["0,1"]);
    assert!(most_by_update <= 2, "{most_by_update} down by the update");
    back_and_rolled_forward(&mut w, &silent, &new);
}

/// The configs the job keeps (hashes), from the core and from what was stored.
fn kept_configs(w: &mut World) -> (BTreeSet<String>, BTreeSet<String>) {
    let core: BTreeSet<String> = w.core.jobs[KEY].configs.keys().cloned().collect();
    let stored: BTreeSet<String> = w
        .snapshot()
        .configs
        .into_iter()
        .filter(|c| c.job == KEY)
        .map(|c| c.hash)
        .collect();
    (core, stored)
}

/// Old configs are dropped, durably, once nothing needs them: kept are the
/// configs instances run, those an unfinished update may roll back to, and the
/// newest `config_history` (2 in these tests).
#[test]
fn configs_nothing_needs_are_pruned_beyond_the_history_and_durably() {
    let mut w = world(2);
    w.create(web(2, "sleep 100", 2, ""));
    play(&mut w, 1_000);
    let mut hashes = vec![config_hash(&web(2, "sleep 100", 2, ""))];
    // Canaries: instance 0 moves to a new config each time, instance 1 stays on
    // the first.
    for n in 1..=4 {
        let spec = web(2, &format!("sleep {}", 100 + n), 2, "");
        hashes.push(config_hash(&spec));
        update(&mut w, spec, Some(vec![0])).unwrap();
        let v = until_done(&mut w, 60_000);
        assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
        w.advance(1_000);
    }
    // Instance 1 runs hashes[0], instance 0 hashes[4]; hashes[3] is among the
    // newest two; hashes[1] and [2] are gone, from the store too.
    let (core, stored) = kept_configs(&mut w);
    let want: BTreeSet<String> = [0, 3, 4].iter().map(|&i| hashes[i].clone()).collect();
    assert_eq!(core, want);
    assert_eq!(stored, want);
    // A restarted master loads the same and keeps pruning the same way.
    let snap = w.snapshot();
    w.core = Core::load(cfg(), snap, w.at(), 9);
    assert_eq!(kept_configs(&mut w).0, want);

    // An unfinished update keeps what it may roll back to: instance 1 moves off
    // hashes[0] and the update is paused mid-way (one instance at a time).
    let spec = web(2, "sleep 200", 1, "");
    let last = config_hash(&spec);
    update(&mut w, spec, None).unwrap();
    for _ in 0..40 {
        if view(&w).instances[0].state == InstanceUpdateState::Updated {
            break;
        }
        play(&mut w, 250);
    }
    w.handle(Event::UpdateAction {
        job: KEY.to_string(),
        action: UpdateAction::Pause,
    })
    .reply
    .unwrap();
    let (core, _) = kept_configs(&mut w);
    assert!(core.contains(&hashes[0]), "instance 1 runs it: {core:?}");
    assert!(
        core.contains(&hashes[4]),
        "instance 0 may roll back to it: {core:?}"
    );
    assert!(core.contains(&last));
    // Roll back: instance 0 goes back to hashes[4]; nothing it needs was dropped.
    w.handle(Event::UpdateAction {
        job: KEY.to_string(),
        action: UpdateAction::Rollback,
    })
    .reply
    .unwrap();
    let v = until_done(&mut w, 60_000);
    assert_eq!(v.state, UpdateState::RolledBack, "{v:#?}");
    assert_eq!(configs(&w), vec![hashes[4].clone(), hashes[0].clone()]);
    let (core, stored) = kept_configs(&mut w);
    assert_eq!(core, stored);
    assert!(
        core.contains(&hashes[0]) && core.contains(&hashes[4]),
        "{core:?}"
    );
    assert!(core.len() <= 3, "{core:?}");
}

/// A batch job of `n` instances running `cmd`, updated 2 at a time.
fn batch_job(n: u32, cmd: &str) -> JobSpec {
    let text = format!(
        r#"{{"role":"www","environment":"prod","name":"web","instances":{n},
        "service":false,
        "task":{{"processes":[{{"name":"main","cmdline":"{cmd}"}}],
                "resources":{{"cpu":0.5,"ram":"64MiB","disk":"64MiB"}}}},
        "update":{{"batch_size":2,"watch":"2s"}}}}"#
    );
    serde_json::from_str(&text).unwrap()
}

/// Plays a batch job's agents: placed tasks run and finish at once (or fail, if
/// their config runs `false`); stopping tasks end.
fn finish_all(w: &mut World) {
    let ids: Vec<String> = w.core.tasks.keys().cloned().collect();
    for id in ids {
        let Some(t) = w.core.task(&id) else { continue };
        let fails = w.core.jobs[&t.job].spec_of(&t.config).task.processes[0].cmdline == "false";
        match t.status.state {
            TaskState::Assigned => {
                w.run(&id);
                if fails {
                    w.report(
                        &id,
                        TaskState::Failed,
                        Some(ExitReason::ExitCode { code: 1 }),
                    );
                } else {
                    w.report(
                        &id,
                        TaskState::Finished,
                        Some(ExitReason::ExitCode { code: 0 }),
                    );
                }
            }
            TaskState::Killing | TaskState::Restarting => {
                w.report(&id, TaskState::Killed, None);
            }
            _ => {}
        }
    }
    w.pass(250);
}

/// Updating a batch job: each instance, finished on the old config, runs once more
/// on the new one, batch by batch; a new task that FINISHES is done without waiting
/// out the watch; the old tasks keep their FINISHED end in the history.
#[test]
fn a_batch_job_update_runs_each_instance_again_on_the_new_config() {
    let mut w = world(3);
    let old = w.create(batch_job(3, "echo v1"));
    finish_all(&mut w);
    for id in &old {
        assert_eq!(w.state(id), TaskState::Finished);
    }
    let new_spec = batch_job(3, "echo v2");
    let new = config_hash(&new_spec);
    update(&mut w, new_spec, None).unwrap();
    for _ in 0..40 {
        if view(&w).state.is_terminal() {
            break;
        }
        finish_all(&mut w);
    }
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
    assert_eq!(batches(&v, "batch: instances "), ["0,1", "2"]);
    for i in 0..3 {
        let t = w.core.task(&w.current(KEY, i)).unwrap();
        assert_eq!(t.config, new, "instance {i}");
        assert_eq!(t.status.state, TaskState::Finished, "instance {i}");
    }
    for id in &old {
        assert_eq!(
            w.state(id),
            TaskState::Finished,
            "an ended task keeps its end"
        );
    }
    // A new config that fails rolls back: each instance runs the old one again.
    let bad = batch_job(3, "false");
    update(&mut w, bad, None).unwrap();
    for _ in 0..80 {
        if view(&w).state.is_terminal() {
            break;
        }
        finish_all(&mut w);
    }
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RolledBack, "{v:#?}");
    assert_eq!(batches(&v, "rollback batch: instances "), ["1,0"]);
    assert!(configs(&w).iter().all(|c| *c == new), "{:?}", configs(&w));
}

/// Tasks of a job's older config are placed by that config, not the newest: after
/// a canary whose config wants `rack: a` (one host, which the canary takes), an
/// old-config instance restarted still finds a place on rack b.
#[test]
fn tasks_of_an_older_config_are_placed_by_their_own_constraints() {
    let mut w = World::new();
    for i in 1..4 {
        w.register(&format!("a{i}"), 8.0, 16, &[("rack", "b")]);
    }
    w.create(web(3, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    assert_eq!(running(&w), 3);
    w.register("a0", 8.0, 16, &[("rack", "a")]);
    let old = configs(&w)[1].clone();
    let mut canary = serde_json::to_value(web(3, "sleep 200", 1, "")).unwrap();
    canary["constraints"]["rack"] = serde_json::json!("a");
    let canary: JobSpec = serde_json::from_value(canary).unwrap();
    update(&mut w, canary, Some(vec![0])).unwrap();
    assert_eq!(until_done(&mut w, 30_000).state, UpdateState::RolledForward);
    let agent_of = |w: &World, i: u32| {
        let t = w.core.task(&w.current(KEY, i)).unwrap();
        (
            t.agent.clone().unwrap_or_default(),
            t.status.state,
            t.config.clone(),
        )
    };
    assert_eq!(
        agent_of(&w, 0).0,
        "a0",
        "the canary runs where its config says"
    );
    w.handle(Event::Restart {
        job: KEY.to_string(),
        instances: Some(vec![1]),
    })
    .reply
    .unwrap();
    play(&mut w, 1_000);
    let (agent, state, config) = agent_of(&w, 1);
    assert_eq!(
        state,
        TaskState::Running,
        "{:?}",
        w.core.task_view(&w.current(KEY, 1))
    );
    assert_eq!(config, old);
    assert_ne!(agent, "a0");
}

#[derive(Clone, Debug)]
struct Case {
    instances: u32,
    batch: u32,
    max_failures: u32,
    /// Instances whose new-config tasks fail.
    failing: Vec<bool>,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..8, 1u32..4, 0u32..3).prop_flat_map(|(instances, batch, max_failures)| {
        proptest::collection::vec(proptest::bool::weighted(0.2), instances as usize).prop_map(
            move |failing| Case {
                instances,
                batch,
                max_failures,
                failing,
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// An update never has more instances in flight than its batch size, always
    /// ends when its instances behave, and a rollback restores every config.
    #[test]
    fn updates_stay_within_their_batch_end_and_roll_back_to_the_old_configs(c in case()) {
        let mut w = world(c.instances as usize + 2);
        w.create(web(c.instances, "sleep 100", c.batch, ""));
        play(&mut w, 1_000);
        let old = configs(&w);
        let extra = format!(r#","max_total_failures":{}"#, c.max_failures);
        let new_spec = web(c.instances, "sleep 200", c.batch, &extra);
        let new = config_hash(&new_spec);
        update(&mut w, new_spec, None).unwrap();
        let mut waited = 0;
        while !view(&w).state.is_terminal() {
            let u = &w.core.updates[KEY];
            prop_assert!(u.in_flight.len() <= c.batch as usize);
            play_failing(&mut w, 250, &|t| c.failing[t.instance as usize] && t.config == new);
            waited += 250;
            prop_assert!(waited < 300_000, "no end: {:#?}", view(&w));
        }
        let v = view(&w);
        let failing = c.failing.iter().filter(|f| **f).count() as u32;
        match v.state {
            UpdateState::RolledBack => {
                prop_assert!(failing > c.max_failures);
                prop_assert_eq!(configs(&w), old);
            }
            UpdateState::RolledForward => {
                prop_assert!(failing <= c.max_failures, "{:#?}", v);
                for (i, cfg) in configs(&w).iter().enumerate() {
                    if !c.failing[i] {
                        prop_assert_eq!(cfg, &new);
                    }
                }
            }
            other => prop_assert!(false, "ended {other}"),
        }
    }
}

/// A spec as JSON, changed by `f`.
fn edited(spec: JobSpec, f: impl FnOnce(&mut serde_json::Value)) -> JobSpec {
    let mut v = serde_json::to_value(spec).unwrap();
    f(&mut v);
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_task_of_an_older_config_preempts_by_its_own_needs_and_limits() {
    let mut w = World::new();
    w.register("a1", 2.0, 16, &[("rack", "r1")]);
    w.register("a2", 2.0, 16, &[("rack", "r2")]);
    // Config A: a whole cpu, one per rack. The canary's config B: a quarter, no limit.
    let a = edited(web(2, "sleep 100", 1, ""), |v| {
        v["task"]["resources"]["cpu"] = serde_json::json!(1.0);
        v["constraints"] = serde_json::json!({"rack": "limit:1"});
    });
    w.create(a);
    play(&mut w, 1_000);
    assert_eq!(running(&w), 2);
    let b = edited(web(2, "sleep 200", 1, ""), |v| {
        v["task"]["resources"]["cpu"] = serde_json::json!(0.25);
    });
    update(&mut w, b, Some(vec![0])).unwrap();
    assert_eq!(until_done(&mut w, 30_000).state, UpdateState::RolledForward);
    let old = w.core.task(&w.current(KEY, 1)).unwrap().config.clone();
    let canary_agent = w.core.task(&w.current(KEY, 0)).unwrap().agent.clone();
    let a1_agent = w
        .core
        .task(&w.current(KEY, 1))
        .unwrap()
        .agent
        .clone()
        .unwrap();
    assert_ne!(canary_agent.as_deref(), Some(a1_agent.as_str()));
    // Instance 1 fails until it is THROTTLED; meanwhile preemptible quarter-cpu
    // work fills every agent.
    let mut t1 = w.current(KEY, 1);
    while w.state(&t1) != TaskState::Throttled {
        if w.state(&t1) == TaskState::Assigned {
            w.run(&t1);
        }
        w.report(
            &t1,
            TaskState::Failed,
            Some(ExitReason::ExitCode { code: 1 }),
        );
        t1 = w.current(KEY, 1);
    }
    let batch = edited(spec("batch", 15, false, r#","tier":"preemptible""#), |v| {
        v["task"]["resources"]["cpu"] = serde_json::json!(0.25)
    });
    for id in w.create(batch) {
        assert_eq!(w.state(&id), TaskState::Assigned);
        w.run(&id);
    }
    // The penalty ends: instance 1's replacement (config A) preempts by config
    // A's cpu and rack limit: the four quarter-cpu tasks on its own rack's agent,
    // not one anywhere.
    w.pass(5_000);
    let repl = w.current(KEY, 1);
    assert_eq!(w.core.task(&repl).unwrap().config, old);
    assert_eq!(w.state(&repl), TaskState::Pending);
    let victims: Vec<String> = w
        .core
        .tasks
        .values()
        .filter(|t| t.status.state == TaskState::Preempting)
        .map(|t| t.id.clone())
        .collect();
    assert_eq!(victims.len(), 4, "{victims:?}");
    for v in &victims {
        assert_eq!(
            w.core.task(v).unwrap().agent.as_deref(),
            Some(a1_agent.as_str())
        );
    }
    let idx = w.core.agent_idx[&a1_agent] as usize;
    assert_eq!(w.core.agents[idx].reserved.cpu_milli, 1_000);
    // The victims end: the replacement is placed on the room they freed.
    for v in &victims {
        w.report(v, TaskState::Killed, None);
    }
    assert_eq!(w.state(&repl), TaskState::Assigned);
    assert_eq!(
        w.core.task(&repl).unwrap().agent.as_deref(),
        Some(a1_agent.as_str())
    );
    assert_eq!(w.core.agents[idx].reserved, Need::default());
}

#[test]
fn an_update_that_can_never_finish_says_why_and_is_stuck() {
    // 3 instances on 1 host with the services' default `host: limit:1`: only one
    // ever runs, so the update waits for a place that never comes.
    let mut w = world(1);
    w.create(web(3, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    assert_eq!(running(&w), 1);
    update(&mut w, web(3, "sleep 200", 1, ""), None).unwrap();
    play(&mut w, 5_000);
    let v = view(&w);
    assert_eq!(v.state, UpdateState::RollingForward, "{v:#?}");
    let waiting = v.waiting.clone().unwrap_or_default();
    assert!(
        waiting.contains("PENDING: host limit reached on 1 agent"),
        "{v:#?}"
    );
    assert!(waiting.contains("must stay RUNNING 2s"), "{waiting}");
    let stuck = v.stuck.unwrap_or_default();
    assert!(stuck.contains("host limit reached on 1 agent"), "{stuck}");

    // Two more agents let it go on: no longer stuck, and it finishes.
    w.register("a8", 8.0, 16, &[]);
    w.register("a9", 8.0, 16, &[]);
    play(&mut w, 500);
    assert_eq!(view(&w).stuck, None);
    let done = until_done(&mut w, 60_000);
    assert_eq!(done.state, UpdateState::RolledForward, "{done:#?}");
}

#[test]
fn an_update_waiting_for_resources_is_not_stuck() {
    // a1 is full of another job's task, whose ending may free it.
    let mut w = World::new();
    w.register("a0", 1.0, 16, &[]);
    w.register("a1", 1.0, 16, &[]);
    w.create(web(1, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    w.create(spec("hog", 1, false, ""));
    play(&mut w, 1_000);
    update(&mut w, web(2, "sleep 100", 1, ""), None).unwrap();
    play(&mut w, 2_000);
    let v = view(&w);
    let waiting = v.waiting.clone().unwrap_or_default();
    assert!(waiting.contains("insufficient cpu on 1 agent"), "{v:#?}");
    assert_eq!(v.stuck, None);
}

#[test]
fn an_aborted_update_leaves_one_instance_count_everywhere() {
    // Growing 2 -> 4 one at a time, aborted after the first added instance: the
    // job has 3 instances, and its spec, list line and view all say 3.
    let mut w = world(6);
    w.create(web(2, "sleep 100", 1, ""));
    play(&mut w, 1_000);
    update(&mut w, web(4, "sleep 100", 1, ""), None).unwrap();
    let mut waited = 0;
    while w.core.jobs[KEY].slots.len() < 3 {
        play(&mut w, 250);
        waited += 250;
        assert!(waited < 30_000, "{:#?}", view(&w));
    }
    w.handle(Event::UpdateAction {
        job: KEY.to_string(),
        action: UpdateAction::Abort,
    })
    .reply
    .unwrap();
    play(&mut w, 1_000);
    assert_eq!(view(&w).state, UpdateState::Aborted);
    let job = w.core.job_view(KEY).unwrap();
    let summary = w
        .core
        .job_summaries(None)
        .into_iter()
        .find(|s| s.key == KEY)
        .unwrap();
    assert_eq!(job.instances.len(), 3);
    assert_eq!(job.spec.instances, 3);
    assert_eq!(summary.instances, 3);
    // And so after a restart (the store holds it).
    let snap = w.snapshot();
    w.core = Core::load(cfg(), snap, w.at(), 9);
    assert_eq!(w.core.job_view(KEY).unwrap().spec.instances, 3);
}

#[test]
fn an_update_of_an_exclusive_instance_on_a_lost_host_replaces_it_once_it_ended() {
    let mut w = world(1);
    let exclusive = |cmd: &str| {
        let mut s = web(1, cmd, 1, "");
        s.partition_policy.exclusive = true;
        s
    };
    w.create(exclusive("sleep 1"));
    play(&mut w, 1_000);
    let old = w.current(KEY, 0);
    assert_eq!(w.state(&old), TaskState::Running);
    w.register("a1", 8.0, 16, &[]);
    // a0 goes silent past the agent timeout; the update comes.
    only_heartbeating(&mut w, &["a1"], 4_000);
    update(&mut w, exclusive("sleep 2"), None).unwrap();
    assert_eq!(w.state(&old), TaskState::Restarting);
    assert_eq!(
        w.current(KEY, 0),
        old,
        "replaced beside a copy the master cannot stop"
    );
    // The partition policy ends it after the lease and kill time: replaced then,
    // on the update's config.
    only_heartbeating(&mut w, &["a1"], 40_000);
    assert_eq!(w.state(&old), TaskState::Killed);
    let new = w.current(KEY, 0);
    assert_ne!(new, old);
    assert_ne!(
        w.core.task(&new).unwrap().config,
        w.core.task(&old).unwrap().config
    );
    let v = until_done(&mut w, 30_000);
    assert_eq!(v.state, UpdateState::RolledForward, "{v:#?}");
}
