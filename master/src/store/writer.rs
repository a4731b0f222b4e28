//! The group-commit writer: one thread drains every pending batch, commits them
//! in one transaction, then publishes the committed sequence number and wakes the
//! agents whose assignment sets changed; read-only on a full disk (see `store`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::watch;

use super::{Store, StoreError, READ_ONLY_RETRY};
use crate::core::{Change, Snapshot};

/// One batch from the core: its changes, the agents to wake after the commit, and
/// the epoch of the core that made it (a batch of an older epoch is dropped).
struct Batch {
    seq: u64,
    epoch: u64,
    changes: Vec<Change>,
    notify: Vec<String>,
}

/// What the writer thread is asked.
enum Msg {
    Commit(Batch),
    /// Load everything stored and send it back (the master reloads its core).
    Load(mpsc::Sender<Result<Snapshot, StoreError>>),
}

/// Long-poll wake-ups: one watch per agent whose value changes after each commit
/// that touched the agent's assignment set.
#[derive(Default)]
pub struct Notifier {
    agents: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Notifier {
    /// A receiver that changes whenever the agent's set changed and was committed.
    pub fn subscribe(&self, agent: &str) -> watch::Receiver<u64> {
        let mut map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(agent.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn wake(&self, agent: &str, seq: u64) {
        let map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(agent) {
            tx.send_replace(seq);
        }
    }
}

/// The committed sequence number, whether the store has failed, and whether it is
/// read-only for want of space.
pub struct CommitState {
    committed: AtomicU64,
    failed: AtomicBool,
    /// Why the store takes no writes now (out of space), if it does not.
    read_only: Mutex<Option<String>>,
    /// Bumped whenever a batch was not stored for want of space: a core of an
    /// older epoch is ahead of the store and must be reloaded from it.
    epoch: AtomicU64,
    changed: watch::Sender<u64>,
}

impl CommitState {
    fn new(committed: u64, read_only: Option<String>) -> CommitState {
        CommitState {
            committed: AtomicU64::new(committed),
            failed: AtomicBool::new(false),
            read_only: Mutex::new(read_only),
            epoch: AtomicU64::new(0),
            changed: watch::channel(committed).0,
        }
    }

    /// The highest batch seq committed.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Whether a commit failed (the master must stop: memory is ahead of the disk).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Why the store takes no writes now (its disk is full), or None when it does.
    pub fn read_only(&self) -> Option<String> {
        self.read_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The epoch of the store: it changes whenever a batch was dropped unstored.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Changes after each commit (and on failure, and when the store turns
    /// read-only or writable).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn set_read_only(&self, why: Option<String>) {
        *self.read_only.lock().unwrap_or_else(|p| p.into_inner()) = why;
        self.changed.send_modify(|_| {});
    }

    /// A batch was not stored for want of space (`why`): read-only, with the
    /// reason in place before the new epoch tells waiters their batch is gone.
    fn reject(&self, why: String) {
        *self.read_only.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.changed.send_modify(|_| {});
    }

    /// Marks the store failed for good (the master stops).
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.changed.send_replace(u64::MAX);
    }
}

/// What a read-only store answers: the reason for the error and `/health`.
fn read_only_reason(e: &StoreError) -> String {
    format!("the store has no space left ({e}); reads are served, writes resume by themselves once space is freed")
}

/// The group-commit writer thread.
pub struct Writer {
    tx: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    /// Commit progress, shared with waiters.
    pub state: Arc<CommitState>,
    /// Long-poll wake-ups, shared with the HTTP layer.
    pub notifier: Arc<Notifier>,
}

/// The writer thread's own state.
struct Thread {
    store: Box<dyn Store>,
    state: Arc<CommitState>,
    notifier: Arc<Notifier>,
}

impl Thread {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut next: Option<Msg> = None;
        loop {
            let msg = match next.take() {
                Some(m) => m,
                None if self.state.read_only().is_some() => {
                    match rx.recv_timeout(READ_ONLY_RETRY) {
                        Ok(m) => m,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            self.try_resume();
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match rx.recv() {
                    Ok(m) => m,
                    Err(_) => return,
                },
            };
            match msg {
                Msg::Load(reply) => {
                    let _ = reply.send(self.store.load());
                }
                Msg::Commit(first) => {
                    let mut batches = vec![first];
                    while let Ok(more) = rx.try_recv() {
                        match more {
                            Msg::Commit(b) => batches.push(b),
                            load => {
                                next = Some(load);
                                break;
                            }
                        }
                    }
                    if !self.commit(batches) {
                        return;
                    }
                }
            }
        }
    }

    /// Commits the batches of the current epoch; false when the store failed for
    /// good (the thread ends).
    fn commit(&mut self, mut batches: Vec<Batch>) -> bool {
        let st = self.state.clone();
        // Made on top of a batch that was not stored: dropped, their waiters
        // learn it from the epoch.
        let epoch = st.epoch();
        batches.retain(|b| b.epoch == epoch);
        let Some(last) = batches.last().map(|b| b.seq) else {
            return true;
        };
        let mut changes: Vec<Change> = batches
            .iter_mut()
            .flat_map(|b| b.changes.drain(..))
            .collect();
        changes.push(Change::Index(last));
        let began = std::time::Instant::now();
        let result = self.store.commit(&changes);
        let m = &crate::metrics::METRICS;
        m.store_commit.observe(began.elapsed().as_secs_f64());
        m.group_commit_batches.observe(batches.len() as f64);
        match result {
            Ok(()) => {
                st.committed.store(last, Ordering::Release);
                if st.read_only().is_some() {
                    tracing::warn!(
                        "the store takes writes again: the master leaves read-only mode"
                    );
                    st.set_read_only(None);
                }
                st.changed.send_replace(last);
                for b in &batches {
                    for agent in &b.notify {
                        self.notifier.wake(agent, b.seq);
                    }
                }
                true
            }
            Err(e) if e.is_no_space() => {
                if st.read_only().is_none() {
                    tracing::error!(error = %e, "store commit failed for want of space: the master is read-only until space is freed; the write was not stored");
                }
                st.reject(read_only_reason(&e));
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "store commit failed; the master must restart");
                st.fail();
                false
            }
        }
    }

    /// Read-only: tries a write that changes nothing (the stored index,
    /// rewritten); writes resume if it works.
    fn try_resume(&mut self) {
        let st = self.state.clone();
        match self.store.commit(&[Change::Index(st.committed())]) {
            Ok(()) => {
                tracing::warn!("space is back: the master leaves read-only mode");
                st.set_read_only(None);
            }
            Err(e) if e.is_no_space() => {}
            Err(e) => {
                tracing::error!(error = %e, "store write failed; the master must restart");
                st.fail();
            }
        }
    }
}

impl Writer {
    /// Starts the writer thread over `store`; `committed` is the seq already stored.
    pub fn start(store: Box<dyn Store>, committed: u64) -> Writer {
        Writer::spawn(store, committed, None)
    }

    /// Starts a writer that is read-only from the start, for a store that could not
    /// be opened for want of space (`why`, e.g. a [`DeferredSqliteStore`]): it tries
    /// a write every [`READ_ONLY_RETRY`] until one succeeds, then writes resume.
    pub fn start_read_only(store: Box<dyn Store>, committed: u64, why: &StoreError) -> Writer {
        Writer::spawn(store, committed, Some(read_only_reason(why)))
    }

    fn spawn(store: Box<dyn Store>, committed: u64, read_only: Option<String>) -> Writer {
        let (tx, rx) = mpsc::channel::<Msg>();
        let state = Arc::new(CommitState::new(committed, read_only));
        let notifier = Arc::new(Notifier::default());
        let thread = Thread {
            store,
            state: state.clone(),
            notifier: notifier.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("drover-store".to_string())
            .spawn(move || thread.run(rx));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the store thread");
                state.failed.store(true, Ordering::Release);
                None
            }
        };
        Writer {
            tx: Some(tx),
            thread,
            state,
            notifier,
        }
    }

    /// Queues a batch. Call in seq order (under the core's lock).
    pub fn submit(&self, seq: u64, changes: Vec<Change>, notify: Vec<String>) {
        self.submit_from(seq, self.state.epoch(), changes, notify);
    }

    /// Queues a batch made by a core of store epoch `epoch` (dropped unstored if
    /// the store dropped one since). Call in seq order (under the core's lock).
    pub fn submit_from(&self, seq: u64, epoch: u64, changes: Vec<Change>, notify: Vec<String>) {
        let sent = self
            .tx
            .as_ref()
            .map(|tx| {
                tx.send(Msg::Commit(Batch {
                    seq,
                    epoch,
                    changes,
                    notify,
                }))
                .is_ok()
            })
            .unwrap_or(false);
        if !sent {
            self.state.fail();
        }
    }

    /// Everything stored, read by the writer thread after the batches queued
    /// before (blocks until then).
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        let (reply, answer) = mpsc::channel();
        let tx = self.tx.as_ref().ok_or(StoreError::Stopped)?;
        tx.send(Msg::Load(reply)).map_err(|_| StoreError::Stopped)?;
        answer.recv().map_err(|_| StoreError::Stopped)?
    }

    /// Wakes agents without a store change.
    pub fn wake_now(&self, agents: &[String], seq: u64) {
        for a in agents {
            self.notifier.wake(a, seq);
        }
    }

    /// Commits what is queued and stops the thread.
    pub fn close(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}
