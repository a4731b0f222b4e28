//! The unpacked trees of cached archives, `<data_dir>/artifacts/trees/<sha256>.<kind>`,
//! and putting one into a sandbox without copying a byte.
//!
//! A tree is unpacked once per archive and format by the unpack helper (run by root
//! into a staging directory below the cache, which is root's, 0700, so no task can
//! reach it while it is written), with every member checked as for a sandbox; then
//! [`freeze`] makes every file root's with no write bit ([`shared_mode`]) and lists
//! the tree. [`place`] puts a tree into a task's `sandbox/` while that is still
//! root's (before it is handed to the task user, so no process of any task can see
//! or change it meanwhile): each directory made anew and chowned to the task user
//! through a descriptor, each symbolic link made anew, each file a hard link to the
//! tree's. Every directory is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` relative to the sandbox, so nothing is made outside it or
//! through a link, whatever earlier artifacts put there. The files are shared with
//! the cache and every other task using the tree: the task reads and runs them, and
//! may delete, rename or replace them (it owns their directories), but cannot write
//! them or change their mode.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

use crate::artifacts::{resolves_inside, shared_mode};
use crate::sys::{open_dir_beneath, open_nofollow};

/// What one entry of a tree is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory, with the mode the helper gave it.
    Dir(u32),
    File,
    /// A symbolic link and its target.
    Symlink(String),
}

/// One entry of a tree: its path components below the tree's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub parts: Vec<String>,
    pub kind: Kind,
}

/// An unpacked, frozen archive in the cache.
#[derive(Debug)]
pub struct Tree {
    pub path: PathBuf,
    /// Every entry, each directory before what is in it.
    pub nodes: Vec<Node>,
    /// What its files hold (a file with several names counted once): what the
    /// archive unpacks to, counted against a task's `artifact_task_max_size`.
    pub bytes: u64,
}

/// Why a tree could not be placed.
#[derive(Debug)]
pub enum PlaceError {
    /// The artifact is refused (over the task's budget, a link that leaves the
    /// sandbox through something already there, an entry in the way).
    Refused(String),
    /// The file system could not do it (e.g. `EXDEV`: the sandbox is on another file
    /// system than the cache; `EMLINK`): the artifact is copied instead.
    Io(io::Error),
}

/// Freezes what the helper unpacked into `root` (root's, out of every task's
/// reach): every file root's without write bits ([`shared_mode`]), every directory
/// 0755 (the tree's own root stays as it is: the cache around it is 0700), and
/// returns its listing.
pub fn freeze(root: &Path) -> io::Result<Tree> {
    let mut nodes = Vec::new();
    let mut bytes = 0u64;
    let mut seen: Vec<(u64, u64)> = Vec::new();
    walk(root, &mut Vec::new(), &mut nodes, &mut bytes, &mut seen)?;
    Ok(Tree {
        path: root.to_path_buf(),
        nodes,
        bytes,
    })
}

fn walk(
    dir: &Path,
    at: &mut Vec<String>,
    nodes: &mut Vec<Node>,
    bytes: &mut u64,
    seen: &mut Vec<(u64, u64)>,
) -> io::Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let meta = std::fs::symlink_metadata(&path)?;
        at.push(name);
        let ft = meta.file_type();
        if ft.is_dir() {
            nodes.push(Node {
                parts: at.clone(),
                kind: Kind::Dir(meta.mode() & 0o777),
            });
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            walk(&path, at, nodes, bytes, seen)?;
        } else if ft.is_file() {
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(shared_mode(meta.mode())),
            )?;
            let id = (meta.dev(), meta.ino());
            if meta.nlink() < 2 || !seen.contains(&id) {
                seen.push(id);
                *bytes = bytes.saturating_add(meta.len());
            }
            nodes.push(Node {
                parts: at.clone(),
                kind: Kind::File,
            });
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&path)?;
            nodes.push(Node {
                parts: at.clone(),
                kind: Kind::Symlink(target.to_string_lossy().into_owned()),
            });
        } else {
            return Err(io::Error::other(format!(
                "{} is not a file, directory or link",
                path.display()
            )));
        }
        at.pop();
    }
    Ok(())
}

/// Puts `tree` into the directory `dest` (components) of the sandbox `sandbox` (an
/// open descriptor of `sandbox/`, still root's and out of every task's reach),
/// every directory made and every link chowned to `owner`; refuses it when it
/// unpacks to more than `max_bytes`.
pub fn place(
    tree: &Tree,
    sandbox: &File,
    dest: &[String],
    owner: (u32, u32),
    max_bytes: u64,
) -> Result<(), PlaceError> {
    if tree.bytes > max_bytes {
        return Err(PlaceError::Refused(format!(
            "unpack refused: the archive unpacks to more than {max_bytes} bytes (artifact_task_max_size)"
        )));
    }
    let from = open_nofollow(None, &tree.path, libc::O_RDONLY | libc::O_DIRECTORY)
        .map_err(PlaceError::Io)?;
    let base = make_dirs(sandbox, dest, 0o755, owner)?;
    let mut dirs: HashMap<&[String], File> = HashMap::new();
    for node in &tree.nodes {
        let Some((leaf, parents)) = node.parts.split_last() else {
            continue;
        };
        let parent = match parents.is_empty() {
            true => &base,
            false => {
                if !dirs.contains_key(parents) {
                    let d = open_dir_beneath(&base, Path::new(&parents.join("/")))
                        .map_err(|e| in_the_way(parents, e))?;
                    dirs.insert(parents, d);
                }
                &dirs[parents]
            }
        };
        let made = match &node.kind {
            Kind::Dir(mode) => Some(make_dirs(parent, std::slice::from_ref(leaf), *mode, owner)?),
            Kind::File => replace(parent, leaf, |at, name| {
                nix::unistd::linkat(
                    Some(from.as_raw_fd()),
                    Path::new(&node.parts.join("/")),
                    Some(at),
                    Path::new(name),
                    nix::fcntl::AtFlags::empty(),
                )
            })
            .map(|()| None)?,
            Kind::Symlink(target) => {
                replace(parent, leaf, |at, name| {
                    nix::unistd::symlinkat(Path::new(target), Some(at), Path::new(name))
                })?;
                nix::unistd::fchownat(
                    Some(parent.as_raw_fd()),
                    Path::new(leaf),
                    Some(Uid::from_raw(owner.0)),
                    Some(Gid::from_raw(owner.1)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|e| PlaceError::Io(e.into()))?;
                None
            }
        };
        if let Some(d) = made {
            dirs.insert(&node.parts, d);
        }
    }
    check_links(&base, tree)
}

/// Creates the directories `parts` below `dir` (those already there kept, when they
/// are directories: a link or a file in the way refuses), each new one with `mode`
/// and chowned to `owner` through its descriptor; returns the last one.
fn make_dirs(
    dir: &File,
    parts: &[String],
    mode: u32,
    owner: (u32, u32),
) -> Result<File, PlaceError> {
    let mut at = dir.try_clone().map_err(PlaceError::Io)?;
    for (i, part) in parts.iter().enumerate() {
        let made = match nix::sys::stat::mkdirat(
            Some(at.as_raw_fd()),
            Path::new(part),
            Mode::from_bits_truncate(0o700),
        ) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(PlaceError::Io(e.into())),
        };
        let next =
            open_dir_beneath(&at, Path::new(part)).map_err(|e| in_the_way(&parts[..=i], e))?;
        if made {
            nix::unistd::fchown(
                next.as_raw_fd(),
                Some(Uid::from_raw(owner.0)),
                Some(Gid::from_raw(owner.1)),
            )
            .map_err(|e| PlaceError::Io(e.into()))?;
            next.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
                .map_err(PlaceError::Io)?;
        }
        at = next;
    }
    Ok(at)
}

/// An entry on the way that is not a directory (or a link, never followed).
fn in_the_way(parts: &[String], e: io::Error) -> PlaceError {
    match e.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV) => PlaceError::Refused(format!(
            "unpack refused: {} is in the way and not a directory (links are not followed)",
            parts.join("/")
        )),
        _ => PlaceError::Io(e),
    }
}

/// Makes `name` in `dir` with `make` (a link or a symbolic link); an entry already
/// there (from an earlier artifact) is replaced by renaming a new one over it.
fn replace(
    dir: &File,
    name: &str,
    make: impl Fn(i32, &str) -> nix::Result<()>,
) -> Result<(), PlaceError> {
    match make(dir.as_raw_fd(), name) {
        Ok(()) => return Ok(()),
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(PlaceError::Io(e.into())),
    }
    let tmp = format!(".{name}.drover-part");
    let _ = nix::unistd::unlinkat(
        Some(dir.as_raw_fd()),
        Path::new(&tmp),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
    make(dir.as_raw_fd(), &tmp).map_err(|e| PlaceError::Io(e.into()))?;
    nix::fcntl::renameat(
        Some(dir.as_raw_fd()),
        Path::new(&tmp),
        Some(dir.as_raw_fd()),
        Path::new(name),
    )
    .map_err(|e| {
        let _ = nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            Path::new(&tmp),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        match e {
            Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST => PlaceError::Refused(format!(
                "unpack refused: member `{name}` would replace a directory"
            )),
            e => PlaceError::Io(e.into()),
        }
    })
}

/// Checks the tree's symbolic links again where they now are: a link may point
/// outside `dest` only through something an earlier artifact put there. Removes the
/// first one found pointing out and refuses the artifact.
fn check_links(base: &File, tree: &Tree) -> Result<(), PlaceError> {
    let read_link = |p: &[String]| {
        let (leaf, parents) = p.split_last()?;
        let dir = match parents.is_empty() {
            true => base.try_clone().ok()?,
            false => open_dir_beneath(base, Path::new(&parents.join("/"))).ok()?,
        };
        nix::fcntl::readlinkat(Some(dir.as_raw_fd()), Path::new(leaf))
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    };
    for node in &tree.nodes {
        let Kind::Symlink(target) = &node.kind else {
            continue;
        };
        let dir = &node.parts[..node.parts.len() - 1];
        if !resolves_inside(dir, target, &read_link) {
            let at = match dir.is_empty() {
                true => ".".to_string(),
                false => dir.join("/"),
            };
            if let Ok(d) = open_dir_beneath(base, Path::new(&at)) {
                let _ = nix::unistd::unlinkat(
                    Some(d.as_raw_fd()),
                    Path::new(&node.parts[node.parts.len() - 1]),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
            }
            return Err(PlaceError::Refused(format!(
                "unpack refused: member `{}` is a symbolic link pointing outside the sandbox through another link",
                node.parts.join("/").escape_debug()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> (u32, u32) {
        (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        )
    }

    /// A tree in `root/tree`: `app/run.sh` (0700), `app/data` (0644), a hard link
    /// `app/data2` of it, `app/link -> run.sh`, frozen.
    fn sample(root: &Path) -> Tree {
        let t = root.join("tree");
        std::fs::create_dir_all(t.join("app")).unwrap();
        std::fs::write(t.join("app/run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(t.join("app/run.sh"), PermissionsExt::from_mode(0o700)).unwrap();
        std::fs::write(t.join("app/data"), "12345").unwrap();
        std::fs::hard_link(t.join("app/data"), t.join("app/data2")).unwrap();
        std::os::unix::fs::symlink("run.sh", t.join("app/link")).unwrap();
        freeze(&t).unwrap()
    }

    fn sandbox(root: &Path) -> File {
        std::fs::create_dir(root.join("sandbox")).unwrap();
        File::open(root.join("sandbox")).unwrap()
    }

    #[test]
    fn a_frozen_tree_is_listed_read_only_and_placed_as_links() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = sample(tmp.path());
        assert_eq!(tree.bytes, 10 + 5);
        let kinds: Vec<(String, Kind)> = tree
            .nodes
            .iter()
            .map(|n| (n.parts.join("/"), n.kind.clone()))
            .collect();
        assert_eq!(kinds[0].0, "app");
        assert!(kinds.contains(&("app/link".into(), Kind::Symlink("run.sh".into()))));
        let run = tree.path.join("app/run.sh");
        assert_eq!(std::fs::metadata(&run).unwrap().mode() & 0o7777, 0o555);
        let sb = sandbox(tmp.path());
        place(&tree, &sb, &["opt".to_string()], me(), 100).unwrap();
        let placed = tmp.path().join("sandbox/opt/app");
        let a = std::fs::metadata(placed.join("run.sh")).unwrap();
        assert_eq!(a.ino(), std::fs::metadata(&run).unwrap().ino());
        assert_eq!(
            std::fs::metadata(placed.join("data")).unwrap().ino(),
            std::fs::metadata(placed.join("data2")).unwrap().ino()
        );
        assert_eq!(
            std::fs::read_link(placed.join("link")).unwrap(),
            Path::new("run.sh")
        );
        // Placed twice into one sandbox: replaced, not refused.
        place(&tree, &sb, &["opt".to_string()], me(), 100).unwrap();
    }

    #[test]
    fn over_the_budget_or_through_a_link_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = sample(tmp.path());
        let sb = sandbox(tmp.path());
        assert!(matches!(
            place(&tree, &sb, &[], me(), 14),
            Err(PlaceError::Refused(e)) if e.contains("more than 14 bytes")
        ));
        // A link in the way (as an earlier artifact could leave one) is not followed.
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("sandbox/app")).unwrap();
        assert!(matches!(
            place(&tree, &sb, &[], me(), 100),
            Err(PlaceError::Refused(e)) if e.contains("in the way")
        ));
        assert!(matches!(
            place(&tree, &sb, &["app".to_string()], me(), 100),
            Err(PlaceError::Refused(e)) if e.contains("in the way")
        ));
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn a_link_leaving_through_an_earlier_link_is_removed_and_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path().join("tree");
        std::fs::create_dir_all(&t).unwrap();
        std::os::unix::fs::symlink("a/..", t.join("b")).unwrap();
        let tree = freeze(&t).unwrap();
        let sb = sandbox(tmp.path());
        std::os::unix::fs::symlink(".", tmp.path().join("sandbox/a")).unwrap();
        assert!(matches!(
            place(&tree, &sb, &[], me(), 100),
            Err(PlaceError::Refused(e)) if e.contains("through another link")
        ));
        assert!(std::fs::symlink_metadata(tmp.path().join("sandbox/b")).is_err());
    }
}
