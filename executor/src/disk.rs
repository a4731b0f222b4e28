//! `resources.disk` enforced by a periodic usage scan, as Aurora's executor does (its
//! `DiskCollector`): what the task can write (`sandbox/` and `tmp/`) is walked, the
//! allocated blocks of every entry added (a hard-linked file once), and a task over
//! its limit is stopped with exit reason `disk_limit_exceeded`.
//!
//! The walk is root's through a tree the task owns, so it never follows a link: each
//! directory is opened relative to its parent's descriptor with `O_NOFOLLOW`, each
//! entry looked at with `fstatat(AT_SYMLINK_NOFOLLOW)`. A tree nested deeper than
//! [`MAX_DEPTH`] counts as over the limit (the walk holds one descriptor per level).
//! [`next_interval`] spaces scans so that a big tree costs at most about 2 % of the
//! executor's time.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::dir::Dir;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};

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
pub fn usage(dirs: &[&Path]) -> Usage {
    // Made on the first hard link: most trees have none.
    let mut seen = None;
    let mut total = 0u64;
    for dir in dirs {
        let Ok(fd) = nix::fcntl::open(
            *dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let fd = owned(fd);
        if let Ok(st) = nix::sys::stat::fstat(fd.as_raw_fd()) {
            total = total.saturating_add(st.st_blocks as u64 * 512);
        }
        if !walk(fd, 1, &mut seen, &mut total) {
            return Usage::TooDeep(total);
        }
    }
    Usage::Bytes(total)
}

#[allow(unsafe_code)]
fn owned(fd: std::os::fd::RawFd) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` was just returned by open/openat and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Adds what is in the directory `fd` to `total`; false when nested too deep.
fn walk(
    fd: OwnedFd,
    depth: usize,
    seen: &mut Option<HashSet<(u64, u64)>>,
    total: &mut u64,
) -> bool {
    let Ok(dup) = fd.try_clone() else {
        return true;
    };
    let Ok(mut dir) = Dir::from_fd(std::os::fd::IntoRawFd::into_raw_fd(dup)) else {
        return true;
    };
    let mut subdirs = Vec::new();
    for entry in dir.iter().flatten() {
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(st) = fstatat(
            Some(fd.as_fd().as_raw_fd()),
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        let bytes = st.st_blocks as u64 * 512;
        // The stat field types differ between architectures.
        #[allow(clippy::unnecessary_cast)]
        let id = (st.st_dev as u64, st.st_ino as u64);
        let is_dir = (st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR.bits();
        if st.st_nlink > 1 && !is_dir && !seen.get_or_insert_with(HashSet::new).insert(id) {
            continue;
        }
        *total = total.saturating_add(bytes);
        if is_dir {
            subdirs.push(name.to_owned());
        }
    }
    drop(dir);
    for name in subdirs {
        if depth >= MAX_DEPTH {
            return false;
        }
        let Ok(sub) = openat(
            Some(fd.as_raw_fd()),
            name.as_c_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        if !walk(owned(sub), depth + 1, seen, total) {
            return false;
        }
    }
    true
}

/// How long after a scan that took `last_scan` the next may start at the earliest:
/// 50 times as long (a big tree is scanned less often; the executor's `--disk-scan-interval`
/// is the floor).
pub fn next_interval(last_scan: Duration) -> Duration {
    last_scan.saturating_mul(50)
}

/// For a task over its `limit`: the bytes it uses and what to say about it.
pub fn over_limit(usage: Usage, limit: u64) -> Option<(u64, String)> {
    match usage {
        Usage::Bytes(n) if n > limit => Some((
            n,
            format!("disk usage {n} bytes is over resources.disk {limit} bytes; stopping the task"),
        )),
        Usage::Bytes(_) => None,
        Usage::TooDeep(n) => Some((
            n,
            format!("directories nested deeper than {MAX_DEPTH} levels cannot be scanned for resources.disk ({limit} bytes); stopping the task"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_files_once_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let Usage::Bytes(empty) = usage(&[dir.path()]) else {
            panic!("too deep");
        };
        std::fs::write(dir.path().join("a"), vec![1u8; 1 << 20]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![1u8; 1 << 20]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("sub/a-again")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("usr")).unwrap();
        let Usage::Bytes(n) = usage(&[dir.path(), &dir.path().join("missing")]) else {
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
        assert!(matches!(usage(&[dir.path()]), Usage::TooDeep(_)));
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
