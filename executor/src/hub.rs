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
    /// Records a new status and wakes the subscribers.
    pub fn publish(&self, status: ExecutorStatus) {
        let seq = status.seq;
        if let Ok(mut h) = self.history.lock() {
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
                eprintln!("drover-executor: accepting a socket client failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
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
                eprintln!("drover-executor: ignoring a bad socket request ({e}): {line}");
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
