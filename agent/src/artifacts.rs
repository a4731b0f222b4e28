//! The pure rules of artifacts on a host: what a zip member is, which archive
//! members (tar or zip) may be unpacked into a sandbox (no absolute paths, no `..`,
//! no links out of the unpack directory, no device files or FIFOs, no setuid or
//! setgid bits), which cached artifacts to evict when the cache is over its size (least recently used first,
//! never one in use), and when a cached archive's unpacked tree is shared with a
//! sandbox by hard links instead of copied ([`shares_tree`], [`shared_mode`]). The
//! I/O lives in `runtime::fetch` (download, cache), `runtime::tree` (the unpacked
//! trees) and `unpack` (the helper that writes into the sandbox as the task user).

use drover_common::artifact::{relative_parts, Unpack};

/// What an archive member is, as its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberKind {
    File,
    Dir,
    Symlink,
    Hardlink,
    /// Anything else: character or block device, FIFO, socket, unknown type.
    Other,
}

/// One archive member's header, as far as the checks need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    pub path: &'a str,
    pub kind: MemberKind,
    /// The link target of a symlink or hard link.
    pub link: Option<&'a str>,
    pub mode: u32,
}

/// Why a member is refused: the message names the member.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("member `{path}` {why}")]
pub struct Refused {
    pub path: String,
    pub why: &'static str,
}

/// Checks `m` and returns its path components below the unpack directory (empty
/// for the directory itself, e.g. `./`).
pub fn check_member(m: &Member<'_>) -> Result<Vec<String>, Refused> {
    let refuse = |why| Refused {
        path: m.path.escape_debug().to_string(),
        why,
    };
    if m.path.starts_with('/') {
        return Err(refuse("has an absolute path"));
    }
    let parts = relative_parts(m.path).ok_or_else(|| refuse("leaves the directory with `..`"))?;
    if m.mode & 0o6000 != 0 {
        return Err(refuse("has the setuid or setgid bit"));
    }
    match m.kind {
        MemberKind::File | MemberKind::Dir => {}
        MemberKind::Other => {
            return Err(refuse(
                "is a device file, FIFO or socket (only files, directories and links are unpacked)",
            ))
        }
        MemberKind::Symlink => {
            let target = m.link.ok_or_else(|| refuse("is a link without a target"))?;
            if !symlink_stays_inside(&parts, target) {
                return Err(refuse("is a symbolic link pointing outside the sandbox"));
            }
        }
        MemberKind::Hardlink => {
            // A hard link's target is a path from the archive's root.
            let target = m.link.ok_or_else(|| refuse("is a link without a target"))?;
            if target.starts_with('/') || relative_parts(target).is_none_or(|p| p.is_empty()) {
                return Err(refuse("is a hard link to a file outside the archive"));
            }
        }
    }
    if parts.is_empty() && m.kind != MemberKind::Dir {
        return Err(refuse("has an empty path"));
    }
    Ok(parts)
}

/// Whether the symlink at `parts` (below the unpack directory) pointing at
/// `target` resolves inside the unpack directory, read lexically: relative, and
/// never climbing above it with `..`.
pub fn symlink_stays_inside(parts: &[String], target: &str) -> bool {
    if target.is_empty() || target.starts_with('/') || target.contains('\0') {
        return false;
    }
    // The directory the link sits in.
    let mut depth = parts.len().saturating_sub(1) as i64;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

/// A zip member's kind and mode: for an archive made on Unix, `unix` is the mode
/// in the high 16 bits of its external attributes (file type and permission bits,
/// setuid included); without one (or with no file type in it), a name ending in `/`
/// is a directory and anything else a file (0755 and 0644 by default).
pub fn zip_member(name_ends_in_slash: bool, unix: Option<u32>) -> (MemberKind, u32) {
    const S_IFMT: u32 = 0o170_000;
    let plain = |mode: u32| match name_ends_in_slash {
        true => (MemberKind::Dir, mode),
        false => (MemberKind::File, mode),
    };
    let Some(mode) = unix else {
        return plain(if name_ends_in_slash { 0o755 } else { 0o644 });
    };
    let perms = mode & 0o7777;
    match mode & S_IFMT {
        0 | 0o100_000 => plain(perms),
        0o040_000 => (MemberKind::Dir, perms),
        0o120_000 => (MemberKind::Symlink, perms),
        _ => (MemberKind::Other, perms),
    }
}

/// Most links followed when resolving one link (as the kernel's `ELOOP`).
const MAX_HOPS: u32 = 40;

/// Whether the symlink in directory `dir` (components below the unpack directory)
/// pointing at `target` resolves inside the unpack directory when the links already
/// there are followed: `read_link` gives the target of the entry at a path when it is
/// a symlink. Catches what a lexical check cannot, e.g. `a -> .` with `b -> a/..`.
/// Components that do not exist are taken as they are written.
pub fn resolves_inside(
    dir: &[String],
    target: &str,
    read_link: &dyn Fn(&[String]) -> Option<String>,
) -> bool {
    if target.starts_with('/') {
        return false;
    }
    let mut at: Vec<String> = dir.to_vec();
    let mut pending: std::collections::VecDeque<String> =
        target.split('/').map(str::to_string).collect();
    let mut hops = 0;
    while let Some(c) = pending.pop_front() {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return false;
                }
            }
            _ => {
                at.push(c);
                if let Some(next) = read_link(&at) {
                    hops += 1;
                    if hops > MAX_HOPS || next.starts_with('/') {
                        return false;
                    }
                    at.pop();
                    for part in next.split('/').rev() {
                        pending.push_front(part.to_string());
                    }
                }
            }
        }
    }
    true
}

/// One artifact in the cache, as eviction sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    pub sha256: String,
    pub size: u64,
    /// When it was last used (any monotonic order: ms, a counter).
    pub last_used: u64,
    /// A task that is being prepared uses it: never evicted.
    pub in_use: bool,
}

/// The artifacts to evict, least recently used first, so that the cache plus
/// `incoming` bytes fits in `capacity`; artifacts in use are kept even when that
/// leaves the cache over its size.
pub fn evictions(entries: &[Cached], capacity: u64, incoming: u64) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|e| e.size).sum::<u64>() + incoming;
    let mut candidates: Vec<&Cached> = entries.iter().filter(|e| !e.in_use).collect();
    candidates.sort_by(|a, b| (a.last_used, &a.sha256).cmp(&(b.last_used, &b.sha256)));
    let mut out = Vec::new();
    for e in candidates {
        if total <= capacity {
            break;
        }
        total -= e.size;
        out.push(e.sha256.clone());
    }
    out
}

/// The name of the unpacked tree of the cached archive `sha256` unpacked as `kind`
/// (below `<data_dir>/artifacts/trees/`): one tree per archive and format.
pub fn tree_name(sha256: &str, kind: Unpack) -> String {
    format!("{sha256}.{}", kind.as_str())
}

/// Whether an http(s) artifact unpacked as `kind` is put into a sandbox as hard
/// links to the cache's unpacked tree (else copied by the helper, as the task
/// user): only an archive (a single file's `mode` is the task's own to change), for
/// a task user that is not root (root could write through the shared files), while
/// the sandbox is still root's and out of every task's reach (`run_as` is the task
/// user's uid when the agent is root, else `None`: no tree without root either).
pub fn shares_tree(kind: Unpack, run_as: Option<u32>, sandbox_handed_over: bool) -> bool {
    kind != Unpack::File && run_as.is_some_and(|uid| uid != 0) && !sandbox_handed_over
}

/// Whether a tree of `nodes` entries is placed on the agent's async worker itself
/// (about 10 µs of system calls per entry, so at most ~1 ms) rather than on a
/// blocking thread, whose wake-up costs milliseconds on a loaded host.
pub fn place_inline(nodes: usize) -> bool {
    nodes <= 128
}

/// The mode of a file in a shared tree (owned by root, so the task user reads it
/// through the bits for others): the owner's read and execute bits for everyone,
/// no write bit. `0755` and `0700` become `0555`, `0644` and `0600` become `0444`.
pub fn shared_mode(mode: u32) -> u32 {
    let owner = (mode >> 6) & 0o5;
    (owner << 6) | (owner << 3) | owner
}

/// The STARTING status message while artifact `n` of `of` is put into the sandbox:
/// `fetching 2 of 3`, with the bytes downloaded so far and the size the server
/// announced when known: `fetching 2 of 3 (14 MiB of 40 MiB)`, `(14 MiB)`.
pub fn fetching(n: usize, of: usize, bytes: Option<(u64, Option<u64>)>) -> String {
    match bytes {
        None => format!("fetching {n} of {of}"),
        Some((done, None)) => format!("fetching {n} of {of} ({})", human(done)),
        Some((done, Some(total))) => {
            format!("fetching {n} of {of} ({} of {})", human(done), human(total))
        }
    }
}

/// `n` bytes for people: `14 MiB`, `512 KiB`, `10 B`.
pub fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(path: &str, kind: MemberKind, link: Option<&str>) -> Member<'static> {
        Member {
            path: Box::leak(path.to_string().into_boxed_str()),
            kind,
            link: link.map(|l| &*Box::leak(l.to_string().into_boxed_str())),
            mode: 0o644,
        }
    }

    #[test]
    fn ordinary_members_are_unpacked() {
        let ok = |m: Member<'_>| check_member(&m).map_err(|e| e.to_string());
        assert_eq!(
            ok(member("./app/bin/run", MemberKind::File, None)),
            Ok(vec!["app".into(), "bin".into(), "run".into()])
        );
        assert_eq!(ok(member("./", MemberKind::Dir, None)), Ok(vec![]));
        assert!(ok(member("app/current", MemberKind::Symlink, Some("v2/../v1"))).is_ok());
        assert!(ok(member(
            "app/lib.so",
            MemberKind::Hardlink,
            Some("app/lib.so.1")
        ))
        .is_ok());
    }

    #[test]
    fn hostile_members_are_refused_with_their_name() {
        let cases = [
            (member("/etc/cron.d/x", MemberKind::File, None), "absolute"),
            (member("../../x", MemberKind::File, None), ".."),
            (member("a/../../x", MemberKind::File, None), ".."),
            (member("dev/sda", MemberKind::Other, None), "device"),
            (member("esc", MemberKind::Symlink, Some("/etc")), "outside"),
            (
                member("a/esc", MemberKind::Symlink, Some("../..")),
                "outside",
            ),
            (
                member("a/esc", MemberKind::Symlink, Some("b/../../../x")),
                "outside",
            ),
            (
                member("hl", MemberKind::Hardlink, Some("/etc/shadow")),
                "outside",
            ),
            (member("hl", MemberKind::Hardlink, Some("../x")), "outside"),
            (member("", MemberKind::File, None), "empty"),
        ];
        for (m, word) in cases {
            let e = check_member(&m).expect_err(m.path).to_string();
            assert!(e.contains(word) && e.contains(m.path), "{e}");
        }
        let mut suid = member("bin/sh", MemberKind::File, None);
        suid.mode = 0o4755;
        assert!(check_member(&suid)
            .unwrap_err()
            .to_string()
            .contains("setuid"));
    }

    #[test]
    fn links_inside_a_subdirectory_may_climb_to_the_top_but_not_past_it() {
        let at = |p: &str| relative_parts(p).unwrap();
        assert!(symlink_stays_inside(&at("a/b/link"), "../../x"));
        assert!(!symlink_stays_inside(&at("a/b/link"), "../../../x"));
        assert!(symlink_stays_inside(&at("link"), "."));
        assert!(!symlink_stays_inside(&at("link"), ""));
    }

    #[test]
    fn links_are_followed_through_links_already_unpacked() {
        let links = |p: &[String]| match p.join("/").as_str() {
            "a" => Some(".".to_string()),
            "deep" => Some("x/y".to_string()),
            "loop" => Some("loop".to_string()),
            _ => None,
        };
        // Lexically inside, but `a` is `.`, so `a/..` is the parent.
        assert!(symlink_stays_inside(&["b".to_string()], "a/.."));
        assert!(!resolves_inside(&[], "a/..", &links));
        assert!(resolves_inside(&[], "deep/..", &links));
        assert!(resolves_inside(&[], "deep/../..", &links));
        assert!(!resolves_inside(&[], "deep/../../..", &links));
        assert!(!resolves_inside(&[], "loop/x", &links));
        assert!(!resolves_inside(&[], "/etc", &links));
    }

    #[test]
    fn zip_members_take_their_kind_from_the_unix_mode_else_the_name() {
        assert_eq!(zip_member(false, None), (MemberKind::File, 0o644));
        assert_eq!(zip_member(true, None), (MemberKind::Dir, 0o755));
        assert_eq!(
            zip_member(false, Some(0o100_755)),
            (MemberKind::File, 0o755)
        );
        assert_eq!(zip_member(false, Some(0o640)), (MemberKind::File, 0o640));
        assert_eq!(zip_member(true, Some(0o750)), (MemberKind::Dir, 0o750));
        assert_eq!(zip_member(false, Some(0o040_700)), (MemberKind::Dir, 0o700));
        assert_eq!(
            zip_member(false, Some(0o120_777)),
            (MemberKind::Symlink, 0o777)
        );
        // Character and block devices, FIFOs, sockets.
        for dev in [0o020_666, 0o060_660, 0o010_644, 0o140_755] {
            assert_eq!(zip_member(false, Some(dev)).0, MemberKind::Other, "{dev:o}");
        }
        // The setuid bit is kept for the check to refuse.
        let (kind, mode) = zip_member(false, Some(0o104_755));
        let m = Member {
            path: "sh",
            kind,
            link: None,
            mode,
        };
        assert!(check_member(&m).unwrap_err().to_string().contains("setuid"));
    }

    fn cached(sha: &str, size: u64, last_used: u64, in_use: bool) -> Cached {
        Cached {
            sha256: sha.into(),
            size,
            last_used,
            in_use,
        }
    }

    #[test]
    fn eviction_takes_the_least_recently_used_first_and_never_one_in_use() {
        let entries = [
            cached("new", 40, 30, false),
            cached("old", 40, 10, false),
            cached("busy", 40, 5, true),
            cached("mid", 40, 20, false),
        ];
        assert_eq!(evictions(&entries, 200, 0), Vec::<String>::new());
        assert_eq!(evictions(&entries, 160, 40), ["old"]);
        assert_eq!(evictions(&entries, 120, 40), ["old", "mid"]);
        // Everything evictable goes; the one in use stays even over the size.
        assert_eq!(evictions(&entries, 0, 40), ["old", "mid", "new"]);
    }

    #[test]
    fn only_archives_for_a_task_user_other_than_root_share_a_tree() {
        assert!(shares_tree(Unpack::Tar, Some(33), false));
        assert!(shares_tree(Unpack::Zip, Some(33), false));
        assert!(!shares_tree(Unpack::File, Some(33), false));
        assert!(!shares_tree(Unpack::TarGz, Some(0), false));
        assert!(!shares_tree(Unpack::TarGz, None, false));
        assert!(!shares_tree(Unpack::TarZst, Some(33), true));
        assert_eq!(tree_name("ab", Unpack::TarGz), "ab.tar.gz");
        assert!(place_inline(40) && !place_inline(10_000));
    }

    #[test]
    fn shared_files_are_read_only_and_readable_by_the_task_user() {
        assert_eq!(shared_mode(0o755), 0o555);
        assert_eq!(shared_mode(0o700), 0o555);
        assert_eq!(shared_mode(0o644), 0o444);
        assert_eq!(shared_mode(0o600), 0o444);
        assert_eq!(shared_mode(0o200), 0);
        assert_eq!(shared_mode(0o311), 0o111);
    }

    #[test]
    fn sizes_print_for_people() {
        assert_eq!(human(14 << 20), "14 MiB");
        assert_eq!(human(512 << 10), "512 KiB");
        assert_eq!(human(3), "3 B");
    }

    #[test]
    fn fetch_progress_reads_like_the_issue_says() {
        assert_eq!(fetching(1, 3, None), "fetching 1 of 3");
        assert_eq!(
            fetching(2, 3, Some((14 << 20, Some(40 << 20)))),
            "fetching 2 of 3 (14 MiB of 40 MiB)"
        );
        assert_eq!(
            fetching(3, 3, Some((512 << 10, None))),
            "fetching 3 of 3 (512 KiB)"
        );
    }
}
