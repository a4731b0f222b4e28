//! Black-box: the master's DNS server asked by a real resolver client, `dig` (Debian's
//! bind9-dnsutils, installed by scripts/setup.sh). A 3-instance announced service on
//! three agents: A of the service (the agents' address), SRV of its port with each
//! instance's port and target, the targets' A, the TTL set by `dns_ttl`, TCP as UDP,
//! NXDOMAIN for an unknown job and REFUSED outside the domain; an instance killed is
//! in the SRV and A answers just before its kill and gone from them after. Prints how long after the tasks' RUNNING and KILLING
//! decisions (their events' timestamps, taken before the commit) a UDP SRV question
//! asked every millisecond first got the new answer. On etcd, a standby answers from its copy, also while
//! the leader is dead and no other leads yet.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use drover_common::state::{now_ms, TaskState};
use drover_common::wire::JobView;
use drover_tests::ha::{HaCluster, HaOptions};
use drover_tests::{
    running_as_root, service_job, Cluster, ClusterConfig, TEST_MASTER_CONFIG, WAIT,
};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use serde_json::{json, Value};

/// The test master config with the DNS server on a free port and a 1s TTL.
fn dns_master_config() -> String {
    format!("{TEST_MASTER_CONFIG}dns_listen = \"127.0.0.1:0\"\ndns_ttl = \"1s\"\n")
}

/// `service_job` announced on its `http` port with a short drain delay.
fn announced(name: &str, instances: u32) -> Value {
    let mut spec = service_job(name, instances);
    spec["announce"] = json!({"primary_port": "http", "drain_delay": "1s"});
    spec
}

/// Whether dig is installed (scripts/setup.sh installs it); says so when not.
fn have_dig() -> bool {
    let ok = Command::new("dig")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: dig is not installed (scripts/setup.sh installs bind9-dnsutils)");
    }
    ok
}

/// The DNS server's port, from `<data_dir>/dns.addr`.
fn dns_port(data_dir: &Path) -> u16 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(data_dir.join("dns.addr")) {
            if let Some(port) = text.trim().rsplit(':').next().and_then(|p| p.parse().ok()) {
                return port;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no dns.addr in {}",
            data_dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `dig @127.0.0.1 -p PORT ARGS...` (no retries, a short timeout), its stdout.
fn dig(port: u16, args: &[&str]) -> String {
    let output = Command::new("dig")
        .arg("@127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .args(["+tries=1", "+time=2"])
        .args(args)
        .output()
        .expect("run dig");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The answer section's records as (ttl, type, data) from `dig +noall +answer`.
fn answers(port: u16, name: &str, qtype: &str, tcp: bool) -> Vec<(u32, String, String)> {
    let mut args = vec!["+noall", "+answer", name, qtype];
    if tcp {
        args.push("+tcp");
    }
    dig(port, &args)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 5).then(|| {
                (
                    f[1].parse().unwrap_or(0),
                    f[3].to_string(),
                    f[4..].join(" "),
                )
            })
        })
        .collect()
}

/// `(port, target)` of each SRV record of `name`.
fn srv(port: u16, name: &str, tcp: bool) -> BTreeSet<(u16, String)> {
    answers(port, name, "SRV", tcp)
        .into_iter()
        .filter(|(_, t, _)| t == "SRV")
        .map(|(_, _, data)| {
            let f: Vec<&str> = data.split_whitespace().collect();
            (f[2].parse().unwrap_or(0), f[3].to_string())
        })
        .collect()
}

/// The `http` ports of the job's RUNNING instances.
fn running_ports(view: &JobView) -> BTreeSet<u16> {
    view.instances
        .iter()
        .filter_map(|i| i.current.as_ref())
        .filter(|t| t.state == TaskState::Running)
        .filter_map(|t| t.ports.get("http").copied())
        .collect()
}

/// Waits until the SRV answer's ports are `want`.
fn wait_srv_ports(port: u16, name: &str, want: &BTreeSet<u16>, what: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got: BTreeSet<u16> = srv(port, name, false).into_iter().map(|(p, _)| p).collect();
        if &got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: SRV {got:?}, expected {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The SRV answer's ports for `name`, asked over UDP (hickory-proto's message
/// codec, no process per question: for timing).
fn srv_ports_udp(socket: &UdpSocket, name: &str, id: u16) -> BTreeSet<u16> {
    let mut query = Message::query();
    query.metadata.id = id;
    query.add_query(Query::query(
        Name::from_ascii(name).unwrap(),
        RecordType::SRV,
    ));
    socket.send(&query.to_vec().unwrap()).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.recv(&mut buf).unwrap();
        let answer = Message::from_vec(&buf[..n]).unwrap();
        if answer.metadata.id != id {
            continue;
        }
        return answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(srv) => Some(srv.port),
                _ => None,
            })
            .collect();
    }
}

/// Asks every millisecond until `done` holds for the SRV ports; the wall clock
/// (ms) of the first answer that made it hold.
fn first_answer(port: u16, name: &str, done: impl Fn(&BTreeSet<u16>) -> bool) -> u64 {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let deadline = Instant::now() + WAIT;
    for id in 0u16.. {
        if done(&srv_ports_udp(&socket, name, id)) {
            return now_ms();
        }
        assert!(Instant::now() < deadline, "no such answer for {name}");
        std::thread::sleep(Duration::from_millis(1));
    }
    unreachable!()
}

/// The timestamp of the task's latest event into `state`.
fn entered(cluster: &Cluster, task: &str, state: TaskState) -> u64 {
    let t = cluster.task(task).unwrap();
    t.events
        .iter()
        .rev()
        .find(|e| e.state == state)
        .map(|e| e.timestamp_ms)
        .unwrap_or_else(|| panic!("{task} never entered {state}: {:?}", t.events))
}

#[test]
fn dig_reads_announced_instances_and_the_server_refuses_what_is_not_its_own() {
    if !running_as_root("DNS test") || !have_dig() {
        return;
    }
    let mut config = ClusterConfig::agents(3);
    config.master_config = dns_master_config();
    let mut cluster = Cluster::start(config).unwrap();
    let port = dns_port(&cluster.dir().join("master"));
    let srv_name = "_http._tcp.web.test.www-data.drover.";
    let created = cluster.create_job(&announced("web", 3)).unwrap();
    let all_three = first_answer(port, srv_name, |p| p.len() == 3);
    let view = cluster
        .wait_for_all("www-data/test/web", TaskState::Running)
        .unwrap();
    let ports = running_ports(&view);
    assert_eq!(ports.len(), 3, "{view:?}");
    let ids: Vec<String> = created["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let last_running = ids
        .iter()
        .map(|id| entered(&cluster, id, TaskState::Running))
        .max()
        .unwrap();
    let announce_ms = all_three.saturating_sub(last_running);
    eprintln!(
        "DNS: the SRV answer named the last instance {announce_ms} ms after its RUNNING decision"
    );

    // SRV: one record per instance, its port, its own name as the target.
    wait_srv_ports(port, srv_name, &ports, "announced");
    let records = srv(port, srv_name, false);
    let targets: BTreeSet<String> = records.iter().map(|(_, t)| t.to_lowercase()).collect();
    let expected: BTreeSet<String> = (0..3)
        .map(|i| format!("{i}.web.test.www-data.drover."))
        .collect();
    assert_eq!(targets, expected);
    // Over TCP, the same.
    assert_eq!(srv(port, srv_name, true), records);

    // A: the agents' address (all on loopback: one record), with the TTL; the
    // targets answer A too.
    let a = answers(port, "web.test.www-data.drover.", "A", false);
    assert!(!a.is_empty(), "no A answer");
    for (ttl, qtype, data) in &a {
        assert_eq!(
            (ttl, qtype.as_str(), data.as_str()),
            (&1, "A", "127.0.0.1"),
            "{a:?}"
        );
    }
    let target = answers(port, "2.web.test.www-data.drover.", "A", true);
    assert_eq!(target, vec![(1, "A".to_string(), "127.0.0.1".to_string())]);

    // The header: authoritative, NOERROR; unknown jobs NXDOMAIN; other domains
    // REFUSED (no recursion).
    let full = dig(port, &["web.test.www-data.drover.", "A"]);
    assert!(full.contains("status: NOERROR"), "{full}");
    assert!(full.contains(" aa"), "not authoritative: {full}");
    let missing = dig(port, &["nope.test.www-data.drover.", "A"]);
    assert!(missing.contains("status: NXDOMAIN"), "{missing}");
    assert!(
        missing.contains("SOA"),
        "a negative answer carries the SOA: {missing}"
    );
    let outside = dig(port, &["example.com.", "A"]);
    assert!(outside.contains("status: REFUSED"), "{outside}");
    let outside_tcp = dig(port, &["+tcp", "example.com.", "A"]);
    assert!(outside_tcp.contains("status: REFUSED"), "{outside_tcp}");

    // An instance killed is withdrawn: the SRV answer follows.
    let killed_port = view.instances[1].current.as_ref().unwrap().ports["http"];
    // Before the kill, DNS names it (so its absence after cannot be vacuous).
    let before = srv(port, srv_name, false);
    assert!(
        before
            .iter()
            .any(|(p, t)| *p == killed_port && t.to_lowercase().starts_with("1.web.")),
        "instance 1 (port {killed_port}) is not in the SRV answer before its kill: {before:?}"
    );
    let present = dig(port, &["1.web.test.www-data.drover.", "A"]);
    assert!(
        present.contains("status: NOERROR") && present.contains("127.0.0.1"),
        "{present}"
    );
    let output = cluster
        .drover(&["job", "kill", "www-data/test/web/1"])
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        drover_tests::describe(&output)
    );
    let withdrawn = first_answer(port, srv_name, |p| !p.contains(&killed_port));
    let killing = entered(&cluster, &ids[1], TaskState::Killing);
    let withdraw_ms = withdrawn.saturating_sub(killing);
    eprintln!("DNS: the SRV answer dropped the killed instance {withdraw_ms} ms after its KILLING decision");
    // The debug build's figures, generous bounds (docs: as measured).
    assert!(announce_ms < 1_000, "{announce_ms} ms");
    assert!(withdraw_ms < 1_000, "{withdraw_ms} ms");
    let view = cluster
        .wait_for("instance 1 to end", WAIT, |c| {
            let v = c.job("www-data/test/web").ok()?;
            (running_ports(&v).len() == 2).then_some(v)
        })
        .unwrap();
    wait_srv_ports(port, srv_name, &running_ports(&view), "after the kill");
    assert!(
        !srv(port, srv_name, false)
            .iter()
            .any(|(_, t)| t.starts_with("1.")),
        "instance 1 is still announced"
    );
    let gone = dig(port, &["1.web.test.www-data.drover.", "A"]);
    assert!(gone.contains("status: NXDOMAIN"), "{gone}");
    assert!(
        !srv(port, srv_name, false)
            .iter()
            .any(|(p, _)| *p == killed_port),
        "the killed instance's port is still in the SRV answer"
    );
    cluster.kill_job("www-data/test/web").unwrap();
}

#[test]
fn a_standby_answers_dns_from_its_copy_also_while_no_master_leads() {
    if !running_as_root("DNS HA test") || !have_dig() || !drover_tests::etcd::etcd_installed() {
        return;
    }
    let mut options = HaOptions::new(2);
    options.master_config = dns_master_config();
    let mut cluster = HaCluster::start_with(options).unwrap();
    let leader = cluster.wait_leader(WAIT).unwrap();
    let standby = 1 - leader;
    let port = |k: usize| dns_port(&cluster.dir().join(format!("master-{k}")));
    let (leader_port, standby_port) = (port(leader), port(standby));
    let mut api = cluster.api(leader).unwrap();
    api.url = cluster.urls[leader].clone();
    api.create_job(&announced("web", 1)).unwrap();
    let view = cluster
        .wait_for("the service to run", WAIT, |c| {
            let v: JobView = c.get("/v1/jobs/www-data/test/web").ok()?;
            (running_ports(&v).len() == 1).then_some(v)
        })
        .unwrap();
    let ports = running_ports(&view);
    let srv_name = "_http._tcp.web.test.www-data.drover.";
    wait_srv_ports(leader_port, srv_name, &ports, "the leader");
    wait_srv_ports(standby_port, srv_name, &ports, "the standby's copy");

    // The leader dies: until its lease expires nobody leads, and the standby
    // answers all along.
    cluster.kill_master(leader);
    let killed = Instant::now();
    let mut asked = 0;
    let mut answered_leaderless = 0;
    while killed.elapsed() < Duration::from_secs(2) || cluster.leader().is_none() {
        assert!(killed.elapsed() < WAIT, "no new leader");
        let leaderless = cluster.leader().is_none();
        let got: BTreeSet<u16> = srv(standby_port, srv_name, false)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            got,
            ports,
            "the standby's answer {}ms after the kill",
            killed.elapsed().as_millis()
        );
        asked += 1;
        if leaderless {
            answered_leaderless += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        answered_leaderless > 0,
        "never asked while no master led ({asked} asked)"
    );
    assert_eq!(cluster.wait_leader(WAIT).unwrap(), standby);
    wait_srv_ports(standby_port, srv_name, &ports, "the new leader");
}
