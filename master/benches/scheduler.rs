//! Scheduler throughput: 10,000 agents (100 racks, 4 zones) and 100,000 tasks in 100
//! jobs with constraints (a third plain, a third services with the implicit
//! one-per-host limit and `rack: limit:20`, a third pinned to zones), placed through
//! the pure core's CreateJob events; and `/metrics` of that master (100,000 tasks)
//! rendered: the state counted under the lock plus the text encoding. Not run in CI:
//! `cargo bench -p drover-master --bench scheduler`.

#![allow(clippy::unwrap_used)]

mod common;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use drover_common::spec::JobSpec;
use drover_master::core::{Core, CoreConfig, Event, Now};

const AGENTS: usize = 10_000;
const JOBS: usize = 100;
const PER_JOB: u32 = 1_000;

fn cluster() -> Core {
    let mut core = Core::new(CoreConfig::default(), Now::both(1_000), 1);
    for i in 0..AGENTS {
        let req = common::registration(
            i,
            32.0,
            128 << 30,
            [
                ("rack".to_string(), format!("r{}", i % 100)),
                ("zone".to_string(), format!("z{}", i % 4)),
            ]
            .into(),
        );
        core.handle(Event::Register(Box::new(req)), Now::both(1_000));
    }
    core
}

fn jobs() -> Vec<JobSpec> {
    (0..JOBS)
        .map(|j| {
            let (service, constraints) = match j % 3 {
                0 => (false, serde_json::json!({})),
                1 => (true, serde_json::json!({"rack": "limit:20"})),
                _ => (
                    false,
                    serde_json::json!({"zone": format!("z{}|z{}", j % 4, (j + 1) % 4)}),
                ),
            };
            serde_json::from_value(serde_json::json!({
                "role": "bench", "environment": "prod", "name": format!("job{j}"),
                "instances": PER_JOB, "service": service, "constraints": constraints,
                "task": {"processes": [{"name": "m", "cmdline": "true"}],
                         "resources": {"cpu": 0.25, "ram": "128MiB", "disk": "128MiB",
                                       "ports": ["http"]}}
            }))
            .unwrap()
        })
        .collect()
}

fn place_all(c: &mut Criterion) {
    let specs = jobs();
    let mut group = c.benchmark_group("scheduler");
    group.sample_size(10);
    group.throughput(Throughput::Elements(JOBS as u64 * u64::from(PER_JOB)));
    group.bench_function("100k_tasks_on_10k_agents", |b| {
        b.iter_batched(
            || (cluster(), specs.clone()),
            |(mut core, specs)| {
                for s in specs {
                    core.handle(Event::CreateJob(Box::new(s)), Now::both(2_000));
                }
                core
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
    // One checked run: everything placed.
    let mut core = cluster();
    for s in jobs() {
        core.handle(Event::CreateJob(Box::new(s)), Now::both(2_000));
    }
    let placed = core
        .agent_views()
        .iter()
        .map(|a| a.tasks.len())
        .sum::<usize>();
    assert_eq!(placed, JOBS * PER_JOB as usize, "every task placed");
}

fn render_metrics(c: &mut Criterion) {
    let mut core = cluster();
    for s in jobs() {
        core.handle(Event::CreateJob(Box::new(s)), Now::both(2_000));
    }
    assert_eq!(core.task_count(), JOBS * PER_JOB as usize);
    let mut group = c.benchmark_group("metrics");
    group.sample_size(20);
    group.bench_function("render_100k_tasks_10k_agents", |b| {
        b.iter(|| drover_master::metrics::render(&core.metrics_state()))
    });
    group.finish();
}

criterion_group!(benches, place_all, render_metrics);
criterion_main!(benches);
