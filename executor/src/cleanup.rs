//! `drover-executor cleanup`: what the agent runs after an executor died. Kills
//! everything left in the task's cgroup and removes the cgroup and the limit of the
//! task's project quota (if it had one, [`crate::quota`]). Idempotent. It reads
//! and removes only root's files in the task directory (`task.json`, `executor.sock`),
//! never anything in the task's `sandbox/`.

use std::path::{Path, PathBuf};

use crate::cgroup::{FsCgroup, TaskCgroup, Version};
use crate::runner::load_task;
use crate::sandbox::Layout;

/// Why cleanup could not finish.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("no --task-id given and {path} cannot be read ({reason}); pass --task-id")]
    NoTaskId { path: PathBuf, reason: String },
    #[error("task id `{0}` is not a valid name")]
    BadTaskId(String),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::CgroupError),
}

/// Kills and removes the cgroup `<cgroup_parent>/<task id>` under `cgroup_root`.
/// Returns what was done, for the operator.
pub fn cleanup(
    sandbox: &Path,
    task_id: Option<&str>,
    cgroup_parent: &str,
    cgroup_root: &Path,
) -> Result<String, CleanupError> {
    let layout = Layout::new(sandbox);
    let task_id = match task_id {
        Some(id) => id.to_string(),
        None => {
            load_task(&layout.task_file())
                .map_err(|e| CleanupError::NoTaskId {
                    path: layout.task_file(),
                    reason: e.to_string(),
                })?
                .task_id
        }
    };
    if !drover_common::spec::is_valid_name(&task_id) {
        return Err(CleanupError::BadTaskId(task_id));
    }
    let _ = std::fs::remove_file(layout.socket());
    let quota = match crate::quota::remove_left(layout.area(), &layout.work) {
        Ok(true) => "; removed the limit of its project quota",
        _ => "",
    };
    let Some(version) = FsCgroup::detect(cgroup_root) else {
        return Ok(format!(
            "no cgroup filesystem at {}: nothing to clean up for {task_id}{quota}",
            cgroup_root.display()
        ));
    };
    let cg = FsCgroup::new(version, cgroup_root, cgroup_parent, &task_id);
    let before = cg.pids()?.len();
    cg.kill_all()?;
    cg.remove()?;
    if version == Version::V1 {
        // An executor from before the freezer was dropped also made the task a
        // freezer cgroup; its processes are gone with the others now.
        let _ = std::fs::remove_dir(
            cgroup_root
                .join("freezer")
                .join(cgroup_parent.trim_matches('/'))
                .join(&task_id),
        );
    }
    Ok(format!(
        "killed {before} process(es) and removed {}{quota}",
        cg.describe()
    ))
}
