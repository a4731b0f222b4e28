//! A connection to the etcd cluster with the runtime that drives it, blocking
//! calls from the store's writer thread, and etcd's errors as store errors.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::options::EtcdOptions;
use super::REQUEST_MARGIN;
use crate::store::StoreError;

/// The store error of a failed etcd request. etcd's "database space exceeded"
/// (gRPC RESOURCE_EXHAUSTED: the backend reached `--quota-backend-bytes`, and the
/// NOSPACE alarm refuses every write that adds data until it is disarmed) is
/// [`StoreError::NoSpace`]: the master goes read-only like on a full disk, and
/// resumes once a write works again.
pub(super) fn etcd(op: &'static str) -> impl Fn(etcd_client::Error) -> StoreError {
    move |e| {
        if etcd_no_space(&e) {
            StoreError::NoSpace {
                op,
                detail: format!(
                    "etcd is out of space ({e}); compact and defragment etcd, then disarm its NOSPACE alarm (`etcdctl alarm disarm`), or raise its --quota-backend-bytes"
                ),
            }
        } else {
            StoreError::Etcd {
                op,
                message: e.to_string(),
            }
        }
    }
}

/// Whether etcd refused a request for want of space (its quota or NOSPACE alarm).
pub(crate) fn etcd_no_space(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::ResourceExhausted && s.message().contains("space exceeded"))
}

/// A connection to the etcd cluster with the runtime that drives it.
pub struct EtcdConn {
    /// Always Some until dropped (taken to shut it down without blocking).
    runtime: Option<tokio::runtime::Runtime>,
    client: Client,
    /// The cluster's limits, from the options.
    pub limits: Limits,
}

/// How large one etcd transaction may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Operations per transaction.
    pub max_ops: usize,
    /// Bytes of keys and values per transaction.
    pub max_bytes: usize,
}

impl EtcdConn {
    /// Connects to the cluster (fails when no member answers within a few seconds).
    pub fn connect(options: &EtcdOptions) -> Result<Arc<EtcdConn>, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("drover-etcd")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Etcd {
                op: "start the etcd runtime",
                message: e.to_string(),
            })?;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2));
        if let Some(ca) = &options.ca {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|e| StoreError::Etcd {
                    op: "read the etcd TLS files",
                    message: format!("{}: {e}", path.display()),
                })
            };
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let Some((cert, key)) = &options.identity {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            connect = connect.with_tls(tls);
        }
        let endpoints = options.endpoints.clone();
        let client = block(Some(&runtime), async move {
            let mut client = Client::connect(endpoints, Some(connect)).await?;
            // Connecting is lazy: ask once so a wrong address fails here.
            client.status().await?;
            Ok::<_, etcd_client::Error>(client)
        })
        .map_err(etcd("connect to etcd"));
        let client = match client {
            Ok(c) => c,
            Err(e) => {
                // Dropping a runtime blocks, which panics inside another runtime.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        Ok(Arc::new(EtcdConn {
            runtime: Some(runtime),
            client,
            limits: Limits {
                max_ops: options.max_txn_ops.max(2),
                max_bytes: options
                    .max_request_bytes
                    .saturating_sub(REQUEST_MARGIN)
                    .max(4096),
            },
        }))
    }

    /// A client handle (cheap to clone) for async code in any runtime.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Runs `fut` on the connection's runtime (where the client's connections live).
    /// `fut` must never block on the master's lock: the lock's holder may be
    /// waiting for a store request that needs this runtime's one worker.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(rt) => rt.spawn(fut),
            None => tokio::spawn(fut),
        }
    }

    /// Runs `fut` on the connection's runtime and waits for it.
    pub fn block<F>(&self, fut: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        block(self.runtime.as_ref(), fut)
    }
}

impl Drop for EtcdConn {
    fn drop(&mut self) {
        // The last handle may go inside the master's runtime, where dropping a
        // runtime (which blocks) would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Spawns `fut` on `runtime` and blocks this thread on its result: usable from
/// plain threads and from inside another tokio runtime.
fn block<F>(runtime: Option<&tokio::runtime::Runtime>, fut: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = async move {
        let _ = tx.send(fut.await);
    };
    // The runtime is only taken by Drop, never while the connection is borrowed.
    if let Some(runtime) = runtime {
        runtime.spawn(task);
    }
    // The spawned task always sends unless the runtime is shutting down, which
    // only happens when the connection is dropped (not while it is borrowed).
    rx.recv().unwrap_or_else(|_| std::process::abort())
}
