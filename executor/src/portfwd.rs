//! The named ports of a `task.network: isolated` task, forwarded from the host into
//! the task's network namespace.
//!
//! The task binds its port inside its namespace as usual (`{{ports.http}}` is the
//! number the agent assigned); the executor listens on the host on that same port
//! (`0.0.0.0:<port>`, IPv4) and, for each connection it accepts, opens a socket in
//! the task's namespace and connects it to `127.0.0.1:<port>` there, then copies both
//! ways until both sides closed. Health checks and the `lifecycle.http` POSTs go to
//! `127.0.0.1:<port>` on the host, so they reach the task through the forwarder too.
//!
//! A socket belongs to the network namespace of the thread that created it, so the
//! inner socket is made on the executor's own thread between two `setns` calls: into
//! the namespace (through the namespaces' init's pidfd) and back (a descriptor of the
//! executor's own namespace, opened once). Nothing awaits in between; the connect
//! itself happens afterwards, non-blocking, on the runtime. At most
//! [`MAX_CONNECTIONS`] connections per task are forwarded at once (two descriptors
//! each); beyond that the listeners stop accepting until one closes, and the kernel's
//! backlog holds the rest.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::sched::CloneFlags;
use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;

use crate::ns::TaskNamespaces;

/// Connections forwarded at once per task, all ports together.
pub const MAX_CONNECTIONS: usize = 256;

/// Where connections go: the task's network namespace, and the way back out of it.
#[derive(Debug)]
struct Inside {
    ns: Arc<TaskNamespaces>,
    /// The executor's own network namespace.
    own: OwnedFd,
}

impl Inside {
    /// A fresh non-blocking TCP socket in the task's network namespace.
    fn socket(&self) -> io::Result<OwnedFd> {
        nix::sched::setns(self.ns.init_pidfd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            io::Error::other(format!("cannot enter the task's network namespace: {e}"))
        })?;
        let socket = nix::sys::socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        );
        let back = nix::sched::setns(self.own.as_fd(), CloneFlags::CLONE_NEWNET);
        if let Err(e) = back {
            // Everything else this thread does (health checks, the socket's clients)
            // would then happen inside the task's namespace: not worth going on.
            crate::diag!("drover-executor: cannot return to the executor's network namespace: {e}");
            std::process::abort();
        }
        socket.map_err(io::Error::from)
    }

    /// A connection to `127.0.0.1:port` in the task's namespace.
    async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(self.socket()?));
        socket
            .connect(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)))
            .await
    }
}

/// The forwarding of a task's ports: [`Forwarding::stop`] (or dropping it) closes the
/// listeners, so that the agent may give the ports to another task once this one
/// ended, while its executor still waits for the agent to take the terminal status.
#[derive(Debug)]
pub struct Forwarding {
    accepting: Vec<tokio::task::JoinHandle<()>>,
    inside: Arc<Inside>,
}

/// Connects to the task's ports inside its namespace, not through the forwarder
/// (whose accept says nothing about the task): the TCP health check.
#[derive(Clone, Debug)]
pub struct Prober(Arc<Inside>);

impl Prober {
    /// A connection to `127.0.0.1:port` in the task's network namespace.
    pub async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        self.0.connect(port).await
    }
}

impl Forwarding {
    /// What the TCP health check connects with.
    pub fn prober(&self) -> Prober {
        Prober(self.inside.clone())
    }

    /// Closes the listeners (the connections still open end with the task).
    pub fn stop(&mut self) {
        for accepting in self.accepting.drain(..) {
            accepting.abort();
        }
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why the forwarding of a task's ports did not start.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot open the executor's network namespace: {0}")]
    OwnNamespace(io::Error),
    #[error(
        "cannot listen on port {port} to forward it into the task's network namespace: {source}"
    )]
    Listen { port: u16, source: io::Error },
}

/// Listens on the host on each of `ports` and forwards every connection into the
/// task's namespaces `ns` (to `127.0.0.1` on the same port), until the returned
/// [`Forwarding`] is stopped. Fails, naming the port, when one cannot be listened on.
pub fn start(ports: &[u16], ns: Arc<TaskNamespaces>) -> Result<Forwarding, ForwardError> {
    let own =
        std::fs::File::open("/proc/thread-self/ns/net").map_err(ForwardError::OwnNamespace)?;
    let inside = Arc::new(Inside {
        ns,
        own: own.into(),
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut listeners = Vec::with_capacity(ports.len());
    for &port in ports {
        listeners.push((
            port,
            listen(port).map_err(|source| ForwardError::Listen { port, source })?,
        ));
    }
    let accepting = listeners
        .into_iter()
        .map(|(port, listener)| {
            tokio::spawn(accept_loop(port, listener, inside.clone(), slots.clone()))
        })
        .collect();
    Ok(Forwarding { accepting, inside })
}

/// A listener on `0.0.0.0:port` (with `SO_REUSEADDR`, so connections of an earlier
/// executor's in `TIME_WAIT` do not block it).
fn listen(port: u16) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::UNSPECIFIED,
        port,
    )))?;
    socket.listen(1024)
}

async fn accept_loop(port: u16, listener: TcpListener, inside: Arc<Inside>, slots: Arc<Semaphore>) {
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let outer = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, mostly: wait a little instead of spinning.
                crate::diag!("drover-executor: accepting on forwarded port {port}: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let inside = inside.clone();
        tokio::spawn(async move {
            let _slot = slot;
            forward(outer, port, &inside).await;
        });
    }
}

/// Copies between `outer` and a new connection to the task's `port`; a task not
/// listening (yet) closes `outer` at once.
async fn forward(mut outer: TcpStream, port: u16, inside: &Inside) {
    let Ok(mut inner) = inside.connect(port).await else {
        return;
    };
    let _ = outer.set_nodelay(true);
    let _ = inner.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut outer, &mut inner).await;
}
