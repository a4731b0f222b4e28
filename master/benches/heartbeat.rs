//! Heartbeat handling at 10,000 agents: the master core's CPU per heartbeat and the
//! share of one core the cell's heartbeats and agent sweeps take at the told
//! interval. 10,000 agents carry 100,000 RUNNING tasks (10 each, 1,000 services of
//! 100 instances), `CoreConfig::default()` (1 s minimum interval, 100 heartbeats a
//! second at most: 10,000 agents are told 100 s). One round is 100 s of cell time:
//! every agent heartbeats once (its task digest matching, as in steady state), 100 a
//! second in agent order, and the core's `Tick` runs every 100 ms as the runtime
//! wakes it (the agent sweep every second). Numbers are this thread's CPU time (from
//! /proc/thread-self/schedstat: on a shared machine the wall clock counts other
//! processes' turns too), medians over rounds. The HTTP layer (TLS, JSON, the lock)
//! is not counted. Not run in CI: `cargo bench -p drover-master --bench heartbeat`.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use drover_common::spec::JobSpec;
use drover_common::state::TaskState;
use drover_common::wire::{self, AgentTaskReport, HeartbeatRequest, StatusUpdate};
use drover_master::core::{Core, CoreConfig, Event, Now, Reply};

const AGENTS: usize = 10_000;
const JOBS: usize = 1_000;
const PER_JOB: u32 = 100;
const ROUNDS: usize = 5;
/// Simulated seconds per round: one told interval at 10,000 agents.
const ROUND_S: u64 = 100;

fn register(core: &mut Core, i: usize, now: u64) -> u64 {
    let req = common::registration(
        i,
        32.0,
        128 << 30,
        [("rack".to_string(), format!("r{}", i % 100))].into(),
    );
    match core
        .handle(Event::Register(Box::new(req)), Now::both(now))
        .reply
    {
        Ok(Reply::Registered(r)) => r.heartbeat_interval_ms,
        r => panic!("{r:?}"),
    }
}

fn spec(j: usize) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "role": "bench", "environment": "prod", "name": format!("job{j}"),
        "instances": PER_JOB, "service": true,
        "constraints": {"host": "limit:1"},
        "task": {"processes": [{"name": "m", "cmdline": "sleep 1000"}],
                 "resources": {"cpu": 0.25, "ram": "128MiB", "disk": "128MiB"}}
    }))
    .unwrap()
}

/// Every agent reports its tasks RUNNING; returns each agent's heartbeat request
/// in steady state (digest and version of its set).
fn run_all(core: &mut Core, now: u64) -> Vec<HeartbeatRequest> {
    let mut requests = Vec::with_capacity(AGENTS);
    for i in 0..AGENTS {
        let id = common::agent_id(i);
        let set = core.assignment_set(&id).unwrap();
        let reports: Vec<StatusUpdate> = set
            .assignments
            .iter()
            .map(|a| StatusUpdate {
                task_id: a.task.task_id.clone(),
                seq: 1,
                state: TaskState::Running,
                exit_reason: None,
                message: String::new(),
                timestamp_ms: now,
                processes: Vec::new(),
                processes_omitted: None,
            })
            .collect();
        if !reports.is_empty() {
            core.handle(
                Event::StatusReports {
                    agent: id.clone(),
                    reports,
                },
                Now::both(now),
            );
        }
        let set = core.assignment_set(&id).unwrap();
        let mut request = HeartbeatRequest {
            task_digest: wire::task_set_digest(
                set.assignments.iter().map(|a| a.task.task_id.as_str()),
            ),
            assignments_version: set.version,
            tasks: Some(
                set.assignments
                    .iter()
                    .map(|a| AgentTaskReport {
                        task_id: a.task.task_id.clone(),
                        state: TaskState::Running,
                        seq: 1,
                    })
                    .collect(),
            ),
        };
        // The full set the master asks for after a registration, once.
        core.handle(
            Event::Heartbeat {
                agent: id,
                request: request.clone(),
            },
            Now::both(now),
        );
        request.tasks = None;
        requests.push(request);
    }
    requests
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut now = 1_000_000;
    let mut core = Core::new(CoreConfig::default(), Now::both(now), 1);
    let mut interval = 0;
    for i in 0..AGENTS {
        interval = register(&mut core, i, now);
    }
    for j in 0..JOBS {
        core.handle(Event::CreateJob(Box::new(spec(j))), Now::both(now));
    }
    let requests = run_all(&mut core, now);
    println!(
        "setup: {AGENTS} agents, {} tasks; the last registration was told {interval} ms",
        core.task_count()
    );
    let per_second = AGENTS / ROUND_S as usize;
    let mut per_heartbeat = Vec::new();
    let mut per_tick = Vec::new();
    let mut share = Vec::new();
    for round in 0..ROUNDS {
        let (mut hb_cpu, mut tick_cpu) = (Duration::ZERO, Duration::ZERO);
        let mut ticks = 0u32;
        let mut full_sets = 0u32;
        for s in 0..ROUND_S as usize {
            // 100 heartbeats spread over the second, a Tick every 100 ms.
            for tenth in 0..10 {
                now += 100;
                let c = common::cpu_time();
                core.handle(Event::Tick, Now::both(now));
                tick_cpu += common::cpu_time() - c;
                ticks += 1;
                let c = common::cpu_time();
                for k in 0..per_second / 10 {
                    let i = s * per_second + tenth * (per_second / 10) + k;
                    let out = core.handle(
                        Event::Heartbeat {
                            agent: common::agent_id(i),
                            request: requests[i].clone(),
                        },
                        Now::both(now),
                    );
                    match out.reply {
                        Ok(Reply::Heartbeat(r)) => {
                            assert!(!r.reregister, "{r:?}");
                            full_sets += u32::from(r.send_full_task_set);
                            assert_eq!(r.heartbeat_interval_ms, Some(100_000));
                        }
                        r => panic!("{r:?}"),
                    }
                }
                hb_cpu += common::cpu_time() - c;
            }
        }
        let total = hb_cpu + tick_cpu;
        let hb = hb_cpu / AGENTS as u32;
        let tick = tick_cpu / ticks;
        let pct = total.as_secs_f64() / ROUND_S as f64 * 100.0;
        println!(
            "round {round}: {AGENTS} heartbeats + {ticks} ticks over {ROUND_S} s of cell time: \
             {total:?} CPU ({pct:.3} % of one core); per heartbeat {hb:?}, per tick {tick:?}; \
             {full_sets} answers asked for the full set"
        );
        per_heartbeat.push(hb);
        per_tick.push(tick);
        share.push(total);
    }
    let hb = median(per_heartbeat);
    let total = median(share);
    println!(
        "median of {ROUNDS} rounds: per heartbeat {hb:?}, per tick (sweep included) {:?}; \
         heartbeats and ticks at 10,000 agents told 100 s: {:.3} % of one core; \
         the same heartbeats at the old fixed 1 s (10,000/s): {:.1} % of one core",
        median(per_tick),
        total.as_secs_f64() / ROUND_S as f64 * 100.0,
        hb.as_secs_f64() * AGENTS as f64 * 100.0,
    );
}
