//! Drain decisions at scale: 10,000 agents in 100 racks carrying 100,000 RUNNING
//! tasks, 10 per agent (1,000 services of 100 instances, each pinned to one rack
//! with `host: limit:2`; a third without a policy, a third keeping 90% healthy, a
//! third allowing 5 disrupted at once), then a drain of 1,000 hosts at once (10 in
//! every rack). Agents are simulated in the core's own terms (status reports:
//! drained tasks KILLED, replacements RUNNING) between rounds; the numbers are the
//! time the core takes for the drain request and for each round (a Tick that runs
//! the drain round, at most `drain_round_max_tasks` task moves, and places the
//! replacements), until every host is DRAINED, as wall-clock time and as this
//! thread's CPU time (from /proc/thread-self/schedstat: on a shared machine the
//! wall clock counts other processes' turns too). Not run in CI:
//! `cargo bench -p drover-master --bench drain`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use drover_common::spec::JobSpec;
use drover_common::state::TaskState;
use drover_common::wire::{MaintenanceMode, StatusUpdate};
use drover_common::DesiredState;
use drover_master::core::{Core, CoreConfig, Event, MaintenanceOp, Now};

const AGENTS: usize = 10_000;
const JOBS: usize = 1_000;
const PER_JOB: u32 = 100;
const DRAINED: usize = 1_000;

fn cluster(now: u64) -> Core {
    let mut core = Core::new(CoreConfig::default(), Now::both(now), 1);
    for i in 0..AGENTS {
        let req = common::registration(
            i,
            32.0,
            128 << 30,
            [("rack".to_string(), format!("r{}", i % 100))].into(),
        );
        core.handle(Event::Register(Box::new(req)), Now::both(now));
    }
    core
}

/// The drained hosts: the first 100 of every 1,000 agents, so 10 in every rack.
fn drained(i: usize) -> bool {
    (i / 100).is_multiple_of(10)
}

fn spec(j: usize) -> JobSpec {
    let policy = match j % 3 {
        0 => serde_json::Value::Null,
        1 => serde_json::json!({"min_healthy_percent": 90}),
        _ => serde_json::json!({"max_disrupted": 5}),
    };
    serde_json::from_value(serde_json::json!({
        "role": "bench", "environment": "prod", "name": format!("job{j}"),
        "instances": PER_JOB, "service": true, "sla_policy": policy,
        "constraints": {"rack": format!("r{}", j % 100), "host": "limit:2"},
        "task": {"processes": [{"name": "m", "cmdline": "sleep 1000"}],
                 "resources": {"cpu": 0.25, "ram": "128MiB", "disk": "128MiB"}}
    }))
    .unwrap()
}

/// Every agent acts on its assignment set: tasks to shut down end KILLED, tasks not
/// started yet report RUNNING.
fn agents_act(core: &mut Core, seqs: &mut HashMap<String, u64>, now: u64) -> usize {
    let mut reported = 0;
    for i in 0..AGENTS {
        let id = common::agent_id(i);
        let Some(set) = core.assignment_set(&id) else {
            continue;
        };
        let mut reports = Vec::new();
        for a in set.assignments {
            let state = match (a.desired, a.started) {
                (DesiredState::Shutdown, _) => TaskState::Killed,
                (DesiredState::Running, false) => TaskState::Running,
                (DesiredState::Running, true) => continue,
            };
            let seq = seqs.entry(a.task.task_id.clone()).or_insert(0);
            *seq += 1;
            reports.push(StatusUpdate {
                task_id: a.task.task_id,
                seq: *seq,
                state,
                exit_reason: None,
                message: String::new(),
                timestamp_ms: now,
                processes: Vec::new(),
                processes_omitted: None,
            });
        }
        if !reports.is_empty() {
            reported += reports.len();
            core.handle(Event::StatusReports { agent: id, reports }, Now::both(now));
        }
    }
    reported
}

fn main() {
    let mut now = 1_000_000;
    let t = Instant::now();
    let mut core = cluster(now);
    for j in 0..JOBS {
        core.handle(Event::CreateJob(Box::new(spec(j))), Now::both(now));
    }
    let mut seqs = HashMap::new();
    agents_act(&mut core, &mut seqs, now);
    println!(
        "setup: {AGENTS} agents, {} tasks RUNNING in {:?}",
        core.task_count(),
        t.elapsed()
    );
    now += 1_000;
    let hosts: Vec<String> = (0..AGENTS)
        .filter(|i| drained(*i))
        .map(common::agent_id)
        .collect();
    assert_eq!(hosts.len(), DRAINED);
    let on_drained: u32 = core
        .host_views_named(&hosts)
        .unwrap()
        .iter()
        .map(|h| h.tasks_left)
        .sum();
    println!("{on_drained} tasks on the {DRAINED} hosts to drain");
    let (t, c) = (Instant::now(), common::cpu_time());
    core.handle(
        Event::Maintenance {
            op: MaintenanceOp::Drain { deadline_ms: None },
            hosts: hosts.clone(),
        },
        Now::both(now),
    );
    let request = (t.elapsed(), common::cpu_time() - c);
    println!(
        "drain request for {DRAINED} hosts (first round included): {:?} wall, {:?} CPU",
        request.0, request.1
    );
    let mut rounds: Vec<Duration> = Vec::new();
    let mut cpu: Vec<Duration> = Vec::new();
    loop {
        let reported = agents_act(&mut core, &mut seqs, now);
        now += 200;
        let (t, c) = (Instant::now(), common::cpu_time());
        core.handle(Event::Tick, Now::both(now));
        rounds.push(t.elapsed());
        cpu.push(common::cpu_time() - c);
        let left = core
            .host_views_named(&hosts)
            .unwrap()
            .iter()
            .filter(|h| h.mode != MaintenanceMode::Drained)
            .count();
        if left == 0 {
            break;
        }
        assert!(
            rounds.len() < 1_000,
            "the drain did not finish: {left} hosts left, {reported} reports last round"
        );
    }
    let stats = |v: &[Duration]| {
        let max = v.iter().max().copied().unwrap_or_default();
        (v.iter().sum::<Duration>() / v.len() as u32, max)
    };
    let (wall_mean, wall_max) = stats(&rounds);
    let (cpu_mean, cpu_max) = stats(&cpu);
    println!(
        "{} rounds until all {DRAINED} hosts DRAINED; per round: wall mean {wall_mean:?}, max {wall_max:?}; CPU mean {cpu_mean:?}, max {cpu_max:?}",
        rounds.len()
    );
    let ms: Vec<String> = cpu
        .iter()
        .map(|c| format!("{:.1}", c.as_secs_f64() * 1e3))
        .collect();
    println!("CPU per round (ms): {}", ms.join(" "));
}
