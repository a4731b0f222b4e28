//! `resources.disk` enforced by a periodic usage scan, as Aurora's executor does (its
//! `DiskCollector`): what the task can write (`sandbox/` and `tmp/`) is walked, the
//! allocated blocks of every entry added (a hard-linked file once), and a task over
//! its limit is stopped with exit reason `disk_limit_exceeded`.
//!
//! The walk is root's through a tree the task owns, so it never follows a link: each
//! directory is opened relative to its parent's descriptor with `O_NOFOLLOW`, read
//! with `getdents64`, each entry looked at with `fstatat(AT_SYMLINK_NOFOLLOW)`. A tree nested deeper than
//! [`MAX_DEPTH`] counts as over the limit (the walk holds one descriptor per level).
//! [`next_interval`] spaces scans so that a big tree costs at most about 2 % of the
//! executor's time.

use crate::sys::{getdents64, open_dir, stat_at, Dir};
use std::ffi::CStr;
use std::time::Duration;

/// Deepest directory nesting the scan follows.
pub const MAX_DEPTH: usize = 512;

/// What a scan found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// Bytes allocated.
    Bytes(u64),
    /// Nested deeper than [`MAX_DEPTH`] (bytes counted until then): treated as over
    /// any limit.
    TooDeep(u64),
}

/// The bytes allocated under each of `dirs` together (a missing one counts 0).
/// `seen` holds the hard-linked files counted (cleared here; kept by the caller so
/// that a settled executor's scan allocates and frees nothing when there are none).
///
/// What the scan runs is kept small on purpose: no `CString`, no hash set, no
/// `opendir` buffer, no `OwnedFd` and no slicing by a range (std's `OwnedFd::from_raw_fd`
/// and `SliceIndex::<RangeInclusive>::index` are out-of-line functions that the
/// layout places away from the settled code); each of those put code from cold pages
/// of the executor's binary (64-128 KiB each, measured) back into a settled
/// executor's memory at every scan. Only the functions of this module and what
/// `hot.ld` places with them run (`executor/layout/hot.ld`, docs/executor.md "Memory").
pub fn usage(dirs: &[&CStr], seen: &mut Vec<(u64, u64)>) -> Usage {
    seen.clear();
    let mut total = 0u64;
    for dir in dirs {
        let Some(fd) = open_dir(None, dir.to_bytes_with_nul(), 0) else {
            continue;
        };
        if let Some(st) = stat_at(&fd, b"\0", 0) {
            total = total.saturating_add(allocated(&st));
        }
        if !walk(fd, 1, seen, &mut total) {
            return Usage::TooDeep(total);
        }
    }
    Usage::Bytes(total)
}

fn allocated(st: &libc::stat) -> u64 {
    (st.st_blocks as u64).saturating_mul(512)
}

/// Adds what is in the directory `fd` to `total`; false when nested too deep.
fn walk(fd: Dir, depth: usize, seen: &mut Vec<(u64, u64)>, total: &mut u64) -> bool {
    // The subdirectories' names, each with its NUL.
    let mut subdirs: Vec<u8> = Vec::new();
    entries(&fd, seen, total, &mut subdirs);
    let mut start = 0;
    while start < subdirs.len() {
        let mut end = start;
        while end < subdirs.len() && subdirs[end] != 0 {
            end += 1;
        }
        if end == subdirs.len() {
            break;
        }
        // The name from `name`, NUL-terminated at `end`.
        let name = start;
        start = end + 1;
        if depth >= MAX_DEPTH {
            return false;
        }
        let Some(sub) = open_dir(Some(&fd), &subdirs, name) else {
            continue;
        };
        if !walk(sub, depth + 1, seen, total) {
            return false;
        }
    }
    true
}

/// Adds the entries of the directory `fd` to `total` and appends its subdirectories'
/// names (with their NUL) to `subdirs`. Reads them with `getdents64` into a buffer on
/// the stack, in a frame of its own so the buffer is not on the stack once per level.
#[inline(never)]
fn entries(fd: &Dir, seen: &mut Vec<(u64, u64)>, total: &mut u64, subdirs: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    loop {
        let n = getdents64(fd, &mut buf);
        if n <= 0 {
            return;
        }
        let n = (n as usize).min(buf.len());
        let mut pos = 0usize;
        while pos + 19 < n {
            // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
            let reclen = u16::from_ne_bytes([buf[pos + 16], buf[pos + 17]]) as usize;
            if reclen == 0 || pos + reclen > n {
                return;
            }
            let (from, to) = (pos + 19, pos + reclen);
            pos = to;
            let mut end = from;
            while end < to && buf[end] != 0 {
                end += 1;
            }
            if end == to {
                continue;
            }
            if buf[from] == b'.' && (end == from + 1 || (end == from + 2 && buf[from + 1] == b'.'))
            {
                continue;
            }
            // The name, NUL-terminated at `end`.
            let Some(st) = stat_at(fd, &buf, from) else {
                continue;
            };
            // The stat field types differ between architectures.
            #[allow(clippy::unnecessary_cast)]
            let id = (st.st_dev as u64, st.st_ino as u64);
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if st.st_nlink > 1 && !is_dir {
                // Not `contains`: `<[T]>::contains` is out of line, in the cold part.
                #[allow(clippy::manual_contains)]
                let counted = seen.iter().any(|&s| s == id);
                if counted {
                    continue;
                }
                seen.push(id);
            }
            *total = total.saturating_add(allocated(&st));
            if is_dir {
                // With its NUL; not a slice by a range (see `usage`).
                subdirs.extend_from_slice(crate::sys::bytes_through(&buf, from, end));
            }
        }
    }
}

/// How long after a scan that took `last_scan` the next may start at the earliest:
/// 50 times as long (a big tree is scanned less often; the executor's `--disk-scan-interval`
/// is the floor).
pub fn next_interval(last_scan: Duration) -> Duration {
    // Not `Duration::saturating_mul`: its `checked_mul` is out of line, in the cold
    // part of the layout, and this runs at every scan. At most ~584 years.
    let nanos = u64::try_from(last_scan.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(nanos.saturating_mul(50))
}

/// For a task over its `limit`: the bytes it uses and what to say about it.
pub fn over_limit(usage: Usage, limit: u64) -> Option<(u64, String)> {
    match usage {
        Usage::Bytes(n) if n > limit => Some((
            n,
            format!("disk usage {n} bytes is over resources.disk {limit} bytes"),
        )),
        Usage::Bytes(_) => None,
        Usage::TooDeep(n) => Some((
            n,
            format!("directories nested deeper than {MAX_DEPTH} levels cannot be scanned for resources.disk ({limit} bytes)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_files_once_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let path = |p: &std::path::Path| {
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())).unwrap()
        };
        let mut seen = Vec::new();
        let Usage::Bytes(empty) = usage(&[&path(dir.path())], &mut seen) else {
            panic!("too deep");
        };
        std::fs::write(dir.path().join("a"), vec![1u8; 1 << 20]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![1u8; 1 << 20]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("sub/a-again")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("usr")).unwrap();
        let Usage::Bytes(n) = usage(
            &[&path(dir.path()), &path(&dir.path().join("missing"))],
            &mut seen,
        ) else {
            panic!("too deep");
        };
        let grown = n - empty;
        assert!(
            (2 << 20..(2 << 20) + (64 << 10)).contains(&grown),
            "{grown}"
        );
    }

    #[test]
    fn a_tree_nested_too_deep_is_over_any_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = dir.path().to_path_buf();
        for _ in 0..MAX_DEPTH + 1 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        let root = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(
            dir.path().as_os_str(),
        ))
        .unwrap();
        assert!(matches!(
            usage(&[&root], &mut Vec::new()),
            Usage::TooDeep(_)
        ));
        assert!(over_limit(Usage::TooDeep(0), u64::MAX).is_some());
        assert_eq!(over_limit(Usage::Bytes(10), 10), None);
        assert_eq!(over_limit(Usage::Bytes(11), 10).unwrap().0, 11);
    }

    #[test]
    fn big_trees_are_scanned_less_often() {
        assert_eq!(
            next_interval(Duration::from_millis(1)),
            Duration::from_millis(50)
        );
        assert_eq!(
            next_interval(Duration::from_secs(1)),
            Duration::from_secs(50)
        );
    }
}
