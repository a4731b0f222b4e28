//! Where a task's files live on an agent's host: the one contract the agent and the
//! executor share (paths only, no I/O).
//!
//! ```text
//! <sandbox_root>/                    root, 0711: tasks reach their own directory by
//!                                    name but cannot list the task ids
//! <sandbox_root>/<task_id>/          the task directory: root, 0711; only root writes it
//!     sandbox/                       the task's working directory: the task user, 0700,
//!                                    the ONLY thing the task can write (with tmp/)
//!     tmp/data/                      the task's /tmp and /var/tmp in its mount
//!                                    namespace: tmp/ root's 0700, data/ the task
//!                                    user's 0700 (tasks run with a cgroup)
//!     task.json status.json executor.sock executor.stderr agent.json agent-final.json
//!     logs/<process>.stdout|.stderr[.N]
//! ```
//!
//! Everything root (the executor, the agent) reads or writes lives in the task
//! directory, whose every ancestor is root's: no path a root process follows goes
//! through a directory the task can write. Root touches `sandbox/` only to create it
//! (through a descriptor), to look for [`SNOOZE_FILE`] and to delete it at collection.

use std::path::{Path, PathBuf};

/// Mode of the sandbox root and of each task directory: traversable, not listable.
pub const ROOT_DIR_MODE: u32 = 0o711;
/// Mode of `sandbox/` (owned by the task user) and of `logs/`.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of every file root keeps in a task directory.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// The task's working directory inside its task directory.
pub const SANDBOX_DIR: &str = "sandbox";
/// The task's private temporary directory inside its task directory.
pub const TMP_DIR: &str = "tmp";
/// The executor's socket, in the task directory.
pub const SOCKET: &str = "executor.sock";
/// The executor's stderr, in the task directory.
pub const EXECUTOR_STDERR: &str = "executor.stderr";
/// While this file exists in `sandbox/`, health checks pause.
pub const SNOOZE_FILE: &str = ".healthchecksnooze";
/// The directory of an older layout's executor area, inside a task-owned sandbox;
/// its presence marks a sandbox whose files the task could have forged.
pub const OLD_AREA: &str = ".drover";

/// The sandbox root: one task directory per task id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
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

    /// The task directory of `task_id`.
    pub fn task(&self, task_id: &str) -> TaskDir {
        TaskDir::new(self.root.join(task_id))
    }

    /// `<root>/<task_id>`: the task directory (root's).
    pub fn task_dir(&self, task_id: &str) -> PathBuf {
        self.root.join(task_id)
    }

    /// The executor's checkpoint.
    pub fn status_file(&self, task_id: &str) -> PathBuf {
        self.task(task_id).status_file()
    }

    /// The executor's Unix socket.
    pub fn socket(&self, task_id: &str) -> PathBuf {
        self.task(task_id).socket()
    }

    /// The task file the agent hands the executor (the executor's own `task.json`).
    pub fn task_file(&self, task_id: &str) -> PathBuf {
        self.task(task_id).task_file()
    }

    /// The agent's record of the task.
    pub fn meta_file(&self, task_id: &str) -> PathBuf {
        self.task(task_id).meta_file()
    }

    /// The agent's own final verdict on the task.
    pub fn final_file(&self, task_id: &str) -> PathBuf {
        self.task(task_id).final_file()
    }

    /// A process's log file (`stream` is `stdout` or `stderr`).
    pub fn log_file(&self, task_id: &str, process: &str, stream: &str) -> PathBuf {
        self.task(task_id).log_file(process, stream)
    }
}

/// One task's directory and the paths in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskDir {
    path: PathBuf,
}

impl TaskDir {
    /// The task directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> TaskDir {
        TaskDir { path: path.into() }
    }
    /// The task directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// `sandbox/`: the processes' working directory, the task's own.
    pub fn sandbox(&self) -> PathBuf {
        self.path.join(SANDBOX_DIR)
    }
    /// `tmp/data/`: the task's private `/tmp` and `/var/tmp` (bound there in its
    /// mount namespace), the task user's, mode 0700, inside `tmp/` (root's, 0700, so
    /// that no other task, not even one of the same user, reaches it by path).
    pub fn tmp(&self) -> PathBuf {
        self.path.join(TMP_DIR).join("data")
    }
    /// `sandbox/.healthchecksnooze`.
    pub fn snooze_file(&self) -> PathBuf {
        self.sandbox().join(SNOOZE_FILE)
    }
    /// `task.json`.
    pub fn task_file(&self) -> PathBuf {
        self.path.join("task.json")
    }
    /// `status.json`, the executor's checkpoint.
    pub fn status_file(&self) -> PathBuf {
        self.path.join("status.json")
    }
    /// `executor.sock`.
    pub fn socket(&self) -> PathBuf {
        self.path.join(SOCKET)
    }
    /// `executor.stderr`.
    pub fn stderr_file(&self) -> PathBuf {
        self.path.join(EXECUTOR_STDERR)
    }
    /// `agent.json`, the agent's record.
    pub fn meta_file(&self) -> PathBuf {
        self.path.join("agent.json")
    }
    /// `agent-final.json`, the agent's final verdict.
    pub fn final_file(&self) -> PathBuf {
        self.path.join("agent-final.json")
    }
    /// `logs/`.
    pub fn logs(&self) -> PathBuf {
        self.path.join("logs")
    }
    /// `logs/<process>.<stream>`.
    pub fn log_file(&self, process: &str, stream: &str) -> PathBuf {
        self.logs().join(format!("{process}.{stream}"))
    }
    /// `.drover/` of the older layout (inside the then task-owned directory).
    pub fn old_area(&self) -> PathBuf {
        self.path.join(OLD_AREA)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_files_sit_in_the_task_dir_and_only_sandbox_is_the_tasks() {
        let layout = Layout::new("/srv/sb");
        let t = layout.task("t-0-abc");
        assert_eq!(t.path(), Path::new("/srv/sb/t-0-abc"));
        assert_eq!(t.sandbox(), Path::new("/srv/sb/t-0-abc/sandbox"));
        assert_eq!(
            t.snooze_file(),
            Path::new("/srv/sb/t-0-abc/sandbox/.healthchecksnooze")
        );
        for root_file in [
            t.task_file(),
            t.status_file(),
            t.socket(),
            t.stderr_file(),
            t.meta_file(),
            t.final_file(),
            t.log_file("main", "stdout"),
        ] {
            assert!(root_file.starts_with(t.path()));
            assert!(!root_file.starts_with(t.sandbox()), "{root_file:?}");
        }
        assert_eq!(layout.socket("t-0-abc"), t.socket());
        assert_eq!(
            layout.log_file("t-0-abc", "main", "stderr"),
            Path::new("/srv/sb/t-0-abc/logs/main.stderr")
        );
    }
}
