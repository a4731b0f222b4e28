//! Files only their owner may read (tokens, keys, credentials).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Writes `text` to `path`, readable by its owner only: created 0600 beside it,
/// synced, then renamed into place, so a reader sees the old file or the whole new
/// one, and no one else ever sees the text.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
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
        write_private(&path, "drv_new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "drv_new\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!path.with_extension("tmp").exists());
    }
}
