//! Black-box: zero downtime, measured as a client sees it. A 3-instance HTTP service
//! announced through Drover (`announce.drain_delay` 2s, the DNS TTL 1s) on four
//! agents (one instance per host), and two clients sending a steady stream of
//! requests (each over 200/s, a new connection per request, no retries) while, in
//! turn after a quiet baseline: a rolling update of all instances, the drain of a
//! host carrying one instance, a restart of the whole job (`drover job restart
//! KEY`, rolling: one instance at a time), and the kill of one instance. One client finds the instances
//! through the master's DNS (SRV, re-resolved when the answer's TTL ends), the other
//! through the API's long poll (`GET /v1/services/...?index=N&wait_ms=M`). Expected:
//! no failed request in any phase, and no DNS answer naming an instance after its
//! withdrawal (as the API showed it). Prints per phase and client the requests sent,
//! failed and the slowest; docs/master.md keeps them.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_common::wire::{JobView, ServiceView};
use drover_tests::{
    describe, running_as_root, service_job, AdminApi, Cluster, ClusterConfig, TEST_MASTER_CONFIG,
    WAIT,
};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use serde_json::{json, Value};

const KEY: &str = "www-data/test/web";
const SRV_NAME: &str = "_http._tcp.web.test.www-data.drover.";
/// Requests per second of each client.
const RATE: u32 = 220;
/// Sending threads per client.
const WORKERS: u32 = 4;
const PHASES: [&str; 5] = [
    "steady (baseline)",
    "rolling update",
    "host drain",
    "job restart",
    "kill one",
];

/// What one client saw in one phase.
#[derive(Clone, Debug, Default)]
struct PhaseStats {
    sent: u64,
    failed: u64,
    max_latency: Duration,
    /// The first few failures, for the assertion message.
    failures: Vec<String>,
}

/// A client: the endpoints it believes in now and what its requests met.
struct Client {
    name: &'static str,
    endpoints: RwLock<Vec<u16>>,
    stats: Mutex<Vec<PhaseStats>>,
}

impl Client {
    fn new(name: &'static str) -> Arc<Client> {
        Arc::new(Client {
            name,
            endpoints: RwLock::new(Vec::new()),
            stats: Mutex::new(vec![PhaseStats::default(); PHASES.len() + 1]),
        })
    }
}

/// One request on a new connection: `GET /` must answer 200 "hello".
fn request(port: u16) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect :{port}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n")
        .map_err(|e| format!("send :{port}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("read :{port}: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    if text.starts_with("HTTP/1.0 200") && text.ends_with("hello") {
        Ok(())
    } else {
        Err(format!(":{port} answered {text:?}"))
    }
}

/// Sends `RATE / WORKERS` requests per second, round robin over the client's
/// endpoints, each counted in the phase current when it was sent.
fn worker(client: Arc<Client>, phase: Arc<AtomicUsize>, stop: Arc<AtomicBool>, k: u32) {
    let interval = Duration::from_secs_f64(f64::from(WORKERS) / f64::from(RATE));
    let began = Instant::now() + interval * k / WORKERS;
    let mut n = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let due = began + interval * n;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        n += 1;
        let p = phase.load(Ordering::SeqCst);
        let endpoint = {
            let endpoints = client.endpoints.read().unwrap();
            (!endpoints.is_empty()).then(|| endpoints[(n as usize + k as usize) % endpoints.len()])
        };
        let sent = Instant::now();
        let result = match endpoint {
            Some(port) => request(port),
            None => Err("no endpoint known".to_string()),
        };
        let took = sent.elapsed();
        let mut stats = client.stats.lock().unwrap();
        let s = &mut stats[p];
        s.sent += 1;
        s.max_latency = s.max_latency.max(took);
        if let Err(e) = result {
            s.failed += 1;
            if s.failures.len() < 5 {
                s.failures.push(e);
            }
        }
    }
}

/// Asks the master's DNS server for the service's SRV records over UDP: the
/// ports and the smallest TTL.
fn resolve(socket: &UdpSocket, id: u16) -> Option<(Vec<u16>, u32)> {
    let mut query = Message::query();
    query.metadata.id = id;
    query.metadata.recursion_desired = false;
    query.add_query(Query::query(
        Name::from_ascii(SRV_NAME).ok()?,
        RecordType::SRV,
    ));
    socket.send(&query.to_vec().ok()?).ok()?;
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.recv(&mut buf).ok()?;
        let answer = Message::from_vec(&buf[..n]).ok()?;
        if answer.metadata.id != id {
            continue;
        }
        let mut ports = Vec::new();
        let mut ttl = u32::MAX;
        for record in &answer.answers {
            if let RData::SRV(srv) = &record.data {
                ports.push(srv.port);
                ttl = ttl.min(record.ttl);
            }
        }
        return Some((ports, if ttl == u32::MAX { 1 } else { ttl }));
    }
}

/// A DNS answer as the client got it: asked at, answered at, the ports.
type Resolution = (Instant, Instant, BTreeSet<u16>);

/// Keeps the DNS client's endpoints: resolves, uses the answer for its TTL, again.
fn dns_resolver(
    client: Arc<Client>,
    server: SocketAddr,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Resolution>>>,
) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut id = 0u16;
    while !stop.load(Ordering::SeqCst) {
        id = id.wrapping_add(1);
        let asked = Instant::now();
        let Some((ports, ttl)) = resolve(&socket, id) else {
            // No answer (none is expected to be lost on loopback): the old one stays.
            continue;
        };
        log.lock()
            .unwrap()
            .push((asked, Instant::now(), ports.iter().copied().collect()));
        *client.endpoints.write().unwrap() = ports;
        let until = asked + Duration::from_secs(u64::from(ttl.max(1)));
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The API's view of the service over time: (seen at, http ports).
type Timeline = Arc<Mutex<Vec<(Instant, BTreeSet<u16>)>>>;

/// Keeps the API client's endpoints by long-polling the service's view; records
/// every view it saw.
fn api_watcher(client: Arc<Client>, api: AdminApi, stop: Arc<AtomicBool>, timeline: Timeline) {
    let path = format!("/v1/services/{KEY}");
    let mut index = None;
    while !stop.load(Ordering::SeqCst) {
        let url = match index {
            None => path.clone(),
            Some(i) => format!("{path}?index={i}&wait_ms=1000"),
        };
        let Ok(view) = api.get::<ServiceView>(&url) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let ports: Vec<u16> = view
            .endpoints
            .iter()
            .filter_map(|e| e.ports.get("http").copied())
            .collect();
        timeline
            .lock()
            .unwrap()
            .push((Instant::now(), ports.iter().copied().collect()));
        *client.endpoints.write().unwrap() = ports;
        index = Some(view.index);
    }
}

/// Whether `port` was in the API's view at some time in [from, to].
fn announced_during(
    timeline: &[(Instant, BTreeSet<u16>)],
    port: u16,
    from: Instant,
    to: Instant,
) -> bool {
    timeline.iter().enumerate().any(|(i, (at, ports))| {
        let until = timeline.get(i + 1).map(|(t, _)| *t);
        ports.contains(&port) && *at <= to && until.is_none_or(|u| u >= from)
    })
}

/// Prints what each client saw in phase `k` (as it ends, so a failing run shows
/// the phases before).
fn print_phase(k: usize, clients: &[&Arc<Client>]) {
    for client in clients {
        let s = client.stats.lock().unwrap()[k].clone();
        println!(
            "zero downtime: {}, {}: {} sent, {} failed, max {} ms{}",
            PHASES[k],
            client.name,
            s.sent,
            s.failed,
            s.max_latency.as_millis(),
            if s.failures.is_empty() {
                String::new()
            } else {
                format!(" ({:?})", s.failures)
            }
        );
    }
}

fn run(cluster: &Cluster, args: &[&str]) {
    let output = cluster.drover(args).unwrap();
    assert!(
        output.status.success(),
        "drover {args:?}: {}",
        describe(&output)
    );
}

/// Waits until the API shows `n` endpoints, `n` of the job's instances are
/// RUNNING and every task they replaced has ended.
fn settle(cluster: &mut Cluster, timeline: &Timeline, n: usize, what: &str) {
    cluster
        .wait_for(what, WAIT, |c| {
            let view = c.job(KEY).ok()?;
            let running = view
                .instances
                .iter()
                .filter(|i| {
                    i.current
                        .as_ref()
                        .is_some_and(|t| t.state == TaskState::Running)
                })
                .count();
            // The tasks replaced have ended too (a restart's replacement runs
            // while the old task's kill is held for the drain delay).
            let ended = view
                .instances
                .iter()
                .flat_map(|i| i.history.iter())
                .all(|t| t.state.is_terminal());
            let shown = timeline.lock().unwrap().last().map(|(_, p)| p.len());
            (running == n && ended && shown == Some(n)).then_some(())
        })
        .unwrap();
}

fn job_view(cluster: &Cluster) -> JobView {
    cluster.job(KEY).unwrap()
}

#[test]
fn clients_of_an_announced_service_see_no_failure_through_update_drain_restart_and_kill() {
    if !running_as_root("zero-downtime test") {
        return;
    }
    let mut config = ClusterConfig::agents(4);
    config.master_config =
        format!("{TEST_MASTER_CONFIG}dns_listen = \"127.0.0.1:0\"\ndns_ttl = \"1s\"\n");
    let mut cluster = Cluster::start(config).unwrap();
    let dns: SocketAddr = std::fs::read_to_string(cluster.dir().join("master/dns.addr"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut spec = service_job("web", 3);
    spec["announce"] = json!({"primary_port": "http", "drain_delay": "2s"});
    spec["update"] = json!({"batch_size": 1, "watch": "1s"});
    cluster.create_job(&spec).unwrap();
    cluster.wait_for_all(KEY, TaskState::Running).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicUsize::new(PHASES.len()));
    let timeline: Timeline = Arc::default();
    let resolutions: Arc<Mutex<Vec<Resolution>>> = Arc::default();
    let (by_dns, by_api) = (Client::new("DNS"), Client::new("API long poll"));
    let mut threads = Vec::new();
    {
        let mut api = AdminApi::new().unwrap();
        api.url = cluster.api.url.clone();
        api.token = cluster.api.token.clone();
        let (c, s, t) = (by_api.clone(), stop.clone(), timeline.clone());
        threads.push(std::thread::spawn(move || api_watcher(c, api, s, t)));
        let (c, s, l) = (by_dns.clone(), stop.clone(), resolutions.clone());
        threads.push(std::thread::spawn(move || dns_resolver(c, dns, s, l)));
    }
    settle(&mut cluster, &timeline, 3, "all 3 instances announced");
    for client in [&by_dns, &by_api] {
        for k in 0..WORKERS {
            let (c, p, s) = (client.clone(), phase.clone(), stop.clone());
            threads.push(std::thread::spawn(move || worker(c, p, s, k)));
        }
    }

    // 0. Nothing happens: the baseline.
    phase.store(0, Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(2));

    // 1. A rolling update of every instance (a new config: more cpu).
    phase.store(1, Ordering::SeqCst);
    print_phase(0, &[&by_dns, &by_api]);
    let mut updated: Value = spec.clone();
    updated["task"]["resources"]["cpu"] = json!(0.12);
    let file = cluster.dir().join("web-updated.json");
    std::fs::write(&file, updated.to_string()).unwrap();
    run(
        &cluster,
        &[
            "job",
            "update",
            file.to_str().unwrap(),
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    settle(
        &mut cluster,
        &timeline,
        3,
        "the update's instances announced",
    );

    // 2. The drain of the host carrying instance 0.
    phase.store(2, Ordering::SeqCst);
    print_phase(1, &[&by_dns, &by_api]);
    let view = job_view(&cluster);
    let agent = view.instances[0]
        .current
        .as_ref()
        .and_then(|t| t.agent_id.clone())
        .unwrap();
    run(
        &cluster,
        &["host", "drain", &agent, "--wait", "--timeout", "60s"],
    );
    settle(
        &mut cluster,
        &timeline,
        3,
        "instance 0 announced on another host",
    );
    run(&cluster, &["host", "activate", &agent]);

    // 3. A restart of the whole job: rolling, one instance (the batch size) at a
    // time, each withdrawn and drained before its kill, the next only once its
    // replacement ran its watch.
    phase.store(3, Ordering::SeqCst);
    print_phase(2, &[&by_dns, &by_api]);
    let before: Vec<Option<String>> = job_view(&cluster)
        .instances
        .iter()
        .map(|i| i.current.as_ref().map(|t| t.task_id.clone()))
        .collect();
    let output = cluster.drover(&["job", "restart", KEY]).unwrap();
    let said = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success() && said.contains("rolling restart"),
        "drover job restart: {}",
        describe(&output)
    );
    cluster
        .wait_for("the rolling restart to end", WAIT * 2, |c| {
            let u: Value = c.api.get(&format!("/v1/jobs/{KEY}/update")).ok()?;
            let state = u["state"].as_str()?.to_string();
            (state != "ROLLING_FORWARD").then_some(state)
        })
        .map(|state| assert_eq!(state, "ROLLED_FORWARD"))
        .unwrap();
    let after = job_view(&cluster);
    for (i, was) in before.iter().enumerate() {
        let now = after.instances[i].current.as_ref().map(|t| &t.task_id);
        assert_ne!(now, was.as_ref(), "instance {i} was restarted");
    }
    settle(
        &mut cluster,
        &timeline,
        3,
        "the restarted instances announced",
    );

    // 4. One instance killed.
    phase.store(4, Ordering::SeqCst);
    print_phase(3, &[&by_dns, &by_api]);
    run(&cluster, &["job", "kill", &format!("{KEY}/2")]);
    cluster
        .wait_for("instance 2 to end", WAIT, |c| {
            let v = c.job(KEY).ok()?;
            v.instances[2]
                .current
                .as_ref()?
                .state
                .is_terminal()
                .then_some(())
        })
        .unwrap();
    settle(&mut cluster, &timeline, 2, "two instances announced");
    std::thread::sleep(Duration::from_secs(1));

    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    print_phase(4, &[&by_dns, &by_api]);

    let mut problems = Vec::new();
    for client in [&by_dns, &by_api] {
        let stats = client.stats.lock().unwrap();
        for (k, name) in PHASES.iter().enumerate() {
            let s = &stats[k];
            if s.failed > 0 || s.sent == 0 {
                problems.push(format!("{name} via {}: {s:?}", client.name));
            }
        }
    }
    // No DNS answer named an instance the API no longer showed (the answer may
    // trail the API by the server's rebuild bound, 10 ms; 100 ms of slack).
    let timeline = timeline.lock().unwrap();
    let slack = Duration::from_millis(100);
    for (asked, answered, ports) in resolutions.lock().unwrap().iter() {
        for port in ports {
            if !announced_during(&timeline, *port, *asked - slack, *answered + slack) {
                problems.push(format!("a DNS answer named :{port} after its withdrawal"));
            }
        }
    }
    cluster.kill_job(KEY).unwrap();
    assert!(
        problems.is_empty(),
        "{problems:#?}\n{}",
        cluster.diagnostics()
    );
}
