//! `resources.disk` as a project quota, where the sandbox root's filesystem keeps
//! them (XFS, or ext4 with the `project` feature, mounted with `prjquota`): the
//! kernel refuses a write past the limit (`EDQUOT`) as it happens, instead of the
//! scan ([`crate::disk`]) finding it seconds later.
//!
//! Project ids: a task's id is the inode number of its task directory (root's, made
//! at setup, removed only by the agent's sandbox GC once everything in it is gone).
//! Inode numbers are unique among the files that exist on one filesystem, so no two
//! live task directories share an id, and none needs to be stored or handed out: an
//! id is free again exactly when its directory is deleted (its files, which carried
//! the id, are deleted first). A task directory whose inode number needs more than 32
//! bits (XFS `inode64`) cannot be an id: that task falls back to the scan.
//!
//! At setup the limit is set first (`Q_SETQUOTA`, `PRJQUOTA`: a block hard limit of
//! `resources.disk` plus [`MARGIN`]), then the id goes on `sandbox/` and `tmp/data/`
//! with `FS_XFLAG_PROJINHERIT` (`FS_IOC_FSSETXATTR`), so everything created below
//! them is charged to it. Any step failing (no such ioctl on tmpfs, quotas off,
//! `quotactl_fd` missing before Linux 5.14) means the scan alone, and the task's
//! first status says which is used and why. The limit is removed (set to 0) when the
//! task ends, and by `drover-executor cleanup` after an executor died (the id is read
//! back from `sandbox/`).
//!
//! The margin makes a task stopped by the quota over its limit, as the scan counts
//! it: the executor ends it with `disk_limit_exceeded` and the quota's usage. A file's
//! owner may change the project id of its files in the initial user namespace (the
//! kernel allows it), so the quota is not trusted alone: the scan keeps running as
//! the backstop, and usage over the limit by the quota is confirmed by a scan of the
//! task's directories before the task is stopped (another task could label its own
//! files with this task's id).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use crate::sys;

/// What the hard limit allows past `resources.disk`: the kernel refuses the write
/// that would pass it, and the task is then over its limit (and stopped).
pub const MARGIN: u64 = 1 << 20;

/// How often the quota's usage is read (one system call).
pub const POLL: Duration = Duration::from_secs(1);

/// A task's project quota.
#[derive(Debug)]
pub struct ProjectQuota {
    /// The task directory (the quota's filesystem, and the id's inode).
    dir: File,
    projid: u32,
}

/// Why a task's disk limit cannot be a project quota (the caller falls back to the
/// scan and says why in the task's first status).
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error("cannot open the task directory: {0}")]
    OpenDir(io::Error),
    #[error("cannot stat the task directory: {0}")]
    StatDir(io::Error),
    #[error("the task directory's inode number {0} does not fit a 32-bit project id")]
    InodeTooLarge(u64),
    #[error("project quotas are off on this file system")]
    Off,
    #[error("no quotactl_fd (Linux 5.14)")]
    NoQuotactl,
    #[error("no project quota: quotactl_fd(Q_SETQUOTA, PRJQUOTA): {0}")]
    SetQuota(io::Error),
    #[error("cannot set project id {projid} on {path}: {source}")]
    Label {
        projid: u32,
        path: std::path::PathBuf,
        source: io::Error,
    },
}

fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The project id of the task directory `dir`: its inode number, when it fits.
fn project_id(dir: &File) -> Result<u32, QuotaError> {
    let ino = dir.metadata().map_err(QuotaError::StatDir)?.ino();
    u32::try_from(ino)
        .ok()
        .filter(|&id| id != 0)
        .ok_or(QuotaError::InodeTooLarge(ino))
}

impl ProjectQuota {
    /// Limits what is created under `dirs` (inside `task_dir`) to `limit` bytes plus
    /// [`MARGIN`]; an error says why the filesystem cannot (the caller falls back to
    /// the scan).
    pub fn enable(task_dir: &Path, dirs: &[&Path], limit: u64) -> Result<ProjectQuota, QuotaError> {
        let dir = open_dir(task_dir).map_err(QuotaError::OpenDir)?;
        let projid = project_id(&dir)?;
        sys::set_project_limit(dir.as_fd(), projid, limit.saturating_add(MARGIN)).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ESRCH) => QuotaError::Off,
                Some(libc::ENOSYS) => QuotaError::NoQuotactl,
                _ => QuotaError::SetQuota(e),
            }
        })?;
        let quota = ProjectQuota { dir, projid };
        for path in dirs {
            let labelled = open_dir(path).and_then(|d| sys::set_project(d.as_fd(), projid));
            if let Err(source) = labelled {
                quota.remove();
                return Err(QuotaError::Label {
                    projid,
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        Ok(quota)
    }

    /// The project id.
    pub fn id(&self) -> u32 {
        self.projid
    }

    /// Bytes charged to the project.
    pub fn usage(&self) -> io::Result<u64> {
        sys::project_usage(self.dir.as_fd(), self.projid)
    }

    /// Removes the limit (what is left in the directories keeps the id, without one).
    pub fn remove(&self) {
        if let Err(e) = sys::set_project_limit(self.dir.as_fd(), self.projid, 0) {
            crate::diag!(
                "drover-executor: cannot remove the limit of project quota {}: {e}",
                self.projid
            );
        }
    }
}

/// For `cleanup`: removes the project quota's limit of the task in `task_dir` when its
/// `sandbox` carries the task directory's project id. Whether there was one.
pub fn remove_left(task_dir: &Path, sandbox: &Path) -> io::Result<bool> {
    let dir = open_dir(task_dir)?;
    let Ok(projid) = project_id(&dir) else {
        return Ok(false);
    };
    let Ok((id, _)) = open_dir(sandbox).and_then(|s| sys::project_of(s.as_fd())) else {
        return Ok(false);
    };
    if id != projid {
        return Ok(false);
    }
    sys::set_project_limit(dir.as_fd(), projid, 0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the filesystem keeps no project quota (the temp dir's, as on most
    /// hosts), enabling fails with a reason and leaves no id behind.
    /// The `fsxattr` ioctl reads a project id (0: none) wherever the file system has
    /// it (ext4, XFS; tmpfs has not).
    #[test]
    fn the_project_id_of_a_new_directory_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let d = open_dir(dir.path()).unwrap();
        match sys::project_of(d.as_fd()) {
            Ok((id, flags)) => assert_eq!((id, flags & sys::FS_XFLAG_PROJINHERIT), (0, 0)),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOTTY), "{e}"),
        }
    }

    #[test]
    fn without_project_quotas_enabling_says_why_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = dir.path().join("sandbox");
        std::fs::create_dir(&sandbox).unwrap();
        match ProjectQuota::enable(dir.path(), &[&sandbox], 1 << 20) {
            Ok(q) => {
                // A host whose temp dir has project quotas: it works, and is removed.
                assert!(q.usage().is_ok());
                q.remove();
                assert!(remove_left(dir.path(), &sandbox).unwrap());
            }
            Err(e) => {
                eprintln!("{e}");
                assert!(e.to_string().contains("project"), "{e}");
                assert!(!remove_left(dir.path(), &sandbox).unwrap_or(false));
            }
        }
    }
}
