//! Re-adoption at start: what the sandbox root holds is re-adopted (live executors),
//! reported (tasks that ended while the agent was away) or cleaned up and reported
//! LOST (orphans, old-layout sandboxes). Nothing is started here.

use std::collections::HashSet;
use std::sync::Arc;

use drover_common::state::{mono_ms, now_ms, ExitReason, TaskState};
use drover_common::wire::ExecutorTask;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::watching::{executor_lost, finish, numbered, update_from_status, watch_task, Watched};
use super::{lock, Shared};
use crate::executor::{self};
use crate::host::{self, Verdict};
use crate::sandbox::{classify, recorded_executor_pid, Found, SandboxIo};

/// Scans the sandbox root: live executors are re-adopted, ended tasks reported once,
/// orphans cleaned up and reported LOST. Nothing is ever started here.
pub(super) fn readopt(shared: &Arc<Shared>, set: &mut JoinSet<()>) {
    let ids = match shared.layout.list() {
        Ok(ids) => ids,
        Err(e) => {
            tracing::error!(root = %shared.layout.root().display(), error = %e, "cannot scan the sandbox root");
            return;
        }
    };
    {
        let present: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let pruned = lock(&shared.outbox).prune_acked(|id| present.contains(id));
        if pruned > 0 {
            tracing::debug!(pruned, "dropped ack records of tasks without a sandbox");
        }
    }
    let running = executor::find_running_executors(&shared.exe_name, shared.layout.root());
    match shared.layout.list_old() {
        Ok(old) => {
            for id in old {
                tracing::warn!(task_id = %id, "sandbox of the older layout (task-writable files); not trusting it: cleaning up, reporting LOST");
                let rx = hold_live(shared, &id, None, false);
                drop(rx);
                let shared = shared.clone();
                let pid = running.get(&id).copied();
                set.spawn(async move { retire_old_sandbox(&shared, &id, pid).await });
            }
        }
        Err(e) => {
            tracing::error!(root = %shared.layout.root().display(), error = %e, "cannot scan the sandbox root for old sandboxes");
        }
    }
    for id in ids {
        let meta = shared.layout.read_meta(&id);
        if let Some(verdict) = shared.layout.read_final(&id) {
            hold_terminal(
                shared,
                &id,
                verdict.state,
                verdict.timestamp_ms,
                meta.exclusive,
            );
            let _ = shared.updates_tx.send(verdict);
            continue;
        }
        let status = shared.layout.read_status(&id);
        let live = executor::socket_is_live(&shared.layout.socket(&id))
            || running.contains_key(&id)
            || recorded_executor_pid(&shared.layout, &id)
                .is_some_and(|pid| executor::executor_pid_is_live(pid, &shared.exe_name));
        match classify(live, status.clone()) {
            Found::Live => {
                tracing::info!(task_id = %id, "re-adopting running executor");
                let rx = hold_live(shared, &id, status.map(|s| s.state), meta.exclusive);
                let pid = running.get(&id).copied();
                // Its cached artifacts stay pinned while it lives, as a new task's do.
                let pins = std::fs::read(shared.layout.task_file(&id))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<ExecutorTask>(&b).ok())
                    .map(|task| shared.artifacts.pin(&task));
                let watched = watch_task(shared.clone(), id, Watched::Adopted(pid), rx);
                set.spawn(async move {
                    watched.await;
                    drop(pins);
                });
            }
            Found::Ended(s) => {
                tracing::info!(task_id = %id, state = %s.state, "task ended while the agent was away");
                hold_terminal(shared, &id, s.state, s.timestamp_ms, meta.exclusive);
                let _ = shared.updates_tx.send(update_from_status(&s));
            }
            Found::Orphaned(s) => {
                tracing::warn!(task_id = %id, "executor gone before its task ended; cleaning up");
                let rx = hold_live(shared, &id, s.map(|s| s.state), meta.exclusive);
                drop(rx);
                let shared = shared.clone();
                set.spawn(async move { executor_lost(&shared, &id, 0).await });
            }
        }
    }
}

/// Ends a task whose sandbox has the older layout, in which the task could write the
/// executor's checkpoint, task file and logs: nothing in it is believed. Its executor
/// (if one still runs) is killed, then the task's cgroup, the sandbox is removed
/// (std's `remove_dir_all` never follows a link), and the task is reported LOST.
async fn retire_old_sandbox(shared: &Shared, id: &str, executor_pid: Option<u32>) {
    if let Some(pid) = executor_pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    if let Err(e) = shared.exec.cleanup(&shared.layout, id).await {
        tracing::error!(task_id = %id, error = %e, "cleanup of an old-layout sandbox failed");
    }
    let dir = shared.layout.task_dir(id);
    if let Err(e) = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await {
        tracing::warn!(task_id = %id, error = %e, "removing an old-layout sandbox panicked");
    }
    let verdict = Verdict::lost(
        id,
        "found in a sandbox of an older agent's layout, whose status the task could have forged; its processes were killed".into(),
    );
    finish(shared, numbered(shared, verdict, 0));
}

/// Holds a task whose executor may run, watched; the receiver takes its kill requests.
fn hold_live(
    shared: &Shared,
    id: &str,
    state: Option<TaskState>,
    exclusive: bool,
) -> mpsc::UnboundedReceiver<ExitReason> {
    let (tx, rx) = mpsc::unbounded_channel();
    lock(&shared.tasks).hold_live(id, state, exclusive, tx);
    rx
}

/// Holds a task that ended, by a status stamped `at_ms` (wall clock; possibly
/// before this agent started).
fn hold_terminal(shared: &Shared, id: &str, state: TaskState, at_ms: u64, exclusive: bool) {
    let since = host::since_mono(mono_ms(), now_ms(), at_ms);
    lock(&shared.tasks).hold_terminal(id, state, exclusive, since);
}
