//! Cron jobs: the timetable (pure), firings as runs, the collision policies, and a
//! restart that neither runs a firing twice nor bursts missed ones.

use super::*;

fn cron_spec(name: &str, schedule: &str, policy: &str) -> JobSpec {
    spec(
        name,
        2,
        false,
        &format!(r#","cron_schedule":"{schedule}","cron_collision_policy":"{policy}""#),
    )
}

const KEY: &str = "www/prod/tick";

fn runs(w: &World) -> usize {
    // Tasks of instance 0 ever created (current plus history) = runs.
    let slot = &w.core.jobs[KEY].slots[0];
    slot.current.iter().count() + slot.history.len()
}

#[test]
fn a_schedule_is_read_in_its_time_zone_and_errors_name_the_field() {
    let s = parse_cron("0 9 * * *", Some("Europe/Paris"), false).unwrap();
    // 2026-01-15 00:00 UTC -> 09:00 Paris (winter) is 08:00 UTC.
    let midnight = 1_768_435_200_000;
    assert_eq!(s.next_after(midnight), Some(midnight + 8 * 3_600_000));
    assert_eq!(s.timezone(), "Europe/Paris");
    let e = parse_cron("61 * * * *", None, false).unwrap_err();
    assert_eq!(e.field, "cron_schedule");
    assert!(e.message.contains("minute field `61`"), "{e}");
    let e = parse_cron("* * 32 * *", None, false).unwrap_err();
    assert!(e.message.contains("day-of-month field `32`"), "{e}");
    let e = parse_cron("* * * *", None, false).unwrap_err();
    assert!(e.message.contains("has 4 fields"), "{e}");
    let e = parse_cron("*/5 * * * * *", None, false).unwrap_err();
    assert!(e.message.contains("has 6 fields"), "{e}");
    assert!(parse_cron("*/5 * * * * *", None, true).is_ok());
    let e = parse_cron("* * * * *", Some("Mars/Olympus"), false).unwrap_err();
    assert_eq!(e.field, "cron_timezone");
    assert!(parse_cron("@daily", None, false).is_ok());
}

#[test]
fn catch_up_runs_only_the_latest_missed_firing_within_the_grace() {
    let s = parse_cron("0 * * * *", None, false).unwrap();
    let hour = 3_600_000;
    let base = 1_768_435_200_000; // on the hour
                                  // Last handled at base; down for 3.5 h: the 3 h firing is 30 min old.
    assert_eq!(
        catch_up(&s, base, base + 3 * hour + hour / 2, hour),
        Some(base + 3 * hour)
    );
    // Outside the grace: nothing.
    assert_eq!(
        catch_up(&s, base, base + 3 * hour + hour / 2, hour / 4),
        None
    );
    // Already handled: nothing.
    assert_eq!(
        catch_up(&s, base + 3 * hour, base + 3 * hour + 10, hour),
        None
    );
}

#[test]
fn a_bad_schedule_is_refused_naming_the_field() {
    let mut w = World::new();
    let err = w
        .handle(Event::CreateJob(Box::new(cron_spec(
            "tick",
            "99 * * * *",
            "KILL_EXISTING",
        ))))
        .reply
        .unwrap_err();
    assert!(
        matches!(&err, CoreError::BadCron(e) if e.field == "cron_schedule"),
        "{err}"
    );
    let mut s = cron_spec("tick", "* * * * *", "KILL_EXISTING");
    s.service = true;
    let err = w.handle(Event::CreateJob(Box::new(s))).reply.unwrap_err();
    assert!(err.to_string().contains("service"), "{err}");
    assert!(w.core.jobs.is_empty());
}

#[test]
fn a_cron_job_is_a_template_and_each_firing_starts_a_run() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    // Every 10 s (the seconds switch is on in these tests).
    let tasks = w.create(cron_spec("tick", "*/10 * * * * *", "KILL_EXISTING"));
    assert!(tasks.is_empty(), "a template runs nothing at creation");
    let view = w.core.cron_view(KEY).unwrap();
    let next = view.next_fire_ms.unwrap();
    assert!(next > w.at().wall && next <= w.at().wall + 10_000);
    assert_eq!(runs(&w), 0);
    w.pass(10_000);
    assert_eq!(runs(&w), 1);
    let t0 = w.current(KEY, 0);
    assert_eq!(w.state(&t0), TaskState::Assigned);
    w.run(&t0);
    w.report(
        &t0,
        TaskState::Finished,
        Some(ExitReason::ExitCode { code: 0 }),
    );
    let t1 = w.current(KEY, 1);
    w.run(&t1);
    w.report(
        &t1,
        TaskState::Finished,
        Some(ExitReason::ExitCode { code: 0 }),
    );
    assert_eq!(w.core.cron_view(KEY).unwrap().active_tasks, 0);
    w.pass(10_000);
    assert_eq!(runs(&w), 2);
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::PutCronFired(k, _) if k == KEY)));
}

#[test]
fn kill_existing_kills_the_active_run_and_cancel_new_skips_the_firing() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(cron_spec("tick", "*/10 * * * * *", "KILL_EXISTING"));
    w.pass(10_000);
    let first = w.current(KEY, 0);
    w.run(&first);
    w.pass(10_000);
    assert_eq!(w.state(&first), TaskState::Killing, "KILL_EXISTING");
    let second = w.current(KEY, 0);
    assert_ne!(second, first);
    assert_eq!(runs(&w), 2);

    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(spec(
        "tick",
        2,
        false,
        r#","cron_schedule":"*/10 * * * * *","cron_collision_policy":"CANCEL_NEW""#,
    ));
    w.pass(10_000);
    let first = w.current(KEY, 0);
    w.run(&first);
    let fired = w.core.cron_view(KEY).unwrap().last_fired_ms;
    w.pass(10_000);
    assert_eq!(w.state(&first), TaskState::Running, "CANCEL_NEW");
    assert_eq!(runs(&w), 1);
    assert!(
        w.core.cron_view(KEY).unwrap().last_fired_ms > fired,
        "handled, skipped"
    );
}

#[test]
fn start_runs_now_and_deschedule_stops_the_firings() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(cron_spec("tick", "0 0 1 1 *", "KILL_EXISTING"));
    let r = w
        .handle(Event::CronStart {
            job: KEY.to_string(),
        })
        .reply
        .unwrap();
    let Reply::Action(a) = r else { panic!("{r:?}") };
    assert_eq!(a.tasks.len(), 2);
    assert_eq!(w.core.cron_view(KEY).unwrap().last_fired_ms, None);
    w.handle(Event::CronDeschedule {
        job: KEY.to_string(),
    })
    .reply
    .unwrap();
    assert!(w.core.cron_view(KEY).is_none(), "no longer a cron job");
    assert!(w.core.jobs.contains_key(KEY), "its run goes on");
    let err = w
        .handle(Event::CronStart {
            job: KEY.to_string(),
        })
        .reply
        .unwrap_err();
    assert_eq!(err, CoreError::NotCron(KEY.to_string()));
    // Without a run going, deschedule removes the template.
    w.create(cron_spec("idle", "0 0 1 1 *", "KILL_EXISTING"));
    w.handle(Event::CronDeschedule {
        job: "www/prod/idle".to_string(),
    })
    .reply
    .unwrap();
    assert!(!w.core.jobs.contains_key("www/prod/idle"));
}

#[test]
fn a_cron_firing_is_in_the_change_stream_like_any_other_write() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(cron_spec("tick", "0 0 1 1 *", "KILL_EXISTING"));
    let before = w.core.seq();
    let r = w
        .handle(Event::CronStart {
            job: KEY.to_string(),
        })
        .reply
        .unwrap();
    let Reply::Action(a) = r else { panic!("{r:?}") };
    let upto = w.core.seq();
    assert!(
        upto > before,
        "the firing was committed in a batch of its own"
    );
    let all = crate::core::ChangeFilter {
        job: None,
        roles: None,
        agents: true,
    };
    let view = w.core.changes_since(before, upto, &all);
    let mut seen: Vec<&str> = view.tasks.iter().map(|t| t.task_id.as_str()).collect();
    let mut fired: Vec<&str> = a.tasks.iter().map(String::as_str).collect();
    seen.sort_unstable();
    fired.sort_unstable();
    assert_eq!(seen, fired, "the run's tasks are reported");
    assert_eq!(view.jobs.len(), 1);
    assert_eq!(view.jobs[0].key, KEY);
    assert!(
        view.jobs[0].cron.is_some(),
        "the summary names the schedule"
    );
}

fn runs_in(core: &Core) -> usize {
    let slot = &core.jobs[KEY].slots[0];
    slot.current.iter().count() + slot.history.len()
}

#[test]
fn a_restart_never_runs_a_firing_twice_and_runs_a_missed_one_once_within_grace() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(cron_spec("tick", "*/10 * * * * *", "CANCEL_NEW"));
    w.pass(10_000);
    assert_eq!(runs(&w), 1);
    for i in 0..2 {
        let id = w.current(KEY, i);
        w.run(&id);
        w.report(
            &id,
            TaskState::Finished,
            Some(ExitReason::ExitCode { code: 0 }),
        );
    }
    let snap = w.snapshot();
    // Restarted at once: the firing just handled is not run again.
    let back = Core::load(cfg(), snap.clone(), w.at(), 11);
    assert_eq!(runs_in(&back), 1);
    assert!(back.cron_view(KEY).unwrap().next_fire_ms.is_some());
    // Down for 45 s (four firings missed; the grace is 60 s): one run at start.
    w.now += 45_000;
    let back = Core::load(cfg(), snap.clone(), w.at(), 12);
    assert_eq!(runs_in(&back), 2, "the latest missed firing ran once");
    let view = back.cron_view(KEY).unwrap();
    assert!(view.last_fired_ms.unwrap() > w.at().wall - 10_000);
    assert!(view.next_fire_ms.unwrap() > w.at().wall);
    // The latest missed firing is older than the grace (5 s here): nothing at
    // start, only the next firing is armed.
    w.now = 1_177_000; // 7 s after the firing at 1_170_000
    let short = CoreConfig {
        cron_grace_ms: 5_000,
        ..cfg()
    };
    let back = Core::load(short, snap, w.at(), 13);
    assert_eq!(runs_in(&back), 1);
    assert_eq!(back.cron_view(KEY).unwrap().next_fire_ms, Some(1_180_000));
}

#[test]
fn a_cron_time_fires_once_even_when_the_wall_clock_steps_back_and_forward_over_it() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(cron_spec("tick", "*/10 * * * * *", "KILL_EXISTING"));
    w.pass(10_000);
    assert_eq!(runs(&w), 1);
    let fired = w.core.cron_view(KEY).unwrap().last_fired_ms.unwrap();
    // The wall clock steps back an hour and the master restarts: the next firing
    // is still after the last one fired.
    w.wall_skew -= 3_600_000;
    w.core = Core::load(cfg(), w.snapshot(), w.at(), 11);
    assert!(
        w.core.cron_view(KEY).unwrap().next_fire_ms.unwrap() > fired,
        "{:?}",
        w.core.cron_view(KEY)
    );
    // Times before the last one fired do not fire (again) while the clock is back.
    w.pass(20_000);
    // Forward again past the time fired, and another restart: firings go on after it.
    w.wall_skew += 3_600_000;
    w.core = Core::load(cfg(), w.snapshot(), w.at(), 12);
    w.pass(20_000);
    let times: Vec<u64> = w
        .persisted
        .iter()
        .filter_map(|c| match c {
            Change::PutCronFired(job, at) if job == KEY => Some(*at),
            _ => None,
        })
        .collect();
    assert!(times.len() >= 2, "{times:?}");
    assert!(
        times.windows(2).all(|p| p[0] < p[1]),
        "a time fired twice or out of order: {times:?}"
    );
}
