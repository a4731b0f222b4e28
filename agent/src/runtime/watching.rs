//! Starting and watching executors: one watcher per executor follows its statuses
//! over its socket, forwards kill requests, and when the executor is gone reports what
//! the pure core decides (its checkpoint, or LOST). Agent-decided statuses are
//! numbered and recorded here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drover_common::state::{now_ms, ExitReason, TaskState};
use drover_common::validate::MAX_PROCESSES;
use drover_common::wire::{
    Assignment, ExecutorStatus, ExecutorTask, OmittedProcesses, StatusUpdate,
};
use tokio::sync::{mpsc, watch};

use super::{lock, Shared, Tasks};
use crate::converge;
use crate::executor::{self, ExecutorProcess};
use crate::host::{self, Gone, Verdict};

use crate::sandbox::{recorded_executor_pid, SandboxIo};

/// How long a new executor's readiness pipe is waited for before polling its socket.
const READY_WAIT: Duration = Duration::from_secs(2);

/// The longest status message relayed, in bytes; a longer one is cut.
const MAX_MESSAGE: usize = 4096;

/// The status update that relays an executor's status, bounded whatever the task
/// does: at most [`MAX_PROCESSES`] processes listed (what a valid spec declares; a
/// spec from before that limit is listed in part, the rest counted by state in
/// `processes_omitted`) and a message of at most
/// [`MAX_MESSAGE`] bytes.
pub(super) fn update_from_status(s: &ExecutorStatus) -> StatusUpdate {
    let mut message = s.message.clone();
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" [cut]");
    }
    StatusUpdate {
        task_id: s.task_id.clone(),
        seq: s.seq,
        state: s.state,
        exit_reason: s.exit_reason.clone(),
        message,
        timestamp_ms: s.timestamp_ms,
        processes: s.processes.iter().take(MAX_PROCESSES).cloned().collect(),
        processes_omitted: OmittedProcesses::of(s.processes.get(MAX_PROCESSES..).unwrap_or(&[])),
    }
}

/// The status update of an agent-decided `verdict`, numbered past every sequence
/// number known for its task (the outbox's and `seen`) and stamped now.
pub(super) fn numbered(shared: &Shared, verdict: Verdict, seen: u64) -> StatusUpdate {
    let seq = host::next_seq([lock(&shared.outbox).last_seq(&verdict.task_id), seen]);
    verdict.into_update(seq, now_ms())
}

/// Starts the executor of a new task, then watches it.
pub(super) async fn start_task(
    shared: Arc<Shared>,
    assignment: Assignment,
    kill_rx: mpsc::UnboundedReceiver<ExitReason>,
) {
    let id = assignment.task.task_id.clone();
    if std::fs::symlink_metadata(shared.layout.task_dir(&id)).is_ok() {
        // A sandbox exists: the task ran or runs here. Never start a second copy.
        tracing::warn!(task_id = %id, "sandbox already exists; adopting instead of starting");
        return watch_task(shared, id, Watched::Adopted(None), kill_rx).await;
    }
    // Artifacts first, outside the start permits; the pins keep the cached copies
    // from eviction while the task lives. A kill while fetching ends the task at once
    // (the unpack helper is killed with the dropped future). The fetch is reported
    // as STARTING statuses numbered by the agent; the executor numbers its own
    // after them (`status_seq_base`).
    let mut kill_rx = kill_rx;
    let mut assignment = assignment;
    let _pins = if assignment.task.task.artifacts.is_empty() {
        None
    } else {
        let fetch_seq = AtomicU64::new(lock(&shared.outbox).last_seq(&id));
        let report = |message: String| {
            let seq = fetch_seq.fetch_add(1, Ordering::Relaxed) + 1;
            let _ = shared.updates_tx.send(StatusUpdate {
                task_id: id.clone(),
                seq,
                state: TaskState::Starting,
                exit_reason: None,
                message,
                timestamp_ms: now_ms(),
                processes: Vec::new(),
                processes_omitted: None,
            });
        };
        let prepared = tokio::select! {
            prepared = shared.artifacts.prepare(&shared.layout, &assignment.task, &report) => prepared,
            Some(reason) = kill_rx.recv() => {
                let verdict = Verdict {
                    task_id: id.clone(),
                    state: TaskState::Killed,
                    message: reason.to_string(),
                    reason,
                };
                let seen = fetch_seq.load(Ordering::Relaxed);
                finish(&shared, numbered(&shared, verdict, seen));
                return;
            }
        };
        let seen = fetch_seq.load(Ordering::Relaxed);
        match prepared {
            Ok(pins) => {
                assignment.task.status_seq_base = seen;
                Some(pins)
            }
            Err(failure) => {
                tracing::warn!(task_id = %id, url = %failure.url, error = %failure.error, "artifact failed");
                let update = numbered(&shared, failure.verdict(&id), seen);
                finish(&shared, update);
                return;
            }
        }
    };
    // At most MAX_STARTING executors between spawn and socket at once: a burst of
    // thousands of assignments otherwise starts thousands of executors together,
    // which then compete for the CPU and finish later than in a queue.
    let permit = shared.starting.clone().acquire_owned().await.ok();
    let t0 = std::time::Instant::now();
    let spawned = shared
        .exec
        .spawn(&shared.layout, &assignment, shared.fork.as_ref());
    tracing::debug!(task_id = %id, us = t0.elapsed().as_micros() as u64, "executor spawned (microseconds)");
    match spawned {
        Ok(mut spawned) => {
            crate::metrics::METRICS.executor_starts.inc();
            tracing::debug!(task_id = %id, pid = ?spawned.child.id(), "executor started");
            if let Some(ready) = spawned.ready.take() {
                // One byte once the socket listens, EOF if the executor died first;
                // either way the first connect in `watch_task` is the right moment.
                // An executor that ignores the pipe holds it open: then the wait
                // ends after READY_WAIT and the socket is polled.
                let _ = tokio::time::timeout(READY_WAIT, wait_readable(&ready)).await;
            }
            drop(permit);
            let watched = match spawned.child {
                ExecutorProcess::Untracked { pid } => Watched::Adopted(pid),
                _ => Watched::Child(Box::new(spawned), t0),
            };
            watch_task(shared, id, watched, kill_rx).await
        }
        Err(e) => {
            crate::metrics::METRICS.executor_start_failures.inc();
            tracing::error!(task_id = %id, error = %e, "could not start executor");
            let update = numbered(&shared, Verdict::setup_failed(&id, e.to_string()), 0);
            finish(&shared, update);
        }
    }
}

/// Waits until the readiness pipe has a byte or is at EOF.
async fn wait_readable(ready: &tokio::net::unix::pipe::Receiver) {
    loop {
        if ready.readable().await.is_err() {
            return;
        }
        let mut buf = [0u8; 8];
        match ready.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            _ => return,
        }
    }
}

/// Records and reports an agent-decided final status.
pub(super) fn finish(shared: &Shared, update: StatusUpdate) {
    if std::fs::symlink_metadata(shared.layout.task_dir(&update.task_id)).is_ok_and(|m| m.is_dir())
    {
        if let Err(e) = shared.layout.write_final(&update) {
            tracing::warn!(task_id = %update.task_id, error = %e, "could not record final status in the sandbox");
        }
    }
    lock(&shared.tasks).unwatch(&update.task_id);
    let _ = shared.updates_tx.send(update);
}

/// The executor a watcher follows.
pub(super) enum Watched {
    /// Spawned by this agent (and waited for until its socket listened) at the
    /// instant given: reaped here, its exit is known at once.
    Child(Box<executor::Spawned>, std::time::Instant),
    /// Found running at start (pid from /proc when known; else from agent.json).
    Adopted(Option<u32>),
}

/// Follows one executor: subscribes to its statuses (reconnecting when the socket
/// drops), forwards kill requests, and when the executor is gone decides between its
/// checkpointed terminal status and LOST.
pub(super) async fn watch_task(
    shared: Arc<Shared>,
    id: String,
    watched: Watched,
    mut kill_rx: mpsc::UnboundedReceiver<ExitReason>,
) {
    let socket = shared.layout.socket(&id);
    let mut connection = None;
    // For the metrics: when the executor was started (until its STARTING status)
    // and when the task's KILLING status was stamped.
    let mut spawned_at = None;
    let mut killing_at: Option<u64> = None;
    let (child_exited, known_pid) = match watched {
        Watched::Child(spawned, at) => {
            spawned_at = Some(at);
            connection = spawned.connection;
            let mut child = spawned.child;
            let pid = child.id();
            let (tx, rx) = watch::channel(false);
            tokio::spawn(async move {
                let _ = child.wait().await;
                let _ = tx.send(true);
            });
            (Some(rx), pid)
        }
        Watched::Adopted(pid) => (None, pid),
    };
    let is_alive = |shared: &Shared| match &child_exited {
        Some(rx) => !*rx.borrow(),
        None => recorded_executor_pid(&shared.layout, &id)
            .or(known_pid)
            .is_some_and(|pid| executor::executor_pid_is_live(pid, &shared.exe_name)),
    };
    let mut last = lock(&shared.outbox).last_seq(&id);
    let mut pending_kill: Option<ExitReason> = None;
    // The first kill request, and when the agent stops waiting for the executor to
    // end the task (`converge::kill_deadline`).
    let mut overdue: Option<(tokio::time::Instant, Duration, ExitReason)> = None;
    let arm = |overdue: &mut Option<(tokio::time::Instant, Duration, ExitReason)>,
               reason: &ExitReason| {
        if overdue.is_none() {
            let task = std::fs::read(shared.layout.task_file(&id))
                .ok()
                .and_then(|b| serde_json::from_slice::<ExecutorTask>(&b).ok());
            let wait = converge::kill_deadline(task.as_ref(), shared.cfg.kill_slack);
            *overdue = Some((tokio::time::Instant::now() + wait, wait, reason.clone()));
        }
    };
    let mut delay = Duration::from_millis(1);
    let mut attempts = 0u32;
    'connect: loop {
        // The connection the executor was forked with first (it binds its socket only
        // once that closes), then the socket.
        let subscribed = match connection.take() {
            Some(stream) => executor::subscribe_on(stream, last)
                .await
                .map_err(|source| executor::ExecutorError::Socket {
                    path: socket.clone(),
                    source,
                }),
            None => executor::subscribe(&socket, last).await,
        };
        let mut lines = match subscribed {
            Ok(lines) => lines,
            Err(e) => {
                while let Ok(r) = kill_rx.try_recv() {
                    arm(&mut overdue, &r);
                    pending_kill = Some(r);
                }
                if let Some((at, wait, reason)) = overdue.clone() {
                    if tokio::time::Instant::now() >= at && is_alive(&shared) {
                        let pid = recorded_executor_pid(&shared.layout, &id).or(known_pid);
                        return kill_overdue(&shared, &id, last, reason, wait, pid).await;
                    }
                }
                if is_alive(&shared) {
                    // Starting up (no socket yet) or between connections. A failed
                    // connect is one cheap syscall, so poll every millisecond for the
                    // first 20 tries (the first status is on the job-create-to-RUNNING
                    // path), then back off to 20 ms so that many executors starting
                    // at once do not cost the host a core.
                    tokio::time::sleep(delay).await;
                    attempts += 1;
                    if attempts > 20 {
                        delay = (delay * 2).min(Duration::from_millis(20));
                    }
                    continue 'connect;
                }
                tracing::debug!(task_id = %id, error = %e, "executor unreachable and not running");
                break 'connect;
            }
        };
        tracing::debug!(task_id = %id, after_seq = last, "subscribed to executor");
        if let Some(reason) = pending_kill.take() {
            arm(&mut overdue, &reason);
            if let Err(e) = executor::send_kill_on(&mut lines, reason.clone()).await {
                tracing::warn!(task_id = %id, error = %e, "kill not delivered yet");
                pending_kill = Some(reason);
            }
        }
        loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        let Some(status) = executor::parse_status(&line) else {
                            tracing::warn!(task_id = %id, line, "unreadable status line from executor");
                            continue;
                        };
                        if status.seq <= last {
                            continue;
                        }
                        last = status.seq;
                        delay = Duration::from_millis(1);
                        attempts = 0;
                        tracing::debug!(task_id = %id, seq = status.seq, state = %status.state, "executor status");
                        let terminal = status.state.is_terminal();
                        observe_timings(&status, &mut spawned_at, &mut killing_at);
                        let _ = shared.updates_tx.send(update_from_status(&status));
                        if terminal {
                            lock(&shared.tasks).unwatch(&id);
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        // Dropped: reconnect, backing off while nothing comes through.
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_millis(100));
                        continue 'connect;
                    }
                },
                _ = sleep_until(overdue.as_ref().map(|o| o.0)) => {
                    if let Some((_, wait, reason)) = overdue.clone() {
                        let pid = recorded_executor_pid(&shared.layout, &id).or(known_pid);
                        return kill_overdue(&shared, &id, last, reason, wait, pid).await;
                    }
                }
                Some(reason) = kill_rx.recv() => {
                    arm(&mut overdue, &reason);
                    if let Err(e) = executor::send_kill_on(&mut lines, reason.clone()).await {
                        tracing::warn!(task_id = %id, error = %e, "kill not delivered yet");
                        pending_kill = Some(reason);
                        continue 'connect;
                    }
                }
            }
        }
    }
    // The executor is gone. Its checkpoint says whether the task ended.
    match host::executor_gone(shared.layout.read_status(&id), last) {
        Gone::Ended(relay) => {
            if let Some(s) = relay {
                let _ = shared.updates_tx.send(update_from_status(&s));
            }
            lock(&shared.tasks).unwatch(&id);
        }
        Gone::Lost => executor_lost(&shared, &id, last).await,
    }
}

/// Sleeps until `at`; forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How long the agent's own cleanup of a task may take (`drover-executor cleanup`
/// gives up on a cgroup it cannot empty after 10 s).
const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// The executor did not end its task within `waited` of a kill: the agent kills the
/// executor and the task's cgroup itself and reports the task KILLED, saying what the
/// cleanup could not do (e.g. processes in uninterruptible sleep), instead of
/// leaving it KILLING forever.
async fn kill_overdue(
    shared: &Shared,
    id: &str,
    last_seen: u64,
    reason: ExitReason,
    waited: Duration,
    pid: Option<u32>,
) {
    if let Some(pid) = pid.filter(|p| executor::executor_pid_is_live(*p, &shared.exe_name)) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let left =
        match tokio::time::timeout(CLEANUP_WAIT, shared.exec.cleanup(&shared.layout, id)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("the cleanup failed: {e}")),
            Err(_) => Some(format!(
                "the cleanup did not end within {}s",
                CLEANUP_WAIT.as_secs()
            )),
        };
    let checkpoint = shared.layout.read_status(id).map(|s| s.seq).unwrap_or(0);
    let update = numbered(
        shared,
        Verdict::kill_overdue(id, reason, waited, left),
        last_seen.max(checkpoint),
    );
    tracing::error!(task_id = %id, seq = update.seq, message = update.message, "kill overdue: the agent ended the task itself");
    finish(shared, update);
}

/// The executor died before its task ended: kill what is left, report LOST.
pub(super) async fn executor_lost(shared: &Shared, id: &str, last_seen: u64) {
    if let Err(e) = shared.exec.cleanup(&shared.layout, id).await {
        tracing::error!(task_id = %id, error = %e, "cleanup after executor loss failed");
    }
    let checkpoint = shared.layout.read_status(id).map(|s| s.seq).unwrap_or(0);
    let message = match executor::last_stderr_line(&shared.layout, id) {
        Some(line) => {
            format!("executor lost; what remained of the task was killed (executor said: {line})")
        }
        None => "executor lost; what remained of the task was killed".to_string(),
    };
    let update = numbered(
        shared,
        Verdict::lost(id, message),
        last_seen.max(checkpoint),
    );
    tracing::warn!(task_id = %id, seq = update.seq, message = update.message, "reporting task LOST");
    finish(shared, update);
}

/// Feeds the timing histograms from one status of a watched executor: the process
/// start (executor started -> STARTING, once), the kill escalation (KILLING ->
/// terminal, both stamped by the executor) and its steps (on the terminal status).
fn observe_timings(
    status: &ExecutorStatus,
    spawned_at: &mut Option<std::time::Instant>,
    killing_at: &mut Option<u64>,
) {
    let m = &crate::metrics::METRICS;
    match status.state {
        TaskState::Starting | TaskState::Running => {
            if let Some(at) = spawned_at.take() {
                m.process_start.observe(at.elapsed().as_secs_f64());
            }
        }
        TaskState::Killing => {
            killing_at.get_or_insert(status.timestamp_ms);
        }
        _ => {}
    }
    if status.state.is_terminal() {
        *spawned_at = None;
        if let Some(steps) = &status.escalation {
            m.escalation_steps(steps);
        }
        if let Some(at) = killing_at.take() {
            let ms = status.timestamp_ms.saturating_sub(at);
            m.kill_escalation.observe(ms as f64 / 1000.0);
        }
    }
}

/// Sends a kill request to task `task_id`'s watcher, if one follows it.
pub(super) fn send_kill(t: &Tasks, task_id: &str, reason: ExitReason) {
    if let Some(tx) = t.watcher(task_id) {
        let _ = tx.send(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::wire::{ProcessState, ProcessStatus};

    #[test]
    fn a_relayed_status_lists_at_most_max_processes_and_a_bounded_message() {
        let status = ExecutorStatus {
            seq: 3,
            task_id: "t".into(),
            state: TaskState::Running,
            exit_reason: None,
            message: "é".repeat(MAX_MESSAGE),
            timestamp_ms: 1,
            executor_pid: 2,
            processes: (0..MAX_PROCESSES + 50)
                .map(|i| ProcessStatus {
                    name: format!("p{i}"),
                    state: if i >= MAX_PROCESSES + 40 {
                        ProcessState::Failed
                    } else {
                        ProcessState::Running
                    },
                    pid: Some(i as u32),
                    runs: 1,
                    failures: 0,
                    last_exit: None,
                })
                .collect(),
            escalation: None,
        };
        let u = update_from_status(&status);
        assert_eq!(u.processes.len(), MAX_PROCESSES);
        assert_eq!(u.processes[0].name, "p0");
        let omitted = u.processes_omitted.clone().expect("a summary of the rest");
        assert_eq!(
            (omitted.count, omitted.running, omitted.failed),
            (50, 40, 10)
        );
        assert!(u.message.len() <= MAX_MESSAGE + " [cut]".len());
        assert!(u.message.ends_with(" [cut]"));
        let short = ExecutorStatus {
            message: "processes changed".into(),
            processes: Vec::new(),
            ..status
        };
        assert_eq!(update_from_status(&short).message, "processes changed");
        assert_eq!(update_from_status(&short).processes_omitted, None);
    }
}
