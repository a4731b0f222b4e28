//! Preemption throughput: 10,000 agents full of preemptible tasks (4 of 1 cpu on
//! each 4-cpu agent, 40,000 tasks), then 1,000 production tasks (10 services of 100
//! instances) arriving through CreateJob. Each needs one victim: the core finds it,
//! moves it to PREEMPTING and reserves its room; then every victim's KILLED report
//! arrives (as agents would relay them, one event per agent) and the preemptors are
//! placed on the reserved room. Prints both phases and placements per second (the
//! issue asks >= 10,000/s). Not run in CI: `cargo bench -p drover-master --bench
//! preemption`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use drover_common::spec::JobSpec;
use drover_common::state::TaskState;
use drover_common::wire::StatusUpdate;
use drover_master::core::{Core, CoreConfig, Event, Now};

const AGENTS: usize = 10_000;
const FILL_JOBS: usize = 40;
const FILL_PER_JOB: u32 = 1_000;
const PROD_JOBS: usize = 10;
const PROD_PER_JOB: u32 = 100;

fn spec(name: &str, instances: u32, tier: &str, service: bool) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "role": "bench", "environment": "prod", "name": name, "tier": tier,
        "instances": instances, "service": service,
        "task": {"processes": [{"name": "m", "cmdline": "true"}],
                 "resources": {"cpu": 1, "ram": "1GiB", "disk": "1GiB"}}
    }))
    .unwrap()
}

fn cluster() -> Core {
    let mut core = Core::new(CoreConfig::default(), Now::both(1_000), 1);
    for i in 0..AGENTS {
        let req = common::registration(i, 4.0, 16 << 30, BTreeMap::new());
        core.handle(Event::Register(Box::new(req)), Now::both(1_000));
    }
    for j in 0..FILL_JOBS {
        let s = spec(&format!("batch{j}"), FILL_PER_JOB, "preemptible", false);
        core.handle(Event::CreateJob(Box::new(s)), Now::both(1_500));
    }
    let free: f64 = core.agent_views().iter().map(|a| a.free.cpu).sum();
    assert!(free < 0.5, "the cluster is full ({free} cpus free)");
    core
}

fn main() {
    let mut core = cluster();
    let t0 = Instant::now();
    for j in 0..PROD_JOBS {
        let s = spec(&format!("prod{j}"), PROD_PER_JOB, "preferred", true);
        core.handle(Event::CreateJob(Box::new(s)), Now::both(2_000));
    }
    let decide = t0.elapsed();
    // The victims, per agent (untimed: what the agents would report).
    let mut victims: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for j in 0..FILL_JOBS {
        let view = core.job_view(&format!("bench/prod/batch{j}")).unwrap();
        for inst in view.instances {
            for t in inst.history {
                if t.state == TaskState::Preempting {
                    victims
                        .entry(t.agent_id.clone().unwrap())
                        .or_default()
                        .push(t.task_id);
                }
            }
        }
    }
    let count: usize = victims.values().map(Vec::len).sum();
    assert_eq!(count, PROD_JOBS * PROD_PER_JOB as usize, "one victim each");
    let t1 = Instant::now();
    for (agent, tasks) in victims {
        let reports = tasks
            .into_iter()
            .map(|id| StatusUpdate {
                task_id: id,
                seq: 1,
                state: TaskState::Killed,
                exit_reason: None,
                message: "killed".to_string(),
                timestamp_ms: 3_000,
                processes: Vec::new(),
                processes_omitted: None,
            })
            .collect();
        core.handle(Event::StatusReports { agent, reports }, Now::both(3_000));
    }
    let place = t1.elapsed();
    let total = PROD_JOBS * PROD_PER_JOB as usize;
    for j in 0..PROD_JOBS {
        let view = core.job_view(&format!("bench/prod/prod{j}")).unwrap();
        let assigned = view
            .instances
            .iter()
            .filter(|i| i.current.as_ref().unwrap().state == TaskState::Assigned)
            .count();
        assert_eq!(assigned, PROD_PER_JOB as usize, "prod{j} placed");
    }
    let all = decide + place;
    println!(
        "preemption: {total} production tasks on {AGENTS} full agents: victims chosen in {:.1} ms, \
         placed after the kills in {:.1} ms; {:.0} placements/s",
        decide.as_secs_f64() * 1e3,
        place.as_secs_f64() * 1e3,
        total as f64 / all.as_secs_f64()
    );
}
