//! Files only their owner may read (tokens, keys, credentials, the agent's records in
//! a task directory): the one way Drover's processes write them.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Whether [`write_private`] waits for the bytes to reach the disk before the rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync'd before the rename: what was written survives a power cut.
    Synced,
    /// Left to the page cache: survives a crash of the process, not of the host.
    Cached,
}

/// Writes `bytes` to `path`, readable by its owner only: a fresh 0600 file beside it
/// (never opened through a symlink, never an older file's permissions), synced when
/// asked, then renamed into place, so a reader sees the old file or the whole new one,
/// and no one else ever sees the bytes.
pub fn write_private(path: &Path, bytes: &[u8], durability: Durability) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    file.write_all(bytes)?;
    if durability == Durability::Synced {
        file.sync_all()?;
    }
    drop(file);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_private_file_is_the_owners_alone_and_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "old").unwrap();
        write_private(&path, b"drv_new\n", Durability::Synced).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "drv_new\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!path.with_extension("tmp").exists());
    }

    #[test]
    fn a_left_over_temp_file_does_not_lend_its_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.json");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, "stale").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"{}", Durability::Cached).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_symlink_in_place_of_the_temp_file_is_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "untouched").unwrap();
        let path = dir.path().join("final.json");
        std::os::unix::fs::symlink(&target, path.with_extension("tmp")).unwrap();
        write_private(&path, b"{}", Durability::Synced).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}");
    }
}
