//! Black-box: rolling updates of real services (python HTTP servers with HTTP health
//! checks) on a real master and agents. Batches keep the rest of the job RUNNING,
//! a config that fails rolls back in reverse order (seed 001), a canary stays
//! beside the old config, `drover job diff` shows adds, removes and changed fields,
//! pause/resume/abort steer an update, an update survives a master kill -9, and
//! instance counts grow and shrink. Each test runs its own cluster, in parallel.

// The helpers below serve #[test] functions only: a failure is the test's panic.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{JobView, UpdateState, UpdateView};
use drover_tests::{
    describe, running_as_root, running_instances, service_job, Cluster, ClusterConfig,
};
use serde_json::{json, Value};

/// A service of `n` instances with `prefix` run before the server, updated in
/// batches of `batch` watched for 1 s; three agents may hold up to ten instances each.
fn spec(name: &str, n: u32, prefix: &str, batch: u32) -> Value {
    let mut s = service_job(name, n);
    let cmd = s["task"]["processes"][0]["cmdline"]
        .as_str()
        .unwrap()
        .to_string();
    s["task"]["processes"][0]["cmdline"] = json!(format!("{prefix}{cmd}"));
    s["constraints"] = json!({"host": "limit:10"});
    s["update"] = json!({"batch_size": batch, "watch": "1s"});
    s
}

fn key(name: &str) -> String {
    format!("www-data/test/{name}")
}

fn start(name: &str, n: u32, batch: u32) -> Option<Cluster> {
    if !running_as_root(name) {
        return None;
    }
    let mut cluster = Cluster::start(ClusterConfig::agents(3)).unwrap();
    cluster.create_job(&spec(name, n, "", batch)).unwrap();
    cluster
        .wait_for_all(&key(name), TaskState::Running)
        .unwrap();
    Some(cluster)
}

/// POST .../update with `spec`; the status and body.
fn post_update(c: &Cluster, name: &str, spec: &Value, instances: Option<&str>) -> (u16, Value) {
    let mut body = json!({"spec": spec, "user": "test"});
    if let Some(i) = instances {
        body["instances"] = json!(i);
    }
    c.post(&format!("/v1/jobs/{}/update", key(name)), &body)
        .unwrap()
}

fn update_of(c: &Cluster, name: &str) -> UpdateView {
    c.get(&format!("/v1/jobs/{}/update", key(name))).unwrap()
}

/// Waits for the update to end, calling `each` with the job on every poll.
fn wait_update(c: &mut Cluster, name: &str, mut each: impl FnMut(&JobView)) -> UpdateView {
    let started = Instant::now();
    loop {
        let u = update_of(c, name);
        if u.state.is_terminal() {
            return u;
        }
        if let Ok(job) = c.job(&key(name)) {
            each(&job);
        }
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "update not done: {u:#?}\n{}",
            c.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn batches(u: &UpdateView, prefix: &str) -> Vec<String> {
    u.events
        .iter()
        .filter_map(|e| e.message.strip_prefix(prefix).map(str::to_string))
        .collect()
}

fn write(c: &Cluster, file: &str, spec: &Value) -> String {
    let path = c.dir().join(file);
    std::fs::write(&path, spec.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn nine_instances_roll_forward_in_batches_of_three_keeping_six_running() {
    let Some(mut c) = start("roll", 9, 3) else {
        return;
    };
    let (status, body) = post_update(&c, "roll", &spec("roll", 9, "true; ", 3), None);
    assert_eq!(status, 201, "{body}");
    let mut least = 9;
    let u = wait_update(&mut c, "roll", |job| {
        least = least.min(running_instances(job))
    });
    assert_eq!(u.state, UpdateState::RolledForward, "{u:#?}");
    assert!(least >= 6, "at most one batch down, saw {least} RUNNING");
    assert_eq!(
        batches(&u, "batch: instances "),
        ["0,1,2", "3,4,5", "6,7,8"]
    );
    let job = c.wait_for_all(&key("roll"), TaskState::Running).unwrap();
    let configs: Vec<_> = job.instances.iter().map(|i| i.config.clone()).collect();
    assert!(configs.iter().all(|h| *h == Some(u.to_config.clone())));
    // The replaced task ended KILLED with reason `updated`, kept in the history.
    let old = &job.instances[4].history[0];
    assert_eq!(old.state, TaskState::Killed);
    assert_eq!(old.exit_reason, Some(ExitReason::Updated));
}

#[test]
fn a_config_failing_on_instances_6_to_8_rolls_back_8_7_6_then_5_4_3_then_2_1_0() {
    let Some(mut c) = start("back", 9, 3) else {
        return;
    };
    let before: Vec<_> = c
        .job(&key("back"))
        .unwrap()
        .instances
        .iter()
        .map(|i| i.config.clone())
        .collect();
    let bad = spec("back", 9, "if [ {{instance}} -ge 6 ]; then exit 1; fi; ", 3);
    let (status, body) = post_update(&c, "back", &bad, None);
    assert_eq!(status, 201, "{body}");
    // A second update meanwhile is refused, naming the running one.
    let (status, body) = post_update(&c, "back", &spec("back", 9, "true; ", 3), None);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "update_running");
    let id = body["error"]["message"].as_str().unwrap().to_string();
    assert!(id.contains(&update_of(&c, "back").id), "{id}");

    let u = wait_update(&mut c, "back", |_| {});
    assert_eq!(u.state, UpdateState::RolledBack, "{u:#?}");
    assert_eq!(
        batches(&u, "batch: instances "),
        ["0,1,2", "3,4,5", "6,7,8"]
    );
    assert_eq!(
        batches(&u, "rollback batch: instances "),
        ["8,7,6", "5,4,3", "2,1,0"]
    );
    let job = c.wait_for_all(&key("back"), TaskState::Running).unwrap();
    let after: Vec<_> = job.instances.iter().map(|i| i.config.clone()).collect();
    assert_eq!(after, before, "every instance back on its config");
}

#[test]
fn a_canary_on_instance_0_runs_beside_the_old_config_and_diff_shows_it() {
    let Some(c) = start("canary", 3, 1) else {
        return;
    };
    let new = write(&c, "canary.json", &spec("canary", 3, "true; ", 1));
    // diff: instance 0 would be replaced, the cmdline changes; exit 1.
    let out = c
        .drover(&["job", "diff", &new, "--instances", "0"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(text.contains("replace:   0\n"), "{text}");
    assert!(text.contains("unchanged: -\n"), "{text}");
    // The script's changed line, not the whole script twice as one string.
    assert!(
        text.contains(
            "  task.processes[0].cmdline:\n    - exec python3 -c 'import http.server, os, \
             sys\n    + true; exec python3"
        ),
        "{text}"
    );
    let out = c
        .drover(&["job", "update", &new, "--instances", "0", "--wait"])
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ROLLED_FORWARD"));
    let job = c.job(&key("canary")).unwrap();
    assert_eq!(job.configs.len(), 2, "{job:#?}");
    assert_ne!(job.instances[0].config, job.instances[1].config);
    assert_eq!(job.instances[1].config, job.instances[2].config);
    // The status names both configs with their ranges.
    let out = c.drover(&["job", "status", &key("canary")]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let hash = job.instances[0].config.clone().unwrap();
    assert!(text.contains(&format!("{hash} (0)")), "{text}");
    // Nothing more to change for instance 0: exit 0.
    let out = c
        .drover(&["job", "diff", &new, "--instances", "0"])
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    // The update record, through the CLI.
    let out = c
        .drover(&["job", "update", "status", &key("canary")])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ROLLED_FORWARD") && text.contains("by "),
        "{text}"
    );
}

#[test]
fn instance_counts_go_3_to_5_to_2_and_diff_shows_adds_and_removes() {
    let Some(mut c) = start("count", 3, 2) else {
        return;
    };
    let five = write(&c, "five.json", &spec("count", 5, "", 2));
    let out = c.drover(&["job", "diff", &five]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text.contains("add:       3-4\n") && text.contains("unchanged: 0-2\n"),
        "{text}"
    );
    let out = c.drover(&["job", "update", &five, "--wait"]).unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let job = c.wait_for_all(&key("count"), TaskState::Running).unwrap();
    assert_eq!(job.instances.len(), 5);

    let two = write(&c, "two.json", &spec("count", 2, "", 2));
    let out = c.drover(&["job", "diff", &two]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("remove:    2-4\n"), "{text}");
    let first = job.instances[0].current.clone().unwrap().task_id;
    let (status, body) = post_update(&c, "count", &spec("count", 2, "", 2), None);
    assert_eq!(status, 201, "{body}");
    let u = wait_update(&mut c, "count", |_| {});
    assert_eq!(u.state, UpdateState::RolledForward, "{u:#?}");
    let job = c.job(&key("count")).unwrap();
    assert_eq!(job.instances.len(), 2, "{job:#?}");
    assert_eq!(job.spec.instances, 2);
    assert_eq!(
        job.instances[0].current.as_ref().unwrap().task_id,
        first,
        "an unchanged instance is not touched"
    );
}

#[test]
fn pause_resume_and_abort_steer_an_update() {
    let Some(mut c) = start("steer", 4, 1) else {
        return;
    };
    let (status, _) = post_update(&c, "steer", &spec("steer", 4, "true; ", 1), None);
    assert_eq!(status, 201);
    let out = c
        .drover(&["job", "update", "pause", &key("steer")])
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(update_of(&c, "steer").state, UpdateState::Paused);
    // Paused: the batch in flight finishes, no other starts.
    std::thread::sleep(Duration::from_secs(6));
    let u = update_of(&c, "steer");
    assert_eq!(batches(&u, "batch: instances ").len(), 1, "{u:#?}");
    let out = c
        .drover(&["job", "update", "resume", &key("steer")])
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    c.wait_for("a second batch", Duration::from_secs(60), |c| {
        (batches(&update_of(c, "steer"), "batch: instances ").len() >= 2).then_some(())
    })
    .unwrap();
    let out = c
        .drover(&["job", "update", "abort", &key("steer")])
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let u = update_of(&c, "steer");
    assert_eq!(u.state, UpdateState::Aborted);
    // Aborted: nothing to resume; the job keeps both configs.
    let out = c
        .drover(&["job", "update", "resume", &key("steer")])
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_active_update"));
    let job = c.job(&key("steer")).unwrap();
    assert_eq!(job.configs.len(), 2, "old and new side by side: {job:#?}");
}

#[test]
fn an_update_finishes_after_the_master_is_killed_and_restarted() {
    let Some(mut c) = start("durable", 4, 1) else {
        return;
    };
    let (status, _) = post_update(&c, "durable", &spec("durable", 4, "true; ", 1), None);
    assert_eq!(status, 201);
    c.wait_for("the second batch", Duration::from_secs(60), |c| {
        (batches(&update_of(c, "durable"), "batch: instances ").len() >= 2).then_some(())
    })
    .unwrap();
    c.master().unwrap().kill();
    c.stop_master(Duration::from_secs(1));
    c.start_master_again().unwrap();
    let u = wait_update(&mut c, "durable", |_| {});
    assert_eq!(u.state, UpdateState::RolledForward, "{u:#?}");
    assert_eq!(batches(&u, "batch: instances "), ["0", "1", "2", "3"]);
    let job = c.wait_for_all(&key("durable"), TaskState::Running).unwrap();
    assert!(job
        .instances
        .iter()
        .all(|i| i.config.as_deref() == Some(u.to_config.as_str())));
}

/// The speed bound: a 20-instance service (no health check) updated in
/// batches of 5 watched 1 s each ends within 6 s of the sum of its watch times.
#[test]
fn twenty_instances_in_batches_of_five_take_the_watch_times_plus_at_most_6s() {
    if !running_as_root("update speed") {
        return;
    }
    let mut c = Cluster::start(ClusterConfig::agents(3)).unwrap();
    let job = |cmd: &str| {
        let mut s = drover_tests::command_job("speed", 20, true, cmd);
        s["constraints"] = json!({"host": "limit:20"});
        s["update"] = json!({"batch_size": 5, "watch": "1s"});
        s
    };
    c.create_job(&job("sleep 1000")).unwrap();
    c.wait_for_all(&key("speed"), TaskState::Running).unwrap();
    let started = Instant::now();
    let (status, body) = post_update(&c, "speed", &job("sleep 2000"), None);
    assert_eq!(status, 201, "{body}");
    let u = wait_update(&mut c, "speed", |_| {});
    let took = started.elapsed();
    assert_eq!(u.state, UpdateState::RolledForward, "{u:#?}");
    let watches = Duration::from_secs(4);
    println!(
        "MEASURE update_20x_batch5_watch1s total={:.2}s over_watch={:.2}s",
        took.as_secs_f64(),
        (took - watches.min(took)).as_secs_f64()
    );
    assert!(
        took < watches + Duration::from_secs(6),
        "took {took:?}: more than 6 s over the 4 s of watch times"
    );
}

/// A drain and an update of the same job at once: the update's batches count the
/// instances the drain has down and the drain counts the batch in flight, so at no
/// poll are more than `batch_size` (2) of the 6 instances down; both finish.
#[test]
fn a_drain_during_an_update_never_takes_more_than_a_batch_down_with_it() {
    let Some(mut c) = start("both", 6, 2) else {
        return;
    };
    let on = hosts_of(&c.job(&key("both")).unwrap());
    let busiest = on
        .iter()
        .max_by_key(|a| on.iter().filter(|b| b == a).count())
        .unwrap()
        .clone();
    let (status, body) = c
        .post("/v1/hosts/drain", &json!({"hosts": [busiest]}))
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_update(&c, "both", &spec("both", 6, "true; ", 2), None);
    assert_eq!(status, 201, "{body}");
    let mut most_down = 0;
    let u = wait_update(&mut c, "both", |job| {
        let down = job.instances.len() - running_instances(job);
        most_down = most_down.max(down);
        assert!(down <= 2, "{down} of 6 instances down: {job:#?}");
    });
    assert_eq!(u.state, UpdateState::RolledForward, "{u:#?}");
    assert!(u.instances.iter().all(|p| p.failures == 0), "{u:#?}");
    assert!(
        most_down > 0,
        "the update and the drain took instances down"
    );
    let started = Instant::now();
    loop {
        let h: Value = c.get(&format!("/v1/hosts/{busiest}")).unwrap();
        if h["mode"] == "DRAINED" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the drain did not finish: {h}\n{}",
            c.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let job = c.wait_for_all(&key("both"), TaskState::Running).unwrap();
    assert!(job
        .instances
        .iter()
        .all(|i| i.config == Some(u.to_config.clone())));
    assert!(
        !hosts_of(&job).contains(&busiest),
        "nothing left on the drained host"
    );
}

fn hosts_of(view: &JobView) -> Vec<String> {
    view.instances
        .iter()
        .filter_map(|i| i.current.as_ref()?.agent_id.clone())
        .collect()
}

#[test]
fn an_update_that_can_never_finish_says_why_and_wait_ends_early() {
    // 3 instances of a service (default `host: limit:1`) on 1 host: one runs, two
    // wait for a place that never comes.
    if !running_as_root("stuck update test") {
        return;
    }
    let mut c = Cluster::start(ClusterConfig::agents(1)).unwrap();
    let mut old = spec("stuck", 3, "", 1);
    old.as_object_mut().unwrap().remove("constraints");
    c.create_job(&old).unwrap();
    c.wait_for("one instance RUNNING, two PENDING", WAIT_ONE, |c| {
        let job = c.job(&key("stuck")).ok()?;
        let states: Vec<_> = job
            .instances
            .iter()
            .filter_map(|i| i.current.as_ref().map(|t| t.state))
            .collect();
        let pending = states.iter().filter(|s| **s == TaskState::Pending).count();
        (running_instances(&job) == 1 && pending == 2).then_some(())
    })
    .unwrap();
    let mut new = spec("stuck", 3, "true; ", 1);
    new.as_object_mut().unwrap().remove("constraints");
    let file = write(&c, "stuck.json", &new);
    let out = c.drover(&["job", "diff", &file]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("are PENDING now: host limit reached on 1 agent"),
        "{}",
        describe(&out)
    );
    let started = Instant::now();
    let out = c
        .drover(&["job", "update", &file, "--wait", "--timeout", "5m"])
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stderr.contains("cannot finish as things stand")
            && stderr.contains("PENDING: host limit reached on 1 agent"),
        "{}",
        describe(&out)
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "ended early, not at the timeout: {:?}",
        started.elapsed()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("must stay RUNNING 1s"),
        "{}",
        describe(&out)
    );
    // Who started it: the token's description, never `unknown`.
    assert!(
        stdout.contains("bootstrap admin token") && !stdout.contains("unknown"),
        "{}",
        describe(&out)
    );
}

const WAIT_ONE: Duration = Duration::from_secs(30);
