//! The status history and the executor's Unix socket: every status the executor
//! emits is kept (a task emits few), and each client that subscribes gets the ones
//! after its `after_seq`, then every new one, as JSON lines. A client may also ask
//! for a kill. Clients come and go without touching the task.

use std::sync::{Arc, Mutex};

use drover_common::state::ExitReason;
use drover_common::wire::{ExecutorRequest, ExecutorStatus};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};

/// How many statuses are kept for replay; older ones are dropped a quarter at a
/// time (a subscriber sees the gap in `seq`).
pub const MAX_HISTORY: usize = 4096;

/// What the socket tells the runner.
#[derive(Debug)]
pub enum ClientEvent {
    /// A client connected.
    Connected,
    /// A client disconnected.
    Gone,
    /// A client asked for a kill.
    Kill(ExitReason),
    /// A subscriber was sent a terminal status.
    TerminalDelivered,
}

/// Every status emitted so far, and a signal for new ones.
#[derive(Clone, Debug)]
pub struct Hub {
    history: Arc<Mutex<Vec<ExecutorStatus>>>,
    latest: Arc<watch::Sender<u64>>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            history: Arc::default(),
            latest: Arc::new(watch::channel(0).0),
        }
    }
}

impl Hub {
    /// Records a new status and wakes the subscribers. A status of the same
    /// non-terminal state as the latest one replaces it (it repeats the state with a
    /// newer process list), so the history holds few statuses however often the
    /// processes change; a subscriber sees the gap in `seq`.
    pub fn publish(&self, status: ExecutorStatus) {
        let seq = status.seq;
        if let Ok(mut h) = self.history.lock() {
            if h.last()
                .is_some_and(|l| l.state == status.state && !l.state.is_terminal())
            {
                h.pop();
            }
            // A daemon restarting for months must not grow this without bound.
            if h.len() >= MAX_HISTORY {
                h.drain(..MAX_HISTORY / 4);
            }
            h.push(status);
        }
        self.latest.send_replace(seq);
    }

    /// The statuses after `after_seq`; when there are none, the current one if
    /// `or_current`.
    fn after(&self, after_seq: u64, or_current: bool) -> Vec<ExecutorStatus> {
        let Ok(h) = self.history.lock() else {
            return Vec::new();
        };
        let newer: Vec<ExecutorStatus> = h.iter().filter(|s| s.seq > after_seq).cloned().collect();
        if newer.is_empty() && or_current {
            h.last().cloned().into_iter().collect()
        } else {
            newer
        }
    }
}

/// Accepts clients on `listener` until the runtime ends.
pub async fn serve(listener: UnixListener, hub: Hub, events: mpsc::UnboundedSender<ClientEvent>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_client(stream, hub.clone(), events.clone()));
            }
            Err(e) => {
                crate::diag!("drover-executor: accepting a socket client failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Where the executor's clients come from.
#[derive(Debug)]
pub enum Clients {
    /// The socket, bound: clients connect to it.
    Listening(UnixListener),
    /// A connection the agent handed over at the start (a socketpair end passed
    /// through the fork server): served as a client; once it closes (the agent
    /// stopped, crashed or dropped it) the socket is bound and clients are accepted on
    /// it, so that a restarted agent can connect. Until then no socket file exists.
    Agent(UnixStream),
}

/// Serves `clients` until the runtime ends; `bind` binds the socket when the agent's
/// connection closes ([`Clients::Agent`]).
pub async fn serve_clients(
    clients: Clients,
    bind: impl FnOnce() -> std::io::Result<UnixListener>,
    hub: Hub,
    events: mpsc::UnboundedSender<ClientEvent>,
) {
    let agent = match clients {
        Clients::Listening(listener) => return serve(listener, hub, events).await,
        Clients::Agent(agent) => agent,
    };
    serve_client(agent, hub.clone(), events.clone()).await;
    match bind() {
        Ok(listener) => serve(listener, hub, events).await,
        Err(e) => crate::diag!(
            "drover-executor: the agent's connection closed and the socket cannot be bound ({e}); no agent can reach this executor, which ends the task at the recovery timeout"
        ),
    }
}

/// The runtime's stream for an inherited connected Unix stream socket (non-blocking
/// from here on), for [`Clients::Agent`]. None if `fd` is not such a socket.
pub fn adopt_stream(fd: std::os::fd::OwnedFd) -> Option<UnixStream> {
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true).ok()?;
    UnixStream::from_std(stream).ok()
}

async fn serve_client(stream: UnixStream, hub: Hub, events: mpsc::UnboundedSender<ClientEvent>) {
    let _ = events.send(ClientEvent::Connected);
    let (read, write) = stream.into_split();
    let mut write = Some(write);
    let mut writer = None;
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<ExecutorRequest>(&line) {
            Ok(ExecutorRequest::Subscribe { after_seq }) => {
                if let Some(w) = write.take() {
                    writer = Some(tokio::spawn(stream_statuses(
                        w,
                        hub.clone(),
                        after_seq,
                        events.clone(),
                    )));
                }
            }
            Ok(ExecutorRequest::Kill { reason }) => {
                let _ = events.send(ClientEvent::Kill(
                    reason.unwrap_or(ExitReason::KilledByRequest),
                ));
            }
            Err(e) => {
                crate::diag!("drover-executor: ignoring a bad socket request ({e}): {line}");
                if let Some(w) = write.as_mut() {
                    let msg = serde_json::json!({ "error": format!("bad request: {e}") });
                    let _ = w.write_all(format!("{msg}\n").as_bytes()).await;
                }
            }
        }
    }
    if let Some(w) = writer {
        w.abort();
    }
    let _ = events.send(ClientEvent::Gone);
}

async fn stream_statuses(
    mut out: OwnedWriteHalf,
    hub: Hub,
    after_seq: u64,
    events: mpsc::UnboundedSender<ClientEvent>,
) {
    let mut changed = hub.latest.subscribe();
    let mut last = after_seq;
    let mut first = true;
    loop {
        changed.mark_unchanged();
        for status in hub.after(last, first) {
            let Ok(mut line) = serde_json::to_vec(&status) else {
                return;
            };
            line.push(b'\n');
            if out.write_all(&line).await.is_err() {
                return;
            }
            last = last.max(status.seq);
            first = false;
            if status.state.is_terminal() {
                let _ = events.send(ClientEvent::TerminalDelivered);
            }
        }
        if changed.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::state::TaskState;

    /// A status whose state differs from the previous seq's (none replaces another).
    fn status(seq: u64) -> ExecutorStatus {
        ExecutorStatus {
            seq,
            task_id: "t".into(),
            state: if seq.is_multiple_of(2) {
                TaskState::Running
            } else {
                TaskState::Starting
            },
            exit_reason: None,
            message: String::new(),
            timestamp_ms: 0,
            executor_pid: 1,
            processes: vec![],
            escalation: None,
        }
    }

    #[test]
    fn replay_gives_newer_statuses_or_else_the_current_one() {
        let hub = Hub::default();
        for seq in 1..=5 {
            hub.publish(status(seq));
        }
        let seqs = |v: Vec<ExecutorStatus>| v.into_iter().map(|s| s.seq).collect::<Vec<_>>();
        assert_eq!(seqs(hub.after(2, true)), vec![3, 4, 5]);
        assert_eq!(seqs(hub.after(5, true)), vec![5]);
        assert_eq!(seqs(hub.after(9, false)), Vec::<u64>::new());
    }

    #[test]
    fn history_is_bounded() {
        let hub = Hub::default();
        for seq in 1..=(MAX_HISTORY as u64 + 10) {
            hub.publish(status(seq));
        }
        let kept = hub.after(0, true);
        assert!(kept.len() <= MAX_HISTORY);
        assert_eq!(kept.last().map(|s| s.seq), Some(MAX_HISTORY as u64 + 10));
    }

    #[test]
    fn a_status_repeating_the_state_replaces_the_latest() {
        let hub = Hub::default();
        hub.publish(status(1));
        for seq in 2..=10_000 {
            let mut s = status(seq);
            s.state = TaskState::Running;
            hub.publish(s);
        }
        let mut end = status(10_001);
        end.state = TaskState::Killed;
        hub.publish(end.clone());
        hub.publish(end);
        let kept: Vec<(u64, TaskState)> = hub
            .after(0, true)
            .iter()
            .map(|s| (s.seq, s.state))
            .collect();
        assert_eq!(
            kept,
            vec![
                (1, TaskState::Starting),
                (10_000, TaskState::Running),
                (10_001, TaskState::Killed),
                (10_001, TaskState::Killed)
            ]
        );
    }

    /// Subscribes on `stream` after `after_seq`: its status lines and its write half.
    async fn subscribe(
        stream: UnixStream,
        after_seq: u64,
    ) -> (
        tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
        tokio::net::unix::OwnedWriteHalf,
    ) {
        let (read, mut write) = stream.into_split();
        let op = format!("{{\"op\":\"subscribe\",\"after_seq\":{after_seq}}}\n");
        write.write_all(op.as_bytes()).await.unwrap();
        (BufReader::new(read).lines(), write)
    }

    /// The `seq` of a status line.
    fn seq(line: Option<String>) -> u64 {
        serde_json::from_str::<ExecutorStatus>(&line.unwrap())
            .unwrap()
            .seq
    }

    #[tokio::test]
    async fn a_subscriber_gets_the_replay_then_new_statuses_and_kills_are_forwarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let hub = Hub::default();
        hub.publish(status(1));
        hub.publish(status(2));
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(serve(listener, hub.clone(), tx));
        let stream = UnixStream::connect(&path).await.unwrap();
        let (mut lines, mut write) = subscribe(stream, 1).await;
        assert_eq!(seq(lines.next_line().await.unwrap()), 2);
        hub.publish(status(3));
        assert_eq!(seq(lines.next_line().await.unwrap()), 3);
        write.write_all(b"{\"op\":\"kill\"}\n").await.unwrap();
        assert!(matches!(rx.recv().await, Some(ClientEvent::Connected)));
        assert!(matches!(
            rx.recv().await,
            Some(ClientEvent::Kill(ExitReason::KilledByRequest))
        ));
        drop(write);
        drop(lines);
        assert!(matches!(rx.recv().await, Some(ClientEvent::Gone)));
    }

    #[tokio::test]
    async fn the_agents_connection_is_served_and_the_socket_bound_only_once_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let hub = Hub::default();
        hub.publish(status(1));
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let bind_path = path.clone();
        tokio::spawn(serve_clients(
            Clients::Agent(theirs),
            move || UnixListener::bind(bind_path),
            hub.clone(),
            tx,
        ));
        let (mut lines, write) = subscribe(ours, 0).await;
        assert_eq!(seq(lines.next_line().await.unwrap()), 1);
        assert!(matches!(rx.recv().await, Some(ClientEvent::Connected)));
        assert!(
            !path.exists(),
            "no socket file while the agent is connected"
        );
        drop(write);
        drop(lines);
        assert!(matches!(rx.recv().await, Some(ClientEvent::Gone)));
        // A new agent connects by path and gets what it missed.
        hub.publish(status(2));
        let stream = loop {
            match UnixStream::connect(&path).await {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        };
        let (mut lines, _write) = subscribe(stream, 1).await;
        assert_eq!(seq(lines.next_line().await.unwrap()), 2);
    }
}
