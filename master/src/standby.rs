//! A standby's copy of the state (masters on etcd): a hot standby follows the
//! store and answers reads from its copy when the leader cannot answer them.
//!
//! While this master does not lead, `follow` reads the whole store from etcd at
//! one revision (without writing anything: `EtcdStore::reader`) whenever etcd's
//! revision moved, at most every [`FOLLOW_INTERVAL`] and never sooner than four
//! times what the last read took, and builds a read-only master over it: a
//! core loaded from the rows, the token registry as stored, the admin API's own
//! router. Nothing of the copy can write: its store and token registry refuse
//! every write before it reaches etcd, no timer runs on it, and only reads
//! (`readable`) are ever routed to it.
//!
//! The gate (`leader`) still forwards every admin request to the leader, so
//! reads are consistent by default (an acknowledged write is in every later
//! read). A read that says it accepts a stale answer (`X-Drover-Allow-Stale:
//! true`, like Nomad's and Consul's `stale` reads) is answered from the copy when
//! no leader is known or the leader gives no answer (a failover: the leader died
//! and its lease has not expired yet). Such an answer carries
//! `X-Drover-Copy-Index` (the store batch the copy holds) and
//! `X-Drover-Copy-Age-Ms` (how long ago it was read). Writes are never served
//! from the copy. While this master leads it keeps no copy.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method};
use axum::response::Response;
use axum::Router;
use drover_common::state::mono_ms;
use tower::ServiceExt as _;

use crate::audit::Audit;
use crate::config::Config;
use crate::core::Core;
use crate::etcd_store::{EtcdConn, EtcdStore};
use crate::http::Api;
use crate::runtime::{now, seed, Master};
use crate::store::{StoreError, Writer};
use crate::tls::PeerCert;
use crate::tokens::Tokens;

pub use crate::ha::FOLLOW_INTERVAL;

/// Request header: `true` lets a standby answer the read from its copy when the
/// leader cannot.
pub use drover_common::wire::ALLOW_STALE_HEADER;
pub use drover_common::wire::{COPY_AGE_HEADER, COPY_INDEX_HEADER};

/// The copy as last read.
#[derive(Clone)]
struct Loaded {
    router: Router,
    master: Arc<Master>,
    /// etcd's revision the copy was read at.
    revision: i64,
    /// The store batch it holds.
    index: u64,
    /// When it was read (monotonic ms).
    read_at: u64,
}

/// A standby's copy of the state (none until first read, none while leading).
#[derive(Default)]
pub struct Copy {
    loaded: RwLock<Option<Loaded>>,
}

impl Copy {
    fn get(&self) -> Option<Loaded> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `new` in place of the copy (None: drops it); returns the old one.
    fn replace(&self, new: Option<Loaded>) -> Option<Loaded> {
        std::mem::replace(
            &mut *self.loaded.write().unwrap_or_else(|p| p.into_inner()),
            new,
        )
    }

    /// The copy's master (the DNS server answers from it).
    pub fn master(&self) -> Option<Arc<Master>> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|l| l.master.clone())
    }

    /// (store batch, age in ms) of the copy, for `/health`.
    pub fn describe(&self) -> Option<(u64, u64)> {
        self.get()
            .map(|l| (l.index, mono_ms().saturating_sub(l.read_at)))
    }

    /// Whether a copy is loaded and `request` is a read it may answer.
    pub fn can_answer(&self, request: &Request) -> bool {
        readable(request)
            && self
                .loaded
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
    }

    /// Answers `request` from the copy (None: no copy).
    pub async fn answer(&self, request: Request) -> Option<Response> {
        let loaded = self.get()?;
        let mut response = loaded.router.oneshot(request).await.ok()?;
        let headers = response.headers_mut();
        headers.insert(COPY_INDEX_HEADER, HeaderValue::from(loaded.index));
        headers.insert(
            COPY_AGE_HEADER,
            HeaderValue::from(mono_ms().saturating_sub(loaded.read_at)),
        );
        Some(response)
    }
}

/// Whether the copy may answer `request` (`ha::copy_may_answer`): a GET or
/// HEAD that accepts a stale answer, of the admin API or the web UI.
pub fn readable(request: &Request) -> bool {
    let stale_ok = request
        .headers()
        .get(ALLOW_STALE_HEADER)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    crate::ha::copy_may_answer(read, request.uri().path(), stale_ok)
}

/// A body-less duplicate of a read (method, URI, headers, client certificate),
/// to answer from the copy should forwarding the original fail.
pub fn duplicate(request: &Request) -> Request {
    let mut again = Request::new(Body::empty());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.version_mut() = request.version();
    *again.headers_mut() = request.headers().clone();
    if let Some(cert) = request.extensions().get::<PeerCert>() {
        again.extensions_mut().insert(cert.clone());
    }
    again
}

/// Reads the store into a new copy if etcd's revision moved past `have`.
fn read_if_moved(
    conn: &Arc<EtcdConn>,
    config: &Config,
    have: Option<i64>,
) -> Result<Option<Loaded>, StoreError> {
    let store = EtcdStore::reader(conn.clone());
    if crate::ha::copy_is_current(have, store.revision().unwrap_or(0)) {
        return Ok(None);
    }
    // A large commit half applied: keep the copy there is and look again.
    let Some((snapshot, revision)) = store.read_snapshot()? else {
        return Ok(None);
    };
    let core = Core::load(config.core.clone(), snapshot, now(), seed());
    let index = core.seq();
    let writer = Writer::start(Box::new(EtcdStore::reader(conn.clone())), index);
    let master = Master::new(core, writer);
    let tokens =
        Tokens::open_etcd(EtcdStore::reader(conn.clone())).map_err(|e| StoreError::Etcd {
            op: "read the token registry",
            message: e.to_string(),
        })?;
    let api = Arc::new(Api {
        master: master.clone(),
        tokens: Arc::new(tokens),
        // A copy answers reads only, and reads are not audited.
        audit: Audit::discard(),
        agent_certs: config.tls.is_some(),
        // The same files serve this standby's listener: read already at start.
        http: crate::tls::log_client(config.tls.as_ref()).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the copy reads no agent's logs over TLS");
            reqwest::Client::new()
        }),
        limiter: Default::default(),
    });
    Ok(Some(Loaded {
        router: crate::http::router(api),
        master,
        revision,
        index,
        read_at: mono_ms(),
    }))
}

/// Reads the store into `copy` now, whatever etcd's revision (benches); the
/// store batch the copy holds, or None while a large commit is half applied.
pub fn read_now(
    copy: &Copy,
    conn: &Arc<EtcdConn>,
    config: &Config,
) -> Result<Option<u64>, StoreError> {
    let Some(loaded) = read_if_moved(conn, config, None)? else {
        return Ok(None);
    };
    let index = loaded.index;
    end(copy.replace(Some(loaded)));
    Ok(Some(index))
}

/// Keeps `copy` following the store while `leading` says this master does not
/// lead (dropping it while it leads), until the task is dropped.
pub async fn follow(
    conn: Arc<EtcdConn>,
    config: Config,
    copy: Arc<Copy>,
    leading: impl Fn() -> bool,
) {
    let mut told = false;
    let mut pause = FOLLOW_INTERVAL;
    loop {
        tokio::time::sleep(pause).await;
        pause = FOLLOW_INTERVAL;
        // A leader keeps no copy.
        if leading() {
            retire(copy.replace(None)).await;
            continue;
        }
        let have = copy.get().map(|l| l.revision);
        let (conn, config) = (conn.clone(), config.clone());
        let began = Instant::now();
        let read = tokio::task::spawn_blocking(move || read_if_moved(&conn, &config, have)).await;
        match read {
            Ok(Ok(Some(loaded))) => {
                pause = crate::ha::follow_pause(began.elapsed());
                tracing::debug!(
                    index = loaded.index,
                    took_ms = began.elapsed().as_millis() as u64,
                    "standby: read the store into its copy"
                );
                told = false;
                retire(copy.replace(Some(loaded))).await;
            }
            Ok(Ok(None)) | Err(_) => {}
            Ok(Err(e)) => {
                if !told {
                    tracing::warn!(error = %e, "standby: cannot read the store into its copy; retrying");
                    told = true;
                }
            }
        }
    }
}

/// Ends an old copy off the async threads (closing joins its writer thread).
async fn retire(old: Option<Loaded>) {
    if old.is_some() {
        let _ = tokio::task::spawn_blocking(move || end(old)).await;
    }
}

/// Ends an old copy: its long polls end, its writer thread stops.
fn end(old: Option<Loaded>) {
    if let Some(old) = old {
        old.master.stopping.send_replace(true);
        old.master.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, stale: Option<&str>) -> Request {
        let mut r = Request::builder().method(method).uri(path);
        if let Some(v) = stale {
            r = r.header(ALLOW_STALE_HEADER, v);
        }
        r.body(Body::empty()).unwrap()
    }

    #[test]
    fn only_reads_that_accept_a_stale_answer_are_answered_from_the_copy() {
        for path in [
            "/v1/jobs",
            "/v1/jobs/r/e/n",
            "/v1/hosts",
            "/v1/changes",
            "/ui/",
        ] {
            assert!(
                readable(&request(Method::GET, path, Some("true"))),
                "{path}"
            );
            assert!(
                readable(&request(Method::GET, path, Some("TRUE"))),
                "{path}"
            );
            assert!(
                !readable(&request(Method::GET, path, None)),
                "{path}: consistent read"
            );
            assert!(!readable(&request(Method::GET, path, Some("1"))), "{path}");
        }
        for (method, path) in [
            (Method::POST, "/v1/jobs"),
            (Method::DELETE, "/v1/jobs/r/e/n"),
            (Method::GET, "/metrics"),
            (Method::GET, "/v1/agents/a1/assignments"),
            (Method::GET, "/v1/tasks/t1/logs/main/stdout"),
            (Method::GET, "/v1/tasks/t1/logs"),
        ] {
            assert!(
                !readable(&request(method.clone(), path, Some("true"))),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn a_duplicate_keeps_what_the_copy_needs_to_answer() {
        let original = request(Method::GET, "/v1/jobs?role=www", Some("true"));
        let again = duplicate(&original);
        assert_eq!(again.method(), Method::GET);
        assert_eq!(again.uri(), original.uri());
        assert_eq!(again.headers(), original.headers());
    }
}
