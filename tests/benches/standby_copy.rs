//! A standby's copy of the state (issue 21): how long one read of the whole store
//! from etcd into a copy takes (etcd range reads at one revision, decoding, the
//! core's load, the token registry), for stores of 1,000, 10,000 and 50,000 tasks
//! on 100 agents, against a real one-member etcd on loopback. A standby repeats
//! the read at most every 500 ms and never sooner than four times what it took, so
//! this bounds what following the store costs it. Prints the minimum and median of
//! `BENCH_RUNS` reads (default 5) per size.
//!
//! Not run in CI: `cargo bench -p drover-tests --bench standby_copy` (needs
//! etcd-server: `scripts/setup.sh`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use drover_common::wire::{self, AgentResources, RegisterRequest};
use drover_master::config::{Config, HaConfig, StoreChoice};
use drover_master::core::{Core, CoreConfig, Effect, Event, Now};
use drover_master::etcd_store::{EtcdConn, EtcdOptions, EtcdStore};
use drover_master::standby::{read_now, Copy};
use drover_master::store::Store;
use drover_tests::etcd::EtcdCluster;

const AGENTS: usize = 100;
const JOB_SIZE: u32 = 1_000;

fn spec(j: u32) -> drover_common::JobSpec {
    serde_json::from_value(serde_json::json!({
        "role": "bench", "environment": "prod", "name": format!("job{j}"),
        "instances": JOB_SIZE, "service": true, "constraints": {"host": "limit:1000"},
        "task": {"processes": [{"name": "m", "cmdline": "sleep 1000"}],
                 "resources": {"cpu": 0.01, "ram": "1MiB", "disk": "1MiB"}}
    }))
    .expect("the bench's spec")
}

/// Stores what `core` says to persist for `event`.
fn apply(core: &mut Core, store: &mut EtcdStore, event: Event, now: u64) -> anyhow::Result<()> {
    for effect in core.handle(event, Now::both(now)).effects {
        if let Effect::Persist { changes, .. } = effect {
            store.commit(&changes)?;
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let runs = drover_tests::env_number("BENCH_RUNS", 5);
    let dir = tempfile::tempdir()?;
    let etcd = EtcdCluster::start(dir.path(), 1)?;
    let options = EtcdOptions::parse(&etcd.store_url(), None, None, None)?;
    let conn = EtcdConn::connect(&options)?;
    let mut store = EtcdStore::new(conn.clone(), None);
    store.load()?;
    let now = 1_000;
    let mut core = Core::new(CoreConfig::default(), Now::both(now), 1);
    for i in 0..AGENTS {
        let req = RegisterRequest {
            ip: None,
            protocol_version: wire::PROTOCOL_VERSION,
            agent_id: format!("agent-{i:03}"),
            hostname: format!("host-{i:03}"),
            address: String::new(),
            resources: AgentResources {
                cpu: 1_000.0,
                ram_bytes: 1 << 40,
                disk_bytes: 1 << 40,
                port_range: (31000, 31999),
            },
            attributes: BTreeMap::new(),
            versions: None,
        };
        apply(&mut core, &mut store, Event::Register(Box::new(req)), now)?;
    }
    let config = Config {
        listen: "127.0.0.1:0".parse()?,
        data_dir: dir.path().join("master"),
        insecure: false,
        tls: None,
        core: CoreConfig::default(),
        store: StoreChoice::Sqlite,
        ha: HaConfig::for_listen("127.0.0.1:0".parse()?, false),
        dns: None,
    };
    let copy = Copy::default();
    let mut jobs = 0;
    for tasks in [1_000, 10_000, 50_000] {
        while jobs * JOB_SIZE < tasks {
            apply(
                &mut core,
                &mut store,
                Event::CreateJob(Box::new(spec(jobs))),
                now,
            )?;
            jobs += 1;
        }
        let mut took: Vec<Duration> = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let index = read_now(&copy, &conn, &config)?;
            took.push(t.elapsed());
            anyhow::ensure!(index.is_some(), "no copy read");
        }
        took.sort();
        println!(
            "copy of {} tasks: min {:.0} ms, median {:.0} ms ({runs} reads)",
            core.task_count(),
            took[0].as_secs_f64() * 1e3,
            took[took.len() / 2].as_secs_f64() * 1e3
        );
    }
    Ok(())
}
