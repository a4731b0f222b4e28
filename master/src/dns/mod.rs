//! The master's DNS server (`dns_listen`, off by default): the announced services
//! of the master's state as A, AAAA and SRV records under `dns_domain`, over UDP
//! and TCP on one port, with hickory-server doing the wire format and the
//! listeners. The answers are pure (`answer.rs`); this file turns requests into
//! questions, keeps the records built from the state, and runs the listeners.
//!
//! The records are built from every announced service ([`ServiceLookup`]) when a
//! question comes and the state moved since they were last built (its committed
//! change index, or another state altogether: a new leader, a standby's newer
//! copy), and at most every [`REBUILD_MIN`] while it keeps moving: a change is
//! answered at most that long after its commit was first seen by a question. A
//! leader answers from its state; a standby on etcd from its copy (`standby`),
//! so it keeps answering while no master leads (docs/master.md, "DNS").

pub mod answer;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::runtime::Master;
use drover_common::wire::ServiceView;
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::DNSClass;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;
use tokio::net::{TcpListener, UdpSocket};

pub use answer::{answer, Answer, Records, Zone};

/// The shortest time between two builds of the records while the state keeps
/// changing (bounds the work under a stream of commits).
pub const REBUILD_MIN: Duration = Duration::from_millis(10);
/// A TCP connection that sends no question for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(5);
/// Answers queued per TCP connection.
const TCP_BUFFER: usize = 32;

/// Which state, at which point, the answers come from: when this changes the
/// records are built again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// The state answered from (a master's identity: a new leader or a standby's
    /// newer copy is another one).
    pub source: usize,
    /// Its store epoch (a batch undone for want of space changes it).
    pub epoch: u64,
    /// Its committed change index.
    pub index: u64,
}

/// Where the DNS server reads the announced services.
pub trait ServiceLookup: Send + Sync + Unpin + 'static {
    /// The state's version now (cheap; None: no state to answer from, SERVFAIL).
    fn version(&self) -> Option<Version>;
    /// Every announced service, with the version it was read at.
    fn services(&self) -> Option<(Version, Vec<ServiceView>)>;
}

/// The version of a master's state.
fn version_of(master: &Arc<Master>) -> Version {
    let commit = master.commit_state();
    Version {
        source: Arc::as_ptr(master) as usize,
        epoch: commit.epoch(),
        index: commit.committed(),
    }
}

/// The master answered from, asked at every question: a single master's own, or
/// on etcd the leader's state while this master leads and its standby copy
/// otherwise (`leader::Leadership::answering`).
pub struct FromMaster<F>(pub F);

impl<F> ServiceLookup for FromMaster<F>
where
    F: Fn() -> Option<Arc<Master>> + Send + Sync + Unpin + 'static,
{
    fn version(&self) -> Option<Version> {
        (self.0)().map(|m| version_of(&m))
    }

    fn services(&self) -> Option<(Version, Vec<ServiceView>)> {
        let master = (self.0)()?;
        // The version first: a commit in between makes the next question build
        // again, never the other way round.
        let version = version_of(&master);
        Some((version, master.read(|core| core.service_views())))
    }
}

/// The records last built.
struct Built {
    version: Version,
    at: Instant,
    records: Arc<Records>,
}

/// hickory's request handler over a [`ServiceLookup`].
pub struct Handler<L> {
    zone: Zone,
    lookup: L,
    built: RwLock<Option<Built>>,
    /// Held while building, so concurrent questions do not build the same records.
    building: Mutex<()>,
    /// Rotates where answers start.
    asked: AtomicUsize,
    /// [`REBUILD_MIN`] (tests change it).
    rebuild_min: Duration,
}

impl<L: ServiceLookup> Handler<L> {
    /// A handler answering for `zone` from `lookup`.
    pub fn new(zone: Zone, lookup: L) -> Handler<L> {
        Handler {
            zone,
            lookup,
            built: RwLock::new(None),
            building: Mutex::new(()),
            asked: AtomicUsize::new(0),
            rebuild_min: REBUILD_MIN,
        }
    }

    fn current(&self, version: Version) -> (Option<Arc<Records>>, bool) {
        let built = self.built.read().unwrap_or_else(|p| p.into_inner());
        match &*built {
            Some(b) => {
                let fresh = b.version == version
                    || (b.version.source == version.source && b.at.elapsed() < self.rebuild_min);
                (Some(b.records.clone()), fresh)
            }
            None => (None, false),
        }
    }

    /// The records to answer from now (None: no state to answer from).
    pub fn records(&self) -> Option<Arc<Records>> {
        let version = self.lookup.version()?;
        let (have, fresh) = self.current(version);
        if fresh {
            return have;
        }
        // One question builds; the others answer from what there is meanwhile
        // (or wait for the first build).
        let _building = match (self.building.try_lock(), &have) {
            (Ok(guard), _) => guard,
            (Err(_), Some(_)) => return have,
            (Err(_), None) => self.building.lock().unwrap_or_else(|p| p.into_inner()),
        };
        let (have, fresh) = self.current(version);
        if fresh {
            return have;
        }
        let (version, services) = self.lookup.services()?;
        let records = Arc::new(Records::build(&self.zone, version.index, &services));
        *self.built.write().unwrap_or_else(|p| p.into_inner()) = Some(Built {
            version,
            at: Instant::now(),
            records: records.clone(),
        });
        Some(records)
    }
}

/// A response header with only `code` (for answers sent without records failing).
fn failed(request: &Request, code: ResponseCode) -> ResponseInfo {
    let mut metadata = Metadata::response_from_request(&request.metadata);
    metadata.response_code = code;
    ResponseInfo::from(Header {
        metadata,
        counts: HeaderCounts::default(),
    })
}

#[async_trait::async_trait]
impl<L: ServiceLookup> RequestHandler for Handler<L> {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let edns = request.edns.as_ref().map(|asked| {
            let mut edns = Edns::new();
            edns.set_max_payload(asked.max_payload().max(512));
            edns.set_version(0);
            edns
        });
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(edns) = &edns {
            builder.edns(edns);
        }
        let refuse = |code| {
            let mut metadata = Metadata::response_from_request(&request.metadata);
            metadata.response_code = code;
            metadata
        };
        let question = request.request_info().ok().map(|info| info.query);
        let refusal = if request.metadata.message_type != MessageType::Query
            || request.metadata.op_code != OpCode::Query
        {
            Some(ResponseCode::NotImp)
        } else if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            Some(ResponseCode::BADVERS)
        } else {
            match question {
                None => Some(ResponseCode::FormErr),
                Some(q) if q.query_class() != DNSClass::IN => Some(ResponseCode::Refused),
                Some(_) => None,
            }
        };
        let (Some(question), None) = (question, refusal) else {
            let code = refusal.unwrap_or(ResponseCode::FormErr);
            let response = builder.build_no_records(refuse(code));
            return match response_handle.send_response(response).await {
                Ok(info) => info,
                Err(_) => failed(request, code),
            };
        };
        let Some(records) = self.records() else {
            let response = builder.build_no_records(refuse(ResponseCode::ServFail));
            return match response_handle.send_response(response).await {
                Ok(info) => info,
                Err(_) => failed(request, ResponseCode::ServFail),
            };
        };
        let rotate = self.asked.fetch_add(1, Ordering::Relaxed);
        let answer = answer::answer(&records, question.name(), question.query_type(), rotate);
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = answer.authoritative;
        metadata.response_code = answer.code;
        let response = builder.build(
            metadata,
            answer.answers.iter().copied(),
            [],
            answer.soa,
            answer.additionals.iter().copied(),
        );
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "cannot send a DNS answer");
                failed(request, ResponseCode::ServFail)
            }
        }
    }
}

/// Why the DNS server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for DNS on {addr}: {source}; pick another dns_listen address")]
pub struct BindError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

impl From<BindError> for crate::runtime::RunError {
    fn from(e: BindError) -> Self {
        crate::runtime::RunError::Dns {
            addr: e.addr,
            source: e.source,
        }
    }
}

/// A running DNS server.
pub struct Running {
    /// The bound address (UDP and TCP).
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops the listeners and waits for the answers in flight.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(join) = self.join.take() {
            let _ = join.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds UDP and TCP on `listen` (port 0: one free port for both).
async fn bind(listen: SocketAddr) -> Result<(UdpSocket, TcpListener), BindError> {
    let err = |source| BindError {
        addr: listen,
        source,
    };
    let mut tries = 0;
    loop {
        let udp = UdpSocket::bind(listen).await.map_err(err)?;
        let addr = udp.local_addr().map_err(err)?;
        match TcpListener::bind(addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            // A free UDP port whose TCP twin is taken: pick another.
            Err(_) if listen.port() == 0 && tries < 20 => tries += 1,
            Err(e) => return Err(err(e)),
        }
    }
}

/// The file in the data dir naming the DNS server's address (`dns_listen` with
/// port 0 picks one).
pub const ADDR_FILE: &str = "dns.addr";

/// Starts the DNS server configured by `dns_listen` and its zone (if any)
/// answering from `master`, and writes its address to `<data_dir>/dns.addr`.
pub async fn start_configured<F>(
    dns: Option<(SocketAddr, Zone)>,
    data_dir: &std::path::Path,
    master: F,
) -> Result<Option<Running>, crate::runtime::RunError>
where
    F: Fn() -> Option<Arc<Master>> + Send + Sync + Unpin + 'static,
{
    let Some((listen, zone)) = dns else {
        return Ok(None);
    };
    let running = start(listen, zone, FromMaster(master)).await?;
    let path = data_dir.join(ADDR_FILE);
    let tmp = data_dir.join(".dns.addr.tmp");
    let written = std::fs::write(&tmp, format!("{}\n", running.addr))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        // As with master.addr: on a full disk the master still answers.
        tracing::error!(error = %e, path = %path.display(), addr = %running.addr, "cannot write dns.addr");
    }
    Ok(Some(running))
}

/// Starts answering for `zone` from `lookup` on `listen` (UDP and TCP).
pub async fn start<L: ServiceLookup>(
    listen: SocketAddr,
    zone: Zone,
    lookup: L,
) -> Result<Running, BindError> {
    let (udp, tcp) = bind(listen).await?;
    let addr = udp.local_addr().map_err(|source| BindError {
        addr: listen,
        source,
    })?;
    let mut server = Server::new(Handler::new(zone, lookup));
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE, TCP_BUFFER);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(async move {
        let _ = stopped.await;
        if let Err(e) = server.shutdown_gracefully().await {
            tracing::debug!(error = %e, "DNS server stopped");
        }
    });
    tracing::info!(%addr, "answering DNS (UDP and TCP)");
    Ok(Running {
        addr,
        stop: Some(stop),
        join: Some(join),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    /// A fake state: `index` moves when a test says so; counts the reads.
    #[derive(Default)]
    struct Fake {
        index: AtomicU64,
        reads: AtomicU64,
        gone: std::sync::atomic::AtomicBool,
    }

    impl ServiceLookup for Arc<Fake> {
        fn version(&self) -> Option<Version> {
            if self.gone.load(Ordering::SeqCst) {
                return None;
            }
            Some(Version {
                source: 1,
                epoch: 0,
                index: self.index.load(Ordering::SeqCst),
            })
        }
        fn services(&self) -> Option<(Version, Vec<ServiceView>)> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Some((self.version()?, Vec::new()))
        }
    }

    #[test]
    fn records_are_built_again_only_when_the_state_moved() {
        let fake = Arc::new(Fake::default());
        let handler = Handler::new(Zone::new("drover.", 2).unwrap(), fake.clone());
        let first = handler.records().unwrap();
        let again = handler.records().unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(fake.reads.load(Ordering::SeqCst), 1);
        fake.index.store(5, Ordering::SeqCst);
        std::thread::sleep(REBUILD_MIN);
        let moved = handler.records().unwrap();
        assert!(!Arc::ptr_eq(&first, &moved));
        assert_eq!(fake.reads.load(Ordering::SeqCst), 2);
        fake.gone.store(true, Ordering::SeqCst);
        assert!(handler.records().is_none(), "no state: SERVFAIL");
    }

    #[test]
    fn a_state_that_keeps_moving_is_read_at_most_every_rebuild_min() {
        let fake = Arc::new(Fake::default());
        let mut handler = Handler::new(Zone::new("drover.", 2).unwrap(), fake.clone());
        handler.rebuild_min = Duration::from_secs(3600);
        handler.records();
        for _ in 0..100 {
            fake.index.fetch_add(1, Ordering::SeqCst);
            handler.records();
        }
        assert_eq!(fake.reads.load(Ordering::SeqCst), 1);
        handler.rebuild_min = Duration::ZERO;
        for _ in 0..10 {
            fake.index.fetch_add(1, Ordering::SeqCst);
            handler.records();
        }
        assert_eq!(fake.reads.load(Ordering::SeqCst), 11);
    }
}
