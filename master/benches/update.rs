//! The update engine alone: a 10,000-instance service on 1,000 agents updated in
//! batches of 500 (watch 1 s), with every agent answering at once (placed tasks
//! start, stopped tasks end). Times every `Core::handle` call during the update and
//! reports the slowest, and the slowest of the calls that started a batch (the
//! batch decision: check the batch done, kill 500 tasks, create and place 500).
//! Times are the thread's CPU time, so other work on a shared machine does not
//! inflate them. Not run in CI: `cargo bench -p drover-master --bench update`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use drover_common::state::TaskState;
use drover_common::wire::{self, StatusUpdate, UpdateState};
use drover_master::core::{Core, CoreConfig, Event, Now, Reply};

const AGENTS: usize = 1_000;
const INSTANCES: u32 = 10_000;
const BATCH: u32 = 500;

/// Mirrors `Instant` over CPU time.
struct Cpu(Duration);

impl Cpu {
    fn now() -> Cpu {
        Cpu(common::cpu_time())
    }

    fn elapsed(&self) -> Duration {
        common::cpu_time().saturating_sub(self.0)
    }
}

fn spec(cmd: &str) -> drover_common::JobSpec {
    serde_json::from_value(serde_json::json!({
        "role": "bench", "environment": "prod", "name": "big",
        "instances": INSTANCES, "service": true, "constraints": {"host": "limit:20"},
        "task": {"processes": [{"name": "m", "cmdline": cmd}],
                 "resources": {"cpu": 0.1, "ram": "16MiB", "disk": "16MiB"}},
        "update": {"batch_size": BATCH, "watch": "1s"}
    }))
    .unwrap()
}

/// Plays every agent: reports the next status of each task that waits for one.
/// Returns the time of the slowest handle call.
fn answer(core: &mut Core, now: u64, seqs: &mut BTreeMap<String, u64>) -> Duration {
    let mut per_agent: BTreeMap<String, Vec<StatusUpdate>> = BTreeMap::new();
    for a in core.agent_views() {
        for id in &a.tasks {
            let Some(t) = core.task(id) else { continue };
            let next = match t.status.state {
                TaskState::Assigned => TaskState::Running,
                TaskState::Killing | TaskState::Restarting => TaskState::Killed,
                _ => continue,
            };
            let seq = seqs.entry(id.clone()).or_insert(0);
            *seq += 1;
            per_agent
                .entry(a.agent_id.clone())
                .or_default()
                .push(StatusUpdate {
                    task_id: id.clone(),
                    seq: *seq,
                    state: next,
                    exit_reason: None,
                    message: String::new(),
                    timestamp_ms: now,
                    processes: Vec::new(),
                    processes_omitted: None,
                });
        }
    }
    let mut slowest = Duration::ZERO;
    for (agent, reports) in per_agent {
        let t = Cpu::now();
        core.handle(Event::StatusReports { agent, reports }, Now::both(now));
        slowest = slowest.max(t.elapsed());
    }
    slowest
}

fn heartbeat_all(core: &mut Core, now: u64) {
    for i in 0..AGENTS {
        let agent = format!("agent-{i:04}");
        let (version, _) = core.agent_version(&agent).unwrap();
        let request = wire::HeartbeatRequest {
            task_digest: 0,
            assignments_version: version,
            tasks: None,
        };
        core.handle(Event::Heartbeat { agent, request }, Now::both(now));
    }
}

fn main() {
    let mut now = 1_000;
    let mut core = Core::new(CoreConfig::default(), Now::both(now), 1);
    for i in 0..AGENTS {
        let req = common::registration(i, 64.0, 64 << 30, BTreeMap::new());
        core.handle(Event::Register(Box::new(req)), Now::both(now));
    }
    let mut seqs = BTreeMap::new();
    core.handle(Event::CreateJob(Box::new(spec("v1"))), Now::both(now));
    answer(&mut core, now, &mut seqs);
    now += 10_000;
    heartbeat_all(&mut core, now);

    let t = Cpu::now();
    let out = core.handle(
        Event::StartUpdate {
            job: "bench/prod/big".into(),
            spec: Box::new(spec("v2")),
            instances: None,
            user: "bench".into(),
        },
        Now::both(now),
    );
    let mut batch_decisions = vec![t.elapsed()];
    assert!(matches!(out.reply, Ok(Reply::Update(_))), "{:?}", out.reply);
    let mut slowest_report = Duration::ZERO;
    let mut last_heartbeat = now;
    let started = Cpu::now();
    loop {
        slowest_report = slowest_report.max(answer(&mut core, now, &mut seqs));
        // Time passes to the next timer (the watch ends), as the runtime would.
        let wake = core.next_wake().unwrap().max(now);
        now = wake;
        let before = core.update_view("bench/prod/big").unwrap().events.len();
        let t = Cpu::now();
        core.handle(Event::Tick, Now::both(now));
        let took = t.elapsed();
        let u = core.update_view("bench/prod/big").unwrap();
        if u.events[before..]
            .iter()
            .any(|e| e.message.starts_with("batch:") || e.message == "ROLLED_FORWARD")
        {
            batch_decisions.push(took);
        }
        if u.state.is_terminal() {
            assert_eq!(u.state, UpdateState::RolledForward);
            break;
        }
        if now >= last_heartbeat + 1_000 {
            heartbeat_all(&mut core, now);
            last_heartbeat = now;
        }
    }
    let worst = batch_decisions.iter().max().unwrap();
    let each: Vec<String> = batch_decisions
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
        .collect();
    println!(
        "each batch decision (ms, the first is the start request): {}",
        each.join(" ")
    );
    println!(
        "update of {INSTANCES} instances in batches of {BATCH}: {} batch decisions, \
         slowest {:.2} ms, mean {:.2} ms; slowest status report event {:.2} ms; \
         whole simulated update {:.1} s of CPU",
        batch_decisions.len(),
        worst.as_secs_f64() * 1e3,
        batch_decisions.iter().sum::<Duration>().as_secs_f64() * 1e3 / batch_decisions.len() as f64,
        slowest_report.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64()
    );
}
