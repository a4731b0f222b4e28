//! The plain-file side of the task cgroup, shared by v1 and v2: `mkdir`, limits
//! written and read back through one descriptor without `O_CREAT`, the read-back
//! check, and the parsers of `cgroup.procs` and the OOM counters.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{CgroupError, CPU_PERIOD_US};

/// `mkdir path` (and its parents when the parent is missing). Returns whether it
/// existed already.
pub(super) fn make_dir(path: &Path) -> Result<bool, CgroupError> {
    let err = |source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    };
    match fs::create_dir(path) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(path).map_err(err)?;
            Ok(false)
        }
        Err(e) => Err(err(e)),
    }
}

/// The write error for a limit the cgroup files cannot hold (they are signed 64-bit).
pub(super) fn above_i64_max(path: PathBuf, want: u64) -> CgroupError {
    CgroupError::Write {
        path,
        value: want.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "above i64::MAX"),
    }
}

/// `Ok` if `ok`, else a read-back error for `path`.
pub(super) fn check(
    path: &Path,
    wrote: impl ToString,
    read: impl ToString,
    ok: bool,
) -> Result<(), CgroupError> {
    if ok {
        Ok(())
    } else {
        Err(CgroupError::ReadBack {
            path: path.to_path_buf(),
            wrote: wrote.to_string(),
            read: read.to_string(),
        })
    }
}

/// Writes `value` to an existing file (never creates it: a missing file means a
/// missing controller, and the open's own `ENOENT` says so without a `stat` first).
pub(super) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_opened(path, value, fs::OpenOptions::new().write(true)).map(drop)
}

/// Writes a limit like [`write_file`] (truncating what a file in a test tree held
/// before) and reads it back, trimmed, through the same descriptor: one open of the
/// cgroupfs file, not two. A cgroup file read at offset 0 shows the current value.
///
/// Plain files rather than the cgroups-rs setters and getters: those open with
/// `O_CREAT`, which on a test tree would create a missing limit file, so each write
/// needed a `stat` of the file first (a path walk through cgroupfs, as costly as the
/// write), and they open the file again to read it.
pub(super) fn write_limit(path: &Path, value: &str) -> Result<String, CgroupError> {
    use std::os::unix::fs::FileExt;
    let f = write_opened(
        path,
        value,
        fs::OpenOptions::new().read(true).write(true).truncate(true),
    )?;
    let mut buf = [0u8; 64];
    let n = f.read_at(&mut buf, 0).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

fn write_opened(path: &Path, value: &str, how: &fs::OpenOptions) -> Result<fs::File, CgroupError> {
    let err = |source: io::Error| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source: if source.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no such file (the controller is missing or not enabled)",
            )
        } else {
            source
        },
    };
    let mut f = how.open(path).map_err(err)?;
    f.write_all(value.as_bytes()).map_err(err)?;
    Ok(f)
}

/// The `oom_kill N` line of `memory.oom_control` (v1) or `memory.events` (v2).
pub fn parse_oom_kills(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("oom_kill "))
        .filter_map(|n| n.trim().parse().ok())
        .next()
        .unwrap_or(0)
}

/// The pids of a `cgroup.procs` file.
pub fn parse_pids(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The CFS quota of `cpu` cores per [`CPU_PERIOD_US`] (at least 1 ms).
pub(super) fn cpu_quota_us(cpu: f64) -> u64 {
    ((cpu * CPU_PERIOD_US as f64).round() as u64).max(1000)
}
