//! Helpers the master's benches share: the calling thread's CPU time and the
//! registration of a simulated agent with the core. Each bench includes it with
//! `mod common;` and uses what it needs.
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
