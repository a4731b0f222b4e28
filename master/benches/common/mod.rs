//! Helpers the master's benches share: the calling thread's CPU time, the
//! process's CPU time, RSS and the load average, the registration of a simulated
//! agent with the core, and a master config on SQLite in a data dir. Each bench
//! includes it with `mod common;` and uses what it needs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use drover_common::wire::{self, AgentResources, RegisterRequest};

/// This thread's time on a CPU so far, from /proc/thread-self/schedstat (0 where
/// /proc does not say): on a shared machine the wall clock counts other
/// processes' turns too.
pub fn cpu_time() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

/// The id of simulated agent `i`.
pub fn agent_id(i: usize) -> String {
    format!("agent-{i:05}")
}

/// The registration of simulated agent `i` (host `host-<i>`): `cpu` cores, `ram_bytes`
/// of memory, 1 TiB of disk, ports 31000-31999 and `attributes`.
pub fn registration(
    i: usize,
    cpu: f64,
    ram_bytes: u64,
    attributes: BTreeMap<String, String>,
) -> RegisterRequest {
    RegisterRequest {
        ip: None,
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: agent_id(i),
        hostname: format!("host-{i:05}"),
        address: String::new(),
        resources: AgentResources {
            cpu,
            ram_bytes,
            disk_bytes: 1 << 40,
            port_range: (31000, 31999),
        },
        attributes,
        versions: None,
    }
}

/// A field of /proc/self/status given in kB (`VmHWM`, `VmRSS`), in bytes (0 where
/// /proc does not say).
pub fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The process's CPU time so far, user plus system, every thread (getrusage).
pub fn process_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(u) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Duration::ZERO;
    };
    let of = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    of(u.user_time()) + of(u.system_time())
}

/// The 1-, 5- and 15-minute load averages, as /proc/loadavg says them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A master config: SQLite in `dir`, a free local port, no TLS, defaults otherwise.
#[allow(clippy::unwrap_used)]
pub fn config(dir: &std::path::Path) -> drover_master::Config {
    drover_master::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        insecure: false,
        tls: None,
        core: drover_master::core::CoreConfig::default(),
        store: drover_master::config::StoreChoice::Sqlite,
        ha: drover_master::config::HaConfig::for_listen("127.0.0.1:0".parse().unwrap(), false),
        dns: None,
    }
}
