//! A cell of 10,000 hosts and 1,000,000 tasks on one master (issue 31, part 2): the
//! real master (`runtime::Master`: the core behind its lock, the group-commit
//! writer on the real SQLite store in a data dir), 10,000 in-process simulated
//! agents registered with it, and clients that submit a job mix of 1,000,000 tasks
//! at most `CELL_CLIENTS` at a time, each waiting for its commit as an HTTP client
//! of the master does (the HTTP layer itself is not in the run):
//!
//! - jobs of 10,000 instances (the spec's maximum): plain, spread over racks
//!   (`spread: [{attribute: rack}]`), services (one per host) with `rack: limit:N`,
//!   one `placement: binpack` and one `placement: spread`;
//! - zone-pinned jobs of 1,000 instances, half of them also with `rack: limit:50`;
//! - many small jobs of 1 to 100 instances fill the rest.
//!
//! Hosts: 64 CPUs, 256 GiB, 1,000 ports, in racks of 100 consecutive hosts, 4
//! zones of consecutive racks. Printed: the time until every task is placed and
//! committed; the time until every task is RUNNING (each simulated agent reads its
//! assignment set and reports its tasks RUNNING through the core's status events,
//! committed); the process's peak and current RSS and its CPU (getrusage: every
//! thread, the simulated agents' own small share included); the store's size on
//! disk; a restart: a fresh process (this binary again, `CELL_RESTART=<dir>`) opens
//! the store with `drover_master::start` as the master binary does and is timed
//! until `GET /health` answers, with its own RSS; and placement quality: instances
//! per rack (min/max/stddev) for a spread job and a plain one, hosts used by the
//! binpack and the spread-placement job. Heartbeats and timers are not part of the
//! run (the heartbeat bench measures them).
//!
//! Not run in CI: `cargo bench -p drover-master --bench cell` (release). Sizes:
//! `CELL_TASKS` (default 1,000,000), `CELL_HOSTS` (default 10,000), `CELL_CLIENTS`
//! (concurrent clients, default 16), `CELL_DIR` (the data dir, kept; default a
//! temporary dir, removed).

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use drover_common::spec::JobSpec;
use drover_common::state::TaskState;
use drover_common::wire::StatusUpdate;
use drover_master::core::{Core, CoreConfig, Event, Reply};
use drover_master::runtime::Master;
use drover_master::store::{SqliteStore, Writer, DB_FILE};
use serde_json::json;

/// Hosts per rack.
const RACK: usize = 100;
/// The spec's maximum instances of a job.
const BIG: u32 = 10_000;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace(['_', ','], "").parse().ok())
        .unwrap_or(default)
}

/// The rack and zone of host `i` in a cell of `hosts`.
fn rack_zone(i: usize, hosts: usize) -> (usize, usize) {
    let racks = hosts.div_ceil(RACK).max(1);
    let rack = i / RACK;
    (rack, rack * 4 / racks)
}

/// What a job of the mix is, for the quality report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Plain,
    SpreadRack,
    Service,
    Zone,
    Binpack,
    SpreadPlacement,
    Small,
}

/// Appends a job of `kind` with `instances` and the spec fields `extra` to `out`.
fn add(out: &mut Vec<(Kind, JobSpec)>, kind: Kind, instances: u32, extra: serde_json::Value) {
    let n = out.len();
    let mut spec = json!({
        "role": format!("role{}", n % 50), "environment": "prod",
        "name": format!("{kind:?}-{n:05}").to_lowercase(),
        "instances": instances,
        "task": {"processes": [{"name": "m", "cmdline": "sleep 1000000"}],
                 "resources": {"cpu": 0.25, "ram": "128MiB", "disk": "128MiB",
                               "ports": ["http"]}}
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    out.push((kind, serde_json::from_value(spec).unwrap()));
}

/// The job mix: (kind, spec) adding up to `tasks` instances, in a fixed shuffled
/// order (big and small jobs interleaved, as a cell's submissions come).
fn mix(tasks: usize, hosts: usize) -> Vec<(Kind, JobSpec)> {
    let big = (BIG as usize).min((tasks / 100).max(100)) as u32;
    let racks = hosts.div_ceil(RACK).max(1);
    let mut out: Vec<(Kind, JobSpec)> = Vec::new();
    let mut left = tasks;
    let share = |percent: usize| tasks * percent / 100 / big as usize;
    for _ in 0..share(30) {
        add(&mut out, Kind::Plain, big, json!({}));
    }
    for _ in 0..share(10) {
        add(
            &mut out,
            Kind::SpreadRack,
            big,
            json!({"spread": [{"attribute": "rack"}]}),
        );
    }
    // One per host (a service's implicit `host: limit:1`), at most a fifth over an
    // even share per rack.
    let service = big.min(hosts as u32);
    let per_rack = service.div_ceil(racks as u32);
    for _ in 0..(tasks * 10 / 100 / service as usize) {
        add(
            &mut out,
            Kind::Service,
            service,
            json!({"service": true,
                   "constraints": {"rack": format!("limit:{}", per_rack + per_rack / 5 + 1)}}),
        );
    }
    let zoned = (big / 10).max(1);
    for j in 0..(tasks * 20 / 100 / zoned as usize) {
        let mut constraints = json!({"zone": format!("z{}", j % 4)});
        if j % 2 == 1 {
            constraints["rack"] = json!("limit:50");
        }
        add(
            &mut out,
            Kind::Zone,
            zoned,
            json!({"constraints": constraints}),
        );
    }
    add(
        &mut out,
        Kind::Binpack,
        big,
        json!({"placement": "binpack"}),
    );
    add(
        &mut out,
        Kind::SpreadPlacement,
        big,
        json!({"placement": "spread"}),
    );
    left -= out
        .iter()
        .map(|(_, s)| s.instances as usize)
        .sum::<usize>()
        .min(left);
    let mut j = 0usize;
    while left > 0 {
        let n = (1 + (j * 37) % 100).min(left);
        add(&mut out, Kind::Small, n as u32, json!({}));
        left -= n;
        j += 1;
    }
    // Fisher-Yates with a fixed xorshift: the same order on every run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out
}

/// Applies `events` to the master with at most `clients` in flight, each waiting
/// for its commit (`Master::apply`); panics on any error.
async fn apply_all(
    master: &Arc<Master>,
    events: impl IntoIterator<Item = Event>,
    clients: usize,
) -> usize {
    let mut set = tokio::task::JoinSet::new();
    let mut done = 0;
    for e in events {
        while set.len() >= clients {
            set.join_next().await.unwrap().unwrap();
            done += 1;
        }
        let m = master.clone();
        set.spawn(async move {
            match m.apply(e).await {
                Ok(_) => {}
                Err(e) => panic!("apply failed: {e}"),
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
        done += 1;
    }
    done
}

/// Each agent reads its assignment set and reports every task in it RUNNING.
async fn report_running(master: &Arc<Master>, hosts: usize, clients: usize) {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..hosts {
        while set.len() >= clients {
            set.join_next().await.unwrap().unwrap();
        }
        let m = master.clone();
        set.spawn(async move {
            let agent = common::agent_id(i);
            let now = drover_common::state::now_ms();
            let reports: Vec<StatusUpdate> = m
                .read(|c| c.assignment_set(&agent))
                .unwrap()
                .assignments
                .into_iter()
                .map(|a| StatusUpdate {
                    task_id: a.task.task_id,
                    seq: 1,
                    state: TaskState::Running,
                    exit_reason: None,
                    message: String::new(),
                    timestamp_ms: now,
                    processes: Vec::new(),
                    processes_omitted: None,
                })
                .collect();
            if reports.is_empty() {
                return;
            }
            match m.apply(Event::StatusReports { agent, reports }).await {
                Ok(Reply::Ack(_)) => {}
                other => panic!("status reports: {other:?}"),
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
}

/// How many of the core's tasks are in `state` (every tier).
fn in_state(core: &Core, state: TaskState) -> u64 {
    core.metrics_state()
        .tasks_by_state
        .iter()
        .filter(|((s, _), _)| *s == state)
        .map(|(_, n)| n)
        .sum()
}

/// min, max, stddev of `counts`.
fn stats(counts: &[u32]) -> (u32, u32, f64) {
    let n = counts.len().max(1) as f64;
    let mean = counts.iter().map(|&c| f64::from(c)).sum::<f64>() / n;
    let var = counts
        .iter()
        .map(|&c| (f64::from(c) - mean).powi(2))
        .sum::<f64>()
        / n;
    (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
        var.sqrt(),
    )
}

/// Bytes of the store's files (database, WAL, shared memory) in `dir`.
fn store_bytes(dir: &Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|s| std::fs::metadata(dir.join(format!("{DB_FILE}{s}"))).ok())
        .map(|m| m.len())
        .sum()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The restarted master, in this process (started by the parent with
/// `CELL_RESTART=<dir>`): open the store as the master binary does, serve, and
/// time it until `GET /health` answers.
fn restart_child(dir: PathBuf) {
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let h = drover_master::start(common::config(&dir)).await.unwrap();
        let served = reqwest::get(format!("http://{}/health", h.addr))
            .await
            .unwrap();
        assert!(served.status().is_success());
        let el = t0.elapsed();
        let (tasks, running) = h
            .master
            .read(|c| (c.task_count(), in_state(c, TaskState::Running)));
        let cpu = common::process_cpu();
        println!(
            "restart: {tasks} tasks loaded and serving (GET /health answered) in {:.2} s; \
             {running} RUNNING; restarted master RSS peak {:.0} MiB, now {:.0} MiB; CPU {:.2} s",
            el.as_secs_f64(),
            mib(common::proc_status_bytes("VmHWM")),
            mib(common::proc_status_bytes("VmRSS")),
            cpu.as_secs_f64(),
        );
        h.stop().await.unwrap();
    });
}

fn main() {
    if let Ok(dir) = std::env::var("CELL_RESTART") {
        restart_child(PathBuf::from(dir));
        return;
    }
    let tasks = env_usize("CELL_TASKS", 1_000_000);
    let hosts = env_usize("CELL_HOSTS", 10_000);
    let clients = env_usize("CELL_CLIENTS", 16).max(1);
    let (_tmp, dir) = match std::env::var("CELL_DIR") {
        Ok(d) => {
            let d = PathBuf::from(d);
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            (None, d)
        }
        Err(_) => {
            let t = tempfile::tempdir().unwrap();
            let d = t.path().to_path_buf();
            (Some(t), d)
        }
    };
    println!(
        "cell: {tasks} tasks on {hosts} hosts, {clients} clients, store {}; load average {}",
        dir.display(),
        common::load_average()
    );
    let specs = mix(tasks, hosts);
    let mut sizes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (k, s) in &specs {
        let e = sizes.entry(format!("{k:?}")).or_default();
        e.0 += 1;
        e.1 += s.instances as usize;
    }
    println!("mix (jobs, tasks): {sizes:?}");
    let watched: HashMap<String, Kind> = {
        let mut first: HashMap<Kind, String> = HashMap::new();
        for (k, s) in &specs {
            first
                .entry(*k)
                .or_insert_with(|| format!("{}/{}/{}", s.role, s.environment, s.name));
        }
        first.into_iter().map(|(k, j)| (j, k)).collect()
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(&dir.join(DB_FILE)).unwrap();
    let core = Core::new(
        CoreConfig::default(),
        drover_master::runtime::now(),
        drover_master::runtime::seed(),
    );
    let writer = Writer::start(Box::new(store), core.seq());
    let master = Master::new(core, writer);

    rt.block_on(async {
        let t = Instant::now();
        let registrations = (0..hosts).map(|i| {
            let (rack, zone) = rack_zone(i, hosts);
            let req = common::registration(
                i,
                64.0,
                256 << 30,
                [
                    ("rack".to_string(), format!("r{rack:03}")),
                    ("zone".to_string(), format!("z{zone}")),
                ]
                .into(),
            );
            Event::Register(Box::new(req))
        });
        apply_all(&master, registrations, clients).await;
        println!(
            "{hosts} agents registered in {:.2} s",
            t.elapsed().as_secs_f64()
        );
    });

    let cpu0 = common::process_cpu();
    let t0 = Instant::now();
    rt.block_on(apply_all(
        &master,
        specs
            .into_iter()
            .map(|(_, s)| Event::CreateJob(Box::new(s))),
        clients,
    ));
    let placed_in = t0.elapsed();
    let cpu_placed = common::process_cpu() - cpu0;
    let (count, assigned, pending) = master.read(|c| {
        (
            c.task_count(),
            in_state(c, TaskState::Assigned),
            in_state(c, TaskState::Pending),
        )
    });
    println!(
        "placed and committed: {assigned} of {count} tasks ASSIGNED ({pending} PENDING) in {:.2} s \
         ({:.0} tasks/s), CPU {:.2} s; load average {}",
        placed_in.as_secs_f64(),
        assigned as f64 / placed_in.as_secs_f64(),
        cpu_placed.as_secs_f64(),
        common::load_average()
    );
    println!(
        "after placement: RSS peak {:.0} MiB, now {:.0} MiB ({:.0} bytes per task); store {:.0} MiB",
        mib(common::proc_status_bytes("VmHWM")),
        mib(common::proc_status_bytes("VmRSS")),
        common::proc_status_bytes("VmRSS") as f64 / count.max(1) as f64,
        mib(store_bytes(&dir))
    );

    let t1 = Instant::now();
    rt.block_on(report_running(&master, hosts, clients));
    let running_in = t1.elapsed();
    let cpu_all = common::process_cpu() - cpu0;
    let running = master.read(|c| in_state(c, TaskState::Running));
    println!(
        "RUNNING and committed: {running} tasks, {:.2} s after placement, {:.2} s from the first \
         job; CPU since the first job {:.2} s; load average {}",
        running_in.as_secs_f64(),
        (placed_in + running_in).as_secs_f64(),
        cpu_all.as_secs_f64(),
        common::load_average()
    );
    println!(
        "master RSS: peak (VmHWM) {:.0} MiB, now (VmRSS) {:.0} MiB, {:.0} bytes per task",
        mib(common::proc_status_bytes("VmHWM")),
        mib(common::proc_status_bytes("VmRSS")),
        common::proc_status_bytes("VmRSS") as f64 / count.max(1) as f64,
    );
    println!(
        "store with the WAL before close: {:.0} MiB",
        mib(store_bytes(&dir))
    );

    // Placement quality, from the core as the job views show it.
    let racks_of: HashMap<String, usize> = (0..hosts)
        .map(|i| (common::agent_id(i), rack_zone(i, hosts).0))
        .collect();
    let racks = hosts.div_ceil(RACK).max(1);
    let mut quality: Vec<(Kind, String, Vec<u32>, usize)> = master.read(|c| {
        watched
            .iter()
            .filter_map(|(job, kind)| {
                let v = c.job_view(job)?;
                let mut per_rack = vec![0u32; racks];
                let mut used: HashSet<String> = HashSet::new();
                for t in v.instances.iter().filter_map(|i| i.current.as_ref()) {
                    if let Some(a) = &t.agent_id {
                        per_rack[racks_of[a]] += 1;
                        used.insert(a.clone());
                    }
                }
                Some((*kind, job.clone(), per_rack, used.len()))
            })
            .collect()
    });
    quality.sort_by_key(|(k, ..)| format!("{k:?}"));
    for (kind, job, per_rack, used) in &quality {
        let (min, max, sd) = stats(per_rack);
        let n: u32 = per_rack.iter().sum();
        println!(
            "quality {kind:?} {job}: {n} instances on {used} hosts; per rack ({racks} racks) \
             min {min}, max {max}, stddev {sd:.1}"
        );
    }

    master.close();
    drop(master);
    drop(rt);
    println!(
        "store on disk after close: {:.0} MiB ({:.0} bytes per task)",
        mib(store_bytes(&dir)),
        store_bytes(&dir) as f64 / count.max(1) as f64
    );

    // The restart, in a fresh process: this binary again.
    println!("restart: load average {}", common::load_average());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env("CELL_RESTART", &dir)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        panic!("the restarted master failed: {}", out.status);
    }
}
