//! How `resources.disk` is enforced on this host, said once when the agent starts:
//! by project quotas and the scan where the sandbox root's file system is mounted with
//! project quotas (`prjquota`), else by the executor's scan alone. Read from the
//! mount options in `/proc/self/mountinfo`; each executor still tries the quota for
//! its task and falls back to the scan by itself (docs/executor.md, "Disk").

use std::path::{Path, PathBuf};

/// The mount that holds a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOf {
    pub mount_point: PathBuf,
    pub fstype: String,
    /// Mounted with enforced project quotas (`prjquota`, ext4's journaled
    /// `prjjquota=`).
    pub project_quota: bool,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(
                    (u32::from(d[0] - b'0') * 64
                        + u32::from(d[1] - b'0') * 8
                        + u32::from(d[2] - b'0')) as u8,
                );
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount of `mountinfo` (the text of `/proc/self/mountinfo`) that holds the
/// absolute, resolved `path`: the deepest mount point above it, the last one listed
/// when several share it (a later mount covers an earlier one).
pub fn mount_of(mountinfo: &str, path: &Path) -> Option<MountOf> {
    let mut best: Option<MountOf> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(fstype), Some(options)) =
            (fields.get(4), fields.get(dash + 1), fields.get(dash + 3))
        else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if !path.starts_with(&point) {
            continue;
        }
        let deeper = best
            .as_ref()
            .is_none_or(|b| point.components().count() >= b.mount_point.components().count());
        if deeper {
            best = Some(MountOf {
                mount_point: point,
                fstype: fstype.to_string(),
                project_quota: options
                    .split(',')
                    .any(|o| o == "prjquota" || o.starts_with("prjjquota=")),
            });
        }
    }
    best
}

/// Logs how `resources.disk` is enforced for tasks under `sandbox_root` (by the scan
/// alone when executors run with `no_isolation`: not as root, they set no quota).
pub fn log_enforcement(sandbox_root: &Path, no_isolation: bool) {
    if no_isolation {
        tracing::info!(
            "resources.disk: the executor's scan (no_isolation: executors set no quota)"
        );
        return;
    }
    let root = std::fs::canonicalize(sandbox_root).unwrap_or_else(|_| sandbox_root.into());
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|text| mount_of(&text, &root));
    match mount {
        Some(m) if m.project_quota => tracing::info!(
            sandbox_root = %root.display(),
            mount = %m.mount_point.display(),
            fstype = %m.fstype,
            "resources.disk: project quotas (the kernel refuses a write past the limit) and the executor's scan"
        ),
        Some(m) => tracing::info!(
            sandbox_root = %root.display(),
            mount = %m.mount_point.display(),
            fstype = %m.fstype,
            "resources.disk: the executor's scan alone (the sandbox root's file system is not mounted with prjquota)"
        ),
        None => tracing::info!(
            sandbox_root = %root.display(),
            "resources.disk: the executor's scan (the sandbox root's mount is not in /proc/self/mountinfo)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:35 / /tmp rw,nosuid shared:20 - tmpfs tmpfs rw,size=1024k
41 22 7:0 / /srv/drover\\040sandboxes rw,relatime shared:21 - ext4 /dev/loop0 rw,prjquota
42 22 7:1 / /srv/x rw,relatime shared:22 - xfs /dev/loop1 rw,attr2,inode64,pqnoenforce
43 22 7:2 / /srv/j rw,relatime shared:23 - ext4 /dev/loop2 rw,prjjquota=aquota.project,jqfmt=vfsv1
44 40 0:36 / /tmp rw shared:24 - ext4 /dev/loop3 rw,prjquota
";

    #[test]
    fn the_deepest_last_mount_over_a_path_says_whether_it_has_project_quotas() {
        let of = |p: &str| mount_of(MOUNTINFO, Path::new(p)).unwrap();
        assert_eq!(
            of("/srv/drover sandboxes/agent"),
            MountOf {
                mount_point: "/srv/drover sandboxes".into(),
                fstype: "ext4".into(),
                project_quota: true,
            }
        );
        assert!(!of("/var/lib/drover").project_quota);
        assert_eq!(of("/var/lib/drover").mount_point, PathBuf::from("/"));
        assert!(!of("/srv/x/s").project_quota, "accounting only is no limit");
        assert!(of("/srv/j/s").project_quota);
        assert!(of("/tmp/s").project_quota, "the later mount covers /tmp");
        assert!(
            !of("/srv/drover").project_quota,
            "a name prefix is not a parent"
        );
        assert_eq!(mount_of("", Path::new("/x")), None);
    }
}
