//! The DNS server's answer time under load: a 1,000-instance service, queried over
//! UDP on loopback at a fixed rate (open loop: queries are sent on schedule whether
//! or not answers came back), A and SRV questions in turn with EDNS (a 1,232-byte
//! buffer, as dig and most stub resolvers send; bigger answers are truncated), each
//! answer's time from its send to its receipt; prints p50, p99, p99.9 and max.
//!
//! The server is the master's (`drover_master::dns`: hickory's listeners, the
//! handler, the records built from the services); the state it reads is a fixed
//! list of services rather than a running master's core, which only matters when
//! the state changes (the records are built once per change).
//!
//! Not run in CI: `cargo bench -p drover-master --bench dns`.
//! `DNS_RATE` (queries/s, default 10000), `DNS_SECONDS` (default 5),
//! `DNS_INSTANCES` (default 1000).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover_common::wire::{ServiceEndpoint, ServiceView};
use drover_master::dns::{ServiceLookup, Version, Zone};
use hickory_server::proto::op::{Edns, Message, Query};
use hickory_server::proto::rr::{Name, RecordType};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fixed state: one service of `n` instances.
struct Fixed(Vec<ServiceView>);

impl ServiceLookup for Fixed {
    fn version(&self) -> Option<Version> {
        Some(Version {
            source: 1,
            epoch: 0,
            index: 1,
        })
    }
    fn services(&self) -> Option<(Version, Vec<ServiceView>)> {
        Some((self.version()?, self.0.clone()))
    }
}

fn service(n: u32) -> ServiceView {
    ServiceView {
        role: "www-data".into(),
        environment: "prod".into(),
        name: "web".into(),
        job: "web".into(),
        primary_port: "http".into(),
        index: 1,
        endpoints: (0..n)
            .map(|i| ServiceEndpoint {
                instance: i,
                host: format!("host{i}"),
                ip: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                ports: BTreeMap::from([("http".into(), 31000 + (i % 1000) as u16)]),
                task_id: format!("web-{i}-000000000000"),
                since: 0,
            })
            .collect(),
    }
}

fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    m.set_edns(edns);
    m.to_vec().unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn main() {
    let rate = env("DNS_RATE", 10_000);
    let seconds = env("DNS_SECONDS", 5);
    let instances = env("DNS_INSTANCES", 1000) as u32;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let running = runtime
        .block_on(drover_master::dns::start(
            "127.0.0.1:0".parse().unwrap(),
            Zone::new("drover.", 2).unwrap(),
            Fixed(vec![service(instances)]),
        ))
        .unwrap();
    let server = running.addr;

    let total = (rate * seconds) as usize;
    let a = query(0, "web.prod.www-data.drover.", RecordType::A);
    let srv = query(0, "_http._tcp.web.prod.www-data.drover.", RecordType::SRV);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(server).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    // Send times by id (the query number modulo 2^16: an id is reused 65,536
    // questions later, long after its answer came back).
    let sent: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(vec![Instant::now(); 65536]));
    let receiver = {
        let (socket, sent) = (socket.try_clone().unwrap(), sent.clone());
        std::thread::spawn(move || {
            let mut latencies = Vec::with_capacity(total);
            let (mut truncated, mut bytes) = (0usize, 0usize);
            let mut buf = [0u8; 65536];
            while latencies.len() < total {
                let Ok(n) = socket.recv(&mut buf) else { break };
                let now = Instant::now();
                let id = u16::from_be_bytes([buf[0], buf[1]]) as usize;
                latencies.push(now - sent.lock().unwrap()[id]);
                if buf[2] & 0x02 != 0 {
                    truncated += 1;
                }
                bytes += n;
            }
            (latencies, truncated, bytes)
        })
    };
    let began = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    for k in 0..total {
        let due = began + interval * k as u32;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let mut q = if k % 2 == 0 { a.clone() } else { srv.clone() };
        q[..2].copy_from_slice(&((k % 65536) as u16).to_be_bytes());
        sent.lock().unwrap()[k % 65536] = Instant::now();
        socket.send(&q).unwrap();
    }
    let send_time = began.elapsed();
    let (mut latencies, truncated, bytes) = receiver.join().unwrap();
    latencies.sort();
    let answered = latencies.len();
    println!(
        "dns: {instances}-instance service, {total} questions (A and SRV in turn) at {rate}/s \
         over {:.2} s; {answered} answered ({} truncated), {} bytes per answer on average",
        send_time.as_secs_f64(),
        truncated,
        bytes / answered.max(1)
    );
    if answered > 0 {
        println!(
            "dns: answer time p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?}",
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            percentile(&latencies, 0.999),
            latencies[answered - 1]
        );
    }
    runtime.block_on(running.stop());
}
