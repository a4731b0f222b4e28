//! How soon a change of what is announced is visible in DNS and in the API (issue
//! 28 asks for 50 ms from the task's RUNNING or withdrawal commit). A one-agent
//! cluster with the master's DNS server on, a 1-instance announced `sleep` service
//! (`drain_delay` 1 s), and two watchers running all the time: one asks the SRV
//! question over UDP every millisecond (hickory-proto's codec, no process per
//! question), the other long-polls `GET /v1/services/...?index=N`. Each round
//! restarts the instance (`drover job restart KEY/0`): the old task is withdrawn,
//! a new one becomes RUNNING. For each round it takes, per watcher, the first
//! answer (client wall clock) without the old task and the first with the new
//! one, minus the task's event timestamp (the master's wall clock on the same
//! host, taken when the core decides, before the store's commit and its fsync):
//! the latency from the decision, an upper bound of the one from the commit.
//! Prints the median, minimum and maximum over `BENCH_ROUNDS` rounds (default 10)
//! and the load average before and after.
//!
//! Not run in CI: `cargo bench -p drover-tests --bench discovery_latency` as root
//! (the cluster's binaries: `DROVER_BIN_DIR`, else `target/debug`); `cargo test
//! -p drover-tests --bench discovery_latency` builds it in the debug profile.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use drover_common::state::{now_ms, TaskState};
use drover_common::wire::ServiceView;
use drover_tests::{running_as_root, Cluster, ClusterConfig, TEST_MASTER_CONFIG, WAIT};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use serde_json::json;

const KEY: &str = "www-data/test/web";
const SERVICE: &str = "/v1/services/www-data/test/web";
const SRV_NAME: &str = "_http._tcp.web.test.www-data.drover.";

/// What a watcher saw: (client wall clock ms, what the answer named), one entry
/// per answer that differs from the one before.
type Seen = Arc<Mutex<Vec<(u64, Vec<String>)>>>;

fn record(seen: &Seen, names: Vec<String>) {
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    if seen.last().is_none_or(|(_, last)| *last != names) {
        seen.push((now_ms(), names));
    }
}

/// The SRV answer's ports (as strings), asked over UDP.
fn srv_ports(socket: &UdpSocket, id: u16) -> anyhow::Result<Vec<String>> {
    let mut query = Message::query();
    query.metadata.id = id;
    query.add_query(Query::query(Name::from_ascii(SRV_NAME)?, RecordType::SRV));
    socket.send(&query.to_vec()?)?;
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.recv(&mut buf).context("no DNS answer")?;
        let answer = Message::from_vec(&buf[..n])?;
        if answer.metadata.id != id {
            continue;
        }
        let mut ports: Vec<String> = answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(srv) => Some(srv.port.to_string()),
                _ => None,
            })
            .collect();
        ports.sort();
        return Ok(ports);
    }
}

/// The DNS server's port, from `<data_dir>/dns.addr`.
fn dns_port(cluster: &Cluster) -> anyhow::Result<u16> {
    let path = cluster.dir().join("master").join("dns.addr");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Some(port) = text.trim().rsplit(':').next().and_then(|p| p.parse().ok()) {
                return Ok(port);
            }
        }
        if Instant::now() > deadline {
            bail!("no {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The time of the first answer at or after `from` (client ms) for which `holds`:
/// `from` itself if the answer standing then holds, else the first later one.
fn first(seen: &Seen, from: u64, holds: impl Fn(&[String]) -> bool) -> Option<u64> {
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let mut standing: Option<&Vec<String>> = None;
    for (t, names) in seen.iter() {
        if *t <= from {
            standing = Some(names);
            continue;
        }
        if standing.take().is_some_and(|n| holds(n)) {
            return Some(from);
        }
        if holds(names) {
            return Some(*t);
        }
    }
    standing.filter(|n| holds(n)).map(|_| from)
}

/// Waits until `seen`'s latest answer holds.
fn wait_until(seen: &Seen, what: &str, holds: impl Fn(&[String]) -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        {
            let s = seen.lock().unwrap_or_else(|e| e.into_inner());
            if s.last().is_some_and(|(_, n)| holds(n)) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("{what}: never seen");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Median, minimum and maximum of `ms`, as one line.
fn summary(mut ms: Vec<i64>) -> String {
    ms.sort_unstable();
    format!(
        "median {} ms, min {}, max {} ({} rounds)",
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_string())
}

/// The task's events: the timestamp of its last RUNNING one, and of the first
/// after it (the withdrawal decision), if any.
fn running_and_after(cluster: &Cluster, task: &str) -> anyhow::Result<(u64, Option<u64>)> {
    let t = cluster.task(task)?;
    let i = t
        .events
        .iter()
        .rposition(|e| e.state == TaskState::Running)
        .ok_or_else(|| anyhow!("{task} never RUNNING: {:?}", t.events))?;
    Ok((
        t.events[i].timestamp_ms,
        t.events.get(i + 1).map(|e| e.timestamp_ms),
    ))
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    if !running_as_root("discovery latency bench") {
        return Ok(());
    }
    let rounds = drover_tests::env_number("BENCH_ROUNDS", 10);
    let load_before = load_average();
    let mut config = ClusterConfig::agents(1);
    config.master_config =
        format!("{TEST_MASTER_CONFIG}dns_listen = \"127.0.0.1:0\"\ndns_ttl = \"1s\"\n");
    let mut cluster = Cluster::start(config)?;
    let port = dns_port(&cluster)?;
    let created = cluster.create_job(&json!({
        "role": "www-data",
        "environment": "test",
        "name": "web",
        "instances": 1,
        "service": true,
        "task": {
            "processes": [{"name": "main", "cmdline": "exec sleep 600"}],
            "resources": {"cpu": 0.1, "ram": "32MiB", "disk": "32MiB", "ports": ["http"]},
            "finalization_wait": "1s"
        },
        "announce": {"primary_port": "http", "drain_delay": "1s"}
    }))?;
    let mut task = created["tasks"][0]
        .as_str()
        .ok_or_else(|| anyhow!("no task in {created}"))?
        .to_string();

    let stop = Arc::new(AtomicBool::new(false));
    let dns: Seen = Arc::default();
    let api: Seen = Arc::default();
    let dns_watcher = {
        let (stop, dns) = (stop.clone(), dns.clone());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let socket = UdpSocket::bind("127.0.0.1:0")?;
            socket.connect(("127.0.0.1", port))?;
            socket.set_read_timeout(Some(Duration::from_secs(2)))?;
            let mut id = 0u16;
            while !stop.load(Ordering::Relaxed) {
                id = id.wrapping_add(1);
                record(&dns, srv_ports(&socket, id)?);
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })
    };
    let api_watcher = {
        let (stop, api) = (stop.clone(), api.clone());
        let http = cluster.http();
        let base = format!("{}{SERVICE}", cluster.url);
        let token = cluster.token.clone().unwrap_or_default();
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut index = 0;
            while !stop.load(Ordering::Relaxed) {
                let view: ServiceView = http
                    .get(format!("{base}?index={index}&wait_ms=1000"))
                    .bearer_auth(&token)
                    .send()?
                    .error_for_status()?
                    .json()?;
                index = view.index;
                record(
                    &api,
                    view.endpoints.into_iter().map(|e| e.task_id).collect(),
                );
            }
            Ok(())
        })
    };

    let result = (|| -> anyhow::Result<Vec<[i64; 4]>> {
        cluster.wait_for_all(KEY, TaskState::Running)?;
        wait_until(&api, "the first task announced", |n| n == [task.clone()])?;
        wait_until(&dns, "the first task in DNS", |n| n.len() == 1)?;
        // Per round: DNS withdrawn, API withdrawn, DNS announced, API announced.
        let mut out = Vec::new();
        for round in 0..rounds {
            let old = task.clone();
            let old_port = cluster.task(&old)?.ports["http"].to_string();
            let sent = now_ms();
            let o = cluster.drover(&["job", "restart", &format!("{KEY}/0")])?;
            if !o.status.success() {
                bail!("restart: {}", drover_tests::describe(&o));
            }
            // The new task, RUNNING and seen by both watchers.
            let new = cluster.wait_for("a new RUNNING task", WAIT, |c| {
                let v = c.job(KEY).ok()?;
                let t = v.instances[0].current.as_ref()?;
                (t.task_id != old && t.state == TaskState::Running).then(|| t.task_id.clone())
            })?;
            wait_until(&api, "the new task announced", |n| n == [new.clone()])?;
            wait_until(&dns, "the new task in DNS", |n| n.len() == 1)?;
            let (_, withdrawn_at) = running_and_after(&cluster, &old)?;
            let withdrawn_at =
                withdrawn_at.ok_or_else(|| anyhow!("{old} has no event after RUNNING"))?;
            let (running_at, _) = running_and_after(&cluster, &new)?;
            let gone = |n: &[String]| !n.contains(&old_port);
            let dns_out = first(&dns, sent, |n| n.is_empty() || gone(n))
                .ok_or_else(|| anyhow!("round {round}: DNS never dropped {old}"))?;
            let api_out = first(&api, sent, |n| !n.contains(&old))
                .ok_or_else(|| anyhow!("round {round}: the API never dropped {old}"))?;
            // The new task shows after the old one is gone (one instance).
            let dns_in = first(&dns, dns_out, |n| n.len() == 1)
                .ok_or_else(|| anyhow!("round {round}: DNS never named {new}"))?;
            let api_in = first(&api, api_out, |n| n.contains(&new))
                .ok_or_else(|| anyhow!("round {round}: the API never named {new}"))?;
            let ms = |seen: u64, decided: u64| seen as i64 - decided as i64;
            let row = [
                ms(dns_out, withdrawn_at),
                ms(api_out, withdrawn_at),
                ms(dns_in, running_at),
                ms(api_in, running_at),
            ];
            eprintln!(
                "round {round}: withdrawn DNS {} ms API {} ms; announced DNS {} ms API {} ms",
                row[0], row[1], row[2], row[3]
            );
            out.push(row);
            task = new;
        }
        Ok(out)
    })();
    stop.store(true, Ordering::Relaxed);
    let dns_end = dns_watcher.join();
    let api_end = api_watcher.join();
    let _ = cluster.kill_job(KEY);
    drop(cluster);
    let rows = result?;
    for (what, end) in [("DNS", dns_end), ("API", api_end)] {
        match end {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("the {what} watcher failed: {e:#}"),
            Err(_) => bail!("the {what} watcher panicked"),
        }
    }
    let col = |i: usize| rows.iter().map(|r| r[i]).collect::<Vec<_>>();
    println!(
        "discovery latency ({} build of the bench; cluster binaries from {}), from the task's \
         event timestamp (before the commit) to the client's first answer showing it:",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::env::var("DROVER_BIN_DIR").unwrap_or_else(|_| "target/debug".to_string())
    );
    println!(
        "  withdrawal, DNS (SRV over UDP, asked every 1 ms): {}",
        summary(col(0))
    );
    println!(
        "  withdrawal, API long poll:                       {}",
        summary(col(1))
    );
    println!(
        "  RUNNING, DNS:                                    {}",
        summary(col(2))
    );
    println!(
        "  RUNNING, API long poll:                          {}",
        summary(col(3))
    );
    println!(
        "  load average before: {load_before}; after: {}",
        load_average()
    );
    Ok(())
}
