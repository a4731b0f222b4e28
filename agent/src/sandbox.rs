//! What the agent keeps in and finds in the sandbox root after a restart
//! ([`drover_common::layout`]). The sandbox root is the source of truth for which
//! tasks this host runs: each `<sandbox_root>/<task_id>/` task directory is root's and
//! holds `task.json` (the task file the agent gives the executor), the executor's
//! `status.json` (its checkpoint), `executor.sock` and `logs/`, and the agent's
//! `agent.json` (whether the task is exclusive, the executor's pid); the task can
//! write only `sandbox/` in it, so nothing read here is the task's word.
//!
//! A task directory of the older layout (the task's own directory with a `.drover/`
//! in it, from an agent before this layout) is never trusted: [`SandboxIo::list_old`]
//! finds them and the agent cleans them up and reports them LOST.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use drover_common::layout::{self, Layout};
use drover_common::spec::is_valid_name;
use drover_common::wire::{checkpointed_status, ExecutorStatus, StatusUpdate};
use drover_os::fs::{write_private, Durability};
use serde::{Deserialize, Serialize};

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

/// Which layout a directory below the sandbox root has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Generation {
    /// A root-owned task directory of this layout.
    Current,
    /// A task-owned sandbox with `.drover/` inside (an older agent's).
    Old,
}

/// Creates the sandbox root (mode 0711: tasks reach their own directory by name but
/// cannot list the task ids), setting the mode of one that exists.
pub fn prepare_root(root: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(layout::ROOT_DIR_MODE)
        .create(root)?;
    fs::set_permissions(root, fs::Permissions::from_mode(layout::ROOT_DIR_MODE))
}

/// Creates a new task directory (root's, mode 0711); fails if the name is taken.
pub fn create_task_dir(layout: &Layout, task_id: &str) -> io::Result<()> {
    let dir = layout.task_dir(task_id);
    fs::DirBuilder::new()
        .mode(layout::ROOT_DIR_MODE)
        .create(&dir)?;
    // The umask may have taken the execute bits.
    fs::set_permissions(&dir, fs::Permissions::from_mode(layout::ROOT_DIR_MODE))
}

/// Opens a file root keeps in a task directory: created 0600 when missing, never
/// through a symlink.
pub fn open_private(path: &Path, options: &mut fs::OpenOptions) -> io::Result<fs::File> {
    options
        .mode(layout::PRIVATE_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Reads a whole file root keeps in a task directory, never through a symlink.
fn read_private(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_private(path, fs::OpenOptions::new().read(true))?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The agent's reads and writes in the sandbox root.
pub trait SandboxIo {
    /// The task ids of every task directory of this layout below the root.
    fn list(&self) -> io::Result<Vec<String>>;
    /// The task ids of sandboxes of the older layout (never trusted).
    fn list_old(&self) -> io::Result<Vec<String>>;
    /// The executor's latest checkpoint, if readable ([`checkpointed_status`]).
    fn read_status(&self, task_id: &str) -> Option<ExecutorStatus>;
    /// The agent's record, or the default when missing.
    fn read_meta(&self, task_id: &str) -> AgentMeta;
    /// Writes the agent's record atomically (fsync'd when `sync`).
    fn write_meta(&self, task_id: &str, meta: &AgentMeta, sync: bool) -> io::Result<()>;
    /// The agent's recorded final verdict (e.g. LOST after the executor died), if any.
    fn read_final(&self, task_id: &str) -> Option<StatusUpdate>;
    /// Records the agent's final verdict (fsync'd), so a restart does not decide again.
    fn write_final(&self, update: &StatusUpdate) -> io::Result<()>;
}

impl SandboxIo for Layout {
    fn list(&self) -> io::Result<Vec<String>> {
        scan(self.root(), Generation::Current)
    }

    fn list_old(&self) -> io::Result<Vec<String>> {
        scan(self.root(), Generation::Old)
    }

    fn read_status(&self, task_id: &str) -> Option<ExecutorStatus> {
        checkpointed_status(&read_private(&self.status_file(task_id)).ok()?)
    }

    fn read_meta(&self, task_id: &str) -> AgentMeta {
        read_private(&self.meta_file(task_id))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn write_meta(&self, task_id: &str, meta: &AgentMeta, sync: bool) -> io::Result<()> {
        let bytes = serde_json::to_vec(meta).map_err(io::Error::other)?;
        let durability = if sync {
            Durability::Synced
        } else {
            Durability::Cached
        };
        write_private(&self.meta_file(task_id), &bytes, durability)
    }

    fn read_final(&self, task_id: &str) -> Option<StatusUpdate> {
        let bytes = read_private(&self.final_file(task_id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn write_final(&self, update: &StatusUpdate) -> io::Result<()> {
        let bytes = serde_json::to_vec(update).map_err(io::Error::other)?;
        write_private(
            &self.final_file(&update.task_id),
            &bytes,
            Durability::Synced,
        )
    }
}

/// The sorted names of the directories (not symlinks) of one generation below `root`.
fn scan(root: &Path, want: Generation) -> io::Result<Vec<String>> {
    use std::os::unix::fs::MetadataExt;
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let me = nix::unistd::Uid::effective().as_raw();
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // `file_type` is the entry's own type: a symlink is never a task directory.
        if !is_valid_name(&name) || !entry.file_type()?.is_dir() {
            continue;
        }
        let path = entry.path();
        // An older sandbox belonged to the task user and kept the executor's files in
        // `.drover/`; a task directory of this layout is ours and has no `.drover/`
        // (only we write it). Anything else below the root is not a task directory.
        let old = fs::symlink_metadata(path.join(layout::OLD_AREA)).is_ok();
        let generation = match (old, entry.metadata()?.uid() == me) {
            (true, _) => Generation::Old,
            (false, true) => Generation::Current,
            (false, false) => continue,
        };
        if generation == want {
            ids.push(name);
        }
    }
    ids.sort();
    Ok(ids)
}

/// The executor pid recorded in the sandbox: the agent's `agent.json` (written for
/// exclusive tasks only), else the executor's own `status.json`.
pub fn recorded_executor_pid(layout: &Layout, id: &str) -> Option<u32> {
    layout.read_meta(id).executor_pid.or_else(|| {
        layout
            .read_status(id)
            .map(|s| s.executor_pid)
            .filter(|pid| *pid > 0)
    })
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
            escalation: None,
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
    fn list_tells_task_dirs_from_old_sandboxes_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        create_task_dir(&layout, "t1").unwrap();
        fs::create_dir_all(dir.path().join("old/.drover")).unwrap();
        fs::create_dir_all(dir.path().join("bad name")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("t1"), dir.path().join("link")).unwrap();
        fs::write(dir.path().join("file"), b"").unwrap();
        assert_eq!(layout.list().unwrap(), vec!["t1".to_string()]);
        assert_eq!(layout.list_old().unwrap(), vec!["old".to_string()]);
        assert!(Layout::new(dir.path().join("missing"))
            .list()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn root_files_are_never_read_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("sb"));
        prepare_root(layout.root()).unwrap();
        create_task_dir(&layout, "t1").unwrap();
        let forged = dir.path().join("forged.json");
        let line = serde_json::to_vec(&status(TaskState::Finished)).unwrap();
        fs::write(&forged, &line).unwrap();
        std::os::unix::fs::symlink(&forged, layout.status_file("t1")).unwrap();
        assert_eq!(layout.read_status("t1"), None);
        fs::remove_file(layout.status_file("t1")).unwrap();
        fs::write(layout.status_file("t1"), &line).unwrap();
        assert_eq!(layout.read_status("t1"), Some(status(TaskState::Finished)));
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(layout.root()), 0o711);
        assert_eq!(mode(&layout.task_dir("t1")), 0o711);
    }
}
