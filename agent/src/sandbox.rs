//! Where a task's files live and what the agent finds there after a restart. The
//! sandbox root is the source of truth for which tasks this host runs:
//! `<sandbox_root>/<task_id>/.drover/` holds `task.json` (the task file the agent
//! gives the executor), the executor's `status.json` (its checkpoint),
//! `executor.sock` and `logs/`, and the agent's `agent.json` (whether the task is
//! exclusive, the executor's pid).

use std::fs;
use std::path::{Path, PathBuf};

use drover_common::spec::is_valid_name;
use drover_common::wire::{checkpointed_status, ExecutorStatus, StatusUpdate};
use serde::{Deserialize, Serialize};

/// Paths inside the sandbox root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

/// What the agent records beside a task's sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMeta {
    /// `partition_policy.exclusive` of the assignment.
    #[serde(default)]
    pub exclusive: bool,
    /// The executor's pid once spawned.
    #[serde(default)]
    pub executor_pid: Option<u32>,
}

/// What a sandbox tells after an agent restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Its executor still runs: re-adopt it.
    Live,
    /// The executor is gone and the task ended: report this status once, never rerun.
    Ended(ExecutorStatus),
    /// The executor is gone before the task ended: clean up, report LOST.
    Orphaned(Option<ExecutorStatus>),
}

impl Layout {
    /// A layout rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }

    /// The sandbox root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<task_id>`.
    pub fn sandbox(&self, task_id: &str) -> PathBuf {
        self.root.join(task_id)
    }

    /// `<root>/<task_id>/.drover`.
    pub fn drover_dir(&self, task_id: &str) -> PathBuf {
        self.sandbox(task_id).join(".drover")
    }

    /// The executor's checkpoint.
    pub fn status_file(&self, task_id: &str) -> PathBuf {
        self.drover_dir(task_id).join("status.json")
    }

    /// The executor's Unix socket.
    pub fn socket(&self, task_id: &str) -> PathBuf {
        self.drover_dir(task_id).join("executor.sock")
    }

    /// The task file the agent hands the executor. It is the executor's own
    /// `task.json`, so the executor need not write a copy.
    pub fn task_file(&self, task_id: &str) -> PathBuf {
        self.drover_dir(task_id).join("task.json")
    }

    /// The agent's record beside the sandbox.
    pub fn meta_file(&self, task_id: &str) -> PathBuf {
        self.drover_dir(task_id).join("agent.json")
    }

    /// A process's log file (`stream` is `stdout` or `stderr`).
    pub fn log_file(&self, task_id: &str, process: &str, stream: &str) -> PathBuf {
        self.drover_dir(task_id)
            .join("logs")
            .join(format!("{process}.{stream}"))
    }

    /// The task ids of every sandbox below the root that has a `.drover` dir.
    pub fn list(&self) -> std::io::Result<Vec<String>> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_valid_name(&name) && entry.path().join(".drover").is_dir() {
                ids.push(name);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// The executor's latest checkpoint, if readable ([`checkpointed_status`]).
    pub fn read_status(&self, task_id: &str) -> Option<ExecutorStatus> {
        checkpointed_status(&fs::read(self.status_file(task_id)).ok()?)
    }

    /// The agent's record, or the default when missing.
    pub fn read_meta(&self, task_id: &str) -> AgentMeta {
        fs::read(self.meta_file(task_id))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes the agent's record atomically (fsync'd when `sync`).
    pub fn write_meta(&self, task_id: &str, meta: &AgentMeta, sync: bool) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
        crate::outbox::write_atomic(&self.meta_file(task_id), &bytes, sync)
    }

    /// Where the agent records its own final verdict on a task (e.g. LOST after the
    /// executor died), so a restart does not decide again.
    pub fn final_file(&self, task_id: &str) -> PathBuf {
        self.drover_dir(task_id).join("agent-final.json")
    }

    /// The agent's recorded final verdict, if any.
    pub fn read_final(&self, task_id: &str) -> Option<StatusUpdate> {
        let bytes = fs::read(self.final_file(task_id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Records the agent's final verdict (fsync'd).
    pub fn write_final(&self, update: &StatusUpdate) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(update).map_err(std::io::Error::other)?;
        crate::outbox::write_atomic(&self.final_file(&update.task_id), &bytes, true)
    }
}

/// Decides what a sandbox found at start means (pure).
pub fn classify(live: bool, status: Option<ExecutorStatus>) -> Found {
    match (live, status) {
        (true, _) => Found::Live,
        (false, Some(s)) if s.state.is_terminal() => Found::Ended(s),
        (false, s) => Found::Orphaned(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::state::TaskState;

    fn status(state: TaskState) -> ExecutorStatus {
        ExecutorStatus {
            seq: 4,
            task_id: "t".into(),
            state,
            exit_reason: None,
            message: String::new(),
            timestamp_ms: 0,
            executor_pid: 1,
            processes: vec![],
        }
    }

    #[test]
    fn a_live_executor_is_adopted_whatever_its_checkpoint_says() {
        assert_eq!(
            classify(true, Some(status(TaskState::Finished))),
            Found::Live
        );
        assert_eq!(classify(true, None), Found::Live);
    }

    #[test]
    fn a_dead_executor_with_a_terminal_checkpoint_is_reported_not_rerun() {
        let s = status(TaskState::Finished);
        assert_eq!(classify(false, Some(s.clone())), Found::Ended(s));
    }

    #[test]
    fn a_dead_executor_before_the_end_is_orphaned() {
        let s = status(TaskState::Running);
        assert_eq!(classify(false, Some(s.clone())), Found::Orphaned(Some(s)));
        assert_eq!(classify(false, None), Found::Orphaned(None));
    }

    #[test]
    fn list_finds_only_valid_sandboxes() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        fs::create_dir_all(layout.drover_dir("t1")).unwrap();
        fs::create_dir_all(dir.path().join("no-drover-dir")).unwrap();
        fs::create_dir_all(dir.path().join("bad name/.drover")).unwrap();
        assert_eq!(layout.list().unwrap(), vec!["t1".to_string()]);
        assert!(Layout::new(dir.path().join("missing"))
            .list()
            .unwrap()
            .is_empty());
    }
}
