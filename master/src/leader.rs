//! Several masters on one etcd store: leader election with a lease, and the
//! master's life around it.
//!
//! Each master holds an etcd lease (TTL `lease_ttl`, kept alive every third of
//! it) and campaigns on the election `/drover-election/` with its advertised URL
//! as value. Until it is elected it is a standby: it answers `/health` (saying who
//! leads), forwards the admin API to the leader (`proxy`), answers reads that
//! accept a stale answer from its copy of the state when the leader gives no
//! answer (`standby`), and answers agent traffic with 503 `not_leader` and the
//! leader's URL in the `X-Drover-Leader` header, so agents go there. Once elected
//! it loads the store, the token registry and the audit log's writer
//! (`etcd_auth`) and serves as a single master does, every store transaction
//! fenced on its election key (`etcd_store::Fence`). It stops serving at once
//! when its lease may have expired: a request is served only while the last
//! keep-alive answered was sent less than three quarters of the TTL ago (a paused
//! master that wakes up refuses everything before it notices anything else), and
//! when the lease is lost or a fenced write fails it stops, drops its in-memory
//! state and campaigns again as a standby.
//!
//! Every decision here (serve, forward, answer from the copy, refuse, step down)
//! is `ha`'s; this file does the etcd and HTTP around them.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use drover_common::state::mono_ms;
use etcd_client::{Client, LeaderKey, ResignOptions};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::etcd_store::{EtcdConn, EtcdOptions, EtcdStore, Fence};
use crate::ha::{Gate, Keep, Loading, Round, Standby, Standing, Term};
use crate::http::ApiErr;
use crate::runtime::{open_store, prepare_data_dir, seed, write_addr_file, Master, RunError};
use crate::store::StoreError;

pub use crate::ha::{ELECTION, LEADER_HEADER};

/// What this master knows about the election.
pub struct Leadership {
    url: String,
    ttl_ms: u64,
    leading: AtomicBool,
    /// Monotonic ms until which the lease is surely alive (0: not known alive).
    valid_until: AtomicU64,
    leader: Mutex<Option<String>>,
    /// The client a standby forwards admin requests to the leader with.
    http: reqwest::Client,
    /// The standby's copy of the state (`standby`).
    copy: Arc<crate::standby::Copy>,
    /// The state this master served while it last led (the DNS server's).
    served: RwLock<Option<Arc<Master>>>,
}

impl Leadership {
    /// This master, reachable at `url`, with leases of `ttl_ms`.
    pub fn new(url: String, ttl_ms: u64) -> Leadership {
        Leadership {
            url,
            ttl_ms,
            leading: AtomicBool::new(false),
            valid_until: AtomicU64::new(0),
            leader: Mutex::new(None),
            http: reqwest::Client::new(),
            copy: Arc::default(),
            served: RwLock::new(None),
        }
    }

    /// The state the DNS server answers from: the leader's own while this master
    /// leads; otherwise its standby copy, or until it has one (a leader that just
    /// stepped down) the state it last served.
    pub fn answering(&self) -> Option<Arc<Master>> {
        let served = || {
            self.served
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        };
        if self.leading.load(Ordering::Acquire) {
            if let Some(master) = served() {
                return Some(master);
            }
        }
        if let Some(copy) = self.copy.master() {
            // The copy supersedes the state last served: let that go.
            if served().is_some() {
                self.served
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
            }
            return Some(copy);
        }
        served()
    }

    /// Forwards with `http` (the cluster CA trusted when masters serve TLS).
    pub fn with_client(mut self, http: reqwest::Client) -> Leadership {
        self.http = http;
        self
    }

    /// Whether this master leads and its lease is surely alive now.
    pub fn may_serve(&self) -> bool {
        crate::ha::may_serve(
            self.leading.load(Ordering::Acquire),
            mono_ms(),
            self.valid_until.load(Ordering::Acquire),
        )
    }

    /// The leader's URL as last seen (this master's own while it leads).
    pub fn leader(&self) -> Option<String> {
        if self.leading.load(Ordering::Acquire) {
            return Some(self.url.clone());
        }
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_leader(&self, url: Option<String>) {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = url;
    }

    /// A keep-alive sent at `sent` (monotonic ms) was answered (`ha::serve_until`).
    fn renewed(&self, sent: u64) {
        self.valid_until
            .fetch_max(crate::ha::serve_until(sent, self.ttl_ms), Ordering::AcqRel);
    }

    /// The leader's URL when known and not this master's own.
    fn other_leader(&self) -> Option<String> {
        let leader = self.leader();
        crate::ha::other_leader(leader.as_deref(), &self.url).map(str::to_owned)
    }

    /// The `/health` answer of a master on etcd.
    pub fn health(&self) -> serde_json::Value {
        serde_json::json!({
            "status": "ok",
            "store": "etcd",
            "leader": self.may_serve(),
            "url": self.url,
            "leader_url": self.leader(),
            "copy": self.copy.describe().map(|(index, age_ms)| {
                serde_json::json!({"index": index, "age_ms": age_ms})
            }),
        })
    }

    /// The refusal of a master that does not lead (503 `not_leader`, with the
    /// leader's URL in `X-Drover-Leader` when known).
    pub fn refusal(&self) -> Response {
        let leader = self.other_leader();
        let message = crate::ha::refusal_message(leader.as_deref());
        let mut resp = ApiErr::new(StatusCode::SERVICE_UNAVAILABLE, "not_leader", message, None)
            .into_response();
        if let Some(value) = leader.and_then(|l| HeaderValue::from_str(&l).ok()) {
            resp.headers_mut().insert(LEADER_HEADER, value);
        }
        resp
    }
}

/// Carries out `ha::gate` and `ha::standby_route`: `/health` from the election;
/// a live leader's own router; else forwarding the admin API to the leader
/// (`proxy`), reads from the copy (`standby`), refusals (the layer around a
/// leader's router; a standby's router is this layer around nothing).
async fn gate(
    axum::extract::State(lead): axum::extract::State<Arc<Leadership>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match crate::ha::gate(request.uri().path(), lead.may_serve()) {
        Gate::Health => return axum::Json(lead.health()).into_response(),
        Gate::Serve => return next.run(request).await,
        Gate::Standby => {}
    }
    let leader = lead.other_leader();
    let seen = Standing {
        leader: leader.as_deref(),
        forwardable: crate::proxy::forwardable(&request),
        copy_answers: lead.copy.can_answer(&request),
    };
    match crate::ha::standby_route(seen) {
        Standby::Forward { leader, then_copy } => {
            let again = then_copy.then(|| crate::standby::duplicate(&request));
            match crate::proxy::forward(&lead.http, leader, &lead.url, request).await {
                Ok(answer) => answer,
                // The leader gave no answer (a failover): a read comes from
                // the copy.
                Err(failed) => match again {
                    Some(again) => lead.copy.answer(again).await.unwrap_or(failed),
                    None => failed,
                },
            }
        }
        Standby::FromCopy => match lead.copy.answer(request).await {
            Some(answer) => answer,
            None => lead.refusal(),
        },
        Standby::Refuse => lead.refusal(),
    }
}

fn gated(router: Router, lead: &Arc<Leadership>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(lead.clone(), gate))
}

/// Keeps `lease` alive every third of the TTL until it is lost (expired at etcd,
/// or not renewed before it may have expired); then returns.
async fn keep_alive(mut client: Client, lease: i64, lead: Arc<Leadership>) {
    let period = crate::ha::keep_alive_period(lead.ttl_ms);
    let mut stream = None;
    loop {
        if stream.is_none() {
            stream = client.lease_keep_alive(lease).await.ok();
        }
        let sent = mono_ms();
        let mut round = Round::NoAnswer;
        if let Some((keeper, answers)) = stream.as_mut() {
            let answered = async {
                keeper.keep_alive().await?;
                answers.message().await
            };
            round = match tokio::time::timeout(period, answered).await {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => Round::Answered,
                Ok(Ok(Some(_))) => Round::Expired,
                _ => Round::NoAnswer,
            };
            if round == Round::NoAnswer {
                stream = None;
            }
        }
        let valid_until = lead.valid_until.load(Ordering::Acquire);
        match crate::ha::after_round(round, mono_ms(), valid_until) {
            Keep::Renew => lead.renewed(sent),
            Keep::Retry => {}
            Keep::Expired => {
                tracing::warn!(lease, "the election lease expired at etcd");
                return;
            }
            Keep::TooLate => {
                tracing::warn!(lease, "cannot renew the election lease in time");
                return;
            }
        }
        let spent = Duration::from_millis(mono_ms().saturating_sub(sent));
        tokio::time::sleep(period.saturating_sub(spent)).await;
    }
}

/// Follows who leads (for `/health` and the standby's redirects) until dropped.
async fn follow_leader(mut client: Client, lead: Arc<Leadership>) {
    loop {
        let url = match client.leader(ELECTION).await {
            Ok(resp) => resp
                .kv()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            Err(_) => None,
        };
        lead.set_leader(url);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Binds `config.listen` (retrying a moment while this process's previous
/// listener on it closes).
async fn bind(config: &Config) -> Result<TcpListener, RunError> {
    let bind_err = |source| RunError::Bind {
        addr: config.listen,
        source,
    };
    let mut tries = 0;
    loop {
        match TcpListener::bind(config.listen).await {
            Ok(l) => return Ok(l),
            Err(e) if tries < 20 => {
                tries += 1;
                tracing::debug!(error = %e, "cannot bind yet; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(bind_err(e)),
        }
    }
}

/// Runs a master on the etcd store until `shutdown`: standby, leader when
/// elected, standby again when the lease is lost.
pub async fn run(
    config: Config,
    options: EtcdOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    prepare_data_dir(&config)?;
    write_addr_file(&config.data_dir, config.listen)?;
    tracing::info!(url = %config.ha.advertise, data_dir = %config.data_dir.display(), "drover-master on etcd: campaigning");
    crate::systemd::ready("standby on etcd: campaigning for leadership");
    let tls = match &config.tls {
        Some(files) => Some(crate::tls::server_config(files)?),
        None => None,
    };
    let conn = {
        let options = options.clone();
        tokio::task::spawn_blocking(move || EtcdConn::connect(&options))
            .await
            .map_err(|e| StoreError::Etcd {
                op: "connect",
                message: e.to_string(),
            })??
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let ca = match &config.tls {
        Some(files) => {
            Some(
                std::fs::read(&files.client_ca).map_err(|e| crate::tls::TlsError::Read {
                    what: "the cluster CA",
                    path: files.client_ca.clone(),
                    message: e.to_string(),
                })?,
            )
        }
        None => None,
    };
    let http = crate::proxy::client(ca.as_deref()).map_err(|message| {
        crate::tls::TlsError::Rustls(format!("the standby's client: {message}"))
    })?;
    let lead = Arc::new(
        Leadership::new(config.ha.advertise.clone(), config.ha.lease_ttl_ms).with_client(http),
    );
    let follower = conn.spawn(follow_leader(conn.client(), lead.clone()));
    let copier = {
        let lead2 = lead.clone();
        tokio::spawn(crate::standby::follow(
            conn.clone(),
            config.clone(),
            lead.copy.clone(),
            move || lead2.leading.load(Ordering::Acquire),
        ))
    };
    let dns = {
        let lead = lead.clone();
        match crate::dns::start_configured(config.dns_server(), &config.data_dir, move || {
            lead.answering()
        })
        .await
        {
            Ok(dns) => dns,
            Err(e) => {
                follower.abort();
                copier.abort();
                return Err(e);
            }
        }
    };
    let result = loop {
        match term(&config, &conn, &lead, tls.clone(), stop_rx.clone()).await {
            Ok(Term::Shutdown) => break Ok(()),
            Ok(Term::SteppedDown) => {
                tracing::warn!("stepped down: this master is a standby again");
            }
            Err(e) => break Err(e),
        }
    };
    follower.abort();
    copier.abort();
    if let Some(dns) = dns {
        dns.stop().await;
    }
    result
}

/// One term: a lease, standby until elected (or shut down), then leader until
/// the lease is lost (or shut down).
async fn term(
    config: &Config,
    conn: &Arc<EtcdConn>,
    lead: &Arc<Leadership>,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut stop: watch::Receiver<bool>,
) -> Result<Term, RunError> {
    let ttl_s = config.ha.lease_ttl_ms.div_ceil(1000) as i64;
    let mut client = conn.client();
    // The standby answers while the lease is granted and the campaign runs.
    let (standby_tx, standby_rx) = watch::channel(false);
    let standby = {
        let app = gated(Router::new(), lead);
        let listener = bind(config).await?;
        tokio::spawn(crate::server::accept_loop(
            listener,
            app,
            tls.clone(),
            standby_rx,
        ))
    };
    tracing::info!(url = %lead.url, "standby: campaigning for leadership");
    let mut told_full = false;
    let lease = loop {
        let granted = async { client.lease_grant(ttl_s, None).await };
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {
                let _ = standby_tx.send(true);
                let _ = standby.await;
                return Ok(Term::Shutdown);
            }
            r = granted => match r {
                Ok(r) => break r.id(),
                // etcd refuses lease grants while its NOSPACE alarm is raised: no
                // master can be elected until the operator frees space.
                Err(e) if crate::etcd_store::etcd_no_space(&e) => {
                    if !told_full {
                        tracing::error!(error = %e, "cannot get an election lease: etcd is out of space; compact and defragment etcd, then disarm its NOSPACE alarm (`etcdctl alarm disarm`); retrying");
                        told_full = true;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot get an election lease; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    };
    lead.renewed(mono_ms());
    let kept = conn.spawn(keep_alive(conn.client(), lease, lead.clone()));
    let campaign = {
        let (mut c, url) = (conn.client(), lead.url.clone());
        conn.spawn(async move { c.campaign(ELECTION, url, lease).await })
    };
    let (mut kept, mut campaign) = (kept, campaign);
    let elected: Option<LeaderKey> = tokio::select! {
        _ = stop.wait_for(|s| *s) => None,
        _ = &mut kept => None,
        r = &mut campaign => match r {
            Ok(Ok(mut resp)) => resp.take_leader(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "campaign failed");
                None
            }
            Err(_) => None,
        },
    };
    let _ = standby_tx.send(true);
    let _ = standby.await;
    let Some(key) = elected else {
        campaign.abort();
        kept.abort();
        let _ = client.lease_revoke(lease).await;
        return Ok(crate::ha::unelected(*stop.borrow()));
    };
    let fence = Fence {
        key: key.key().to_vec(),
        revision: key.rev(),
    };
    tracing::info!(url = %lead.url, revision = fence.revision, "elected leader: loading the store");
    let store = EtcdStore::new(conn.clone(), Some(fence.clone()));
    let opened = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || open_store(&config, Box::new(store), seed()))
            .await
            .map_err(|e| StoreError::Etcd {
                op: "load",
                message: e.to_string(),
            })?
    };
    let master = match opened {
        Ok(m) => m,
        // Deposed while loading, or etcd unavailable: a standby again (and retry).
        Err(e) if crate::ha::steps_down_on(Loading::Store, &e) => {
            tracing::warn!(error = %e, "cannot load the store as leader; stepping down");
            kept.abort();
            let _ = client.lease_revoke(lease).await;
            return Ok(Term::SteppedDown);
        }
        Err(e) => return Err(e),
    };
    *lead.served.write().unwrap_or_else(|p| p.into_inner()) = Some(master.clone());
    lead.leading.store(true, Ordering::Release);
    let api = {
        let shared = Some((conn.clone(), fence.clone()));
        let (config, tls) = (config.clone(), tls.is_some());
        tokio::task::spawn_blocking(move || crate::open::api(&config, master, tls, shared))
            .await
            .map_err(|e| StoreError::Etcd {
                op: "load the token registry",
                message: e.to_string(),
            })?
    };
    let api = match api {
        Ok(api) => api,
        // Deposed while loading, or etcd unavailable: a standby again (and retry).
        Err(e) if crate::ha::steps_down_on(Loading::Tokens, &e) => {
            tracing::warn!(error = %e, "cannot load the token registry as leader; stepping down");
            lead.leading.store(false, Ordering::Release);
            kept.abort();
            let _ = client.lease_revoke(lease).await;
            return Ok(Term::SteppedDown);
        }
        Err(e) => return Err(e),
    };
    let listener = bind(config).await?;
    // Announced instances as ServerSet members under the election lease. On the
    // master's runtime, not the connection's: `publish` takes the master's lock,
    // whose holder may be waiting for the store thread, which needs the
    // connection's one worker free to reach etcd.
    let announcer = tokio::spawn(crate::announce_etcd::publish(
        conn.client(),
        api.master.clone(),
        lease,
    ));
    let keeper = kept.abort_handle();
    let shutdown = {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                _ = kept => tracing::warn!("lost the election lease: stepping down"),
            }
        }
    };
    let lead2 = lead.clone();
    tracing::info!(url = %lead.url, "leading");
    let served =
        crate::server::serve_wrapped(api, listener, tls, shutdown, move |r| gated(r, &lead2)).await;
    keeper.abort();
    announcer.abort();
    lead.leading.store(false, Ordering::Release);
    lead.valid_until.store(0, Ordering::Release);
    // Give leadership up at once so a standby need not wait for the lease.
    let _ = client
        .resign(Some(ResignOptions::new().with_leader(key)))
        .await;
    let _ = client.lease_revoke(lease).await;
    crate::ha::after_leading(*stop.borrow(), served)
}
