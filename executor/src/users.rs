//! Looking up the task user in `/etc/passwd` and `/etc/group` directly when NSS
//! would answer from those files anyway, so the executor need not load the NSS
//! modules for every task.
//!
//! Why: `getpwnam`/`getgrouplist` through glibc load `libnss_systemd` and `libcap`
//! (about 250 KiB kept resident) and probe a dozen userdb paths, once per task. When
//! `/etc/nsswitch.conf` lists `files` first for `passwd` and `group`, a user found
//! in `/etc/passwd` is the one NSS returns, and with no userdb records on the host
//! the later sources add no group memberships. In every other case (another source
//! first, `+`/`-` compat entries, userdb present, user not in the files) the caller
//! falls back to NSS.

use std::path::Path;

/// A user as found in the files: uid, primary gid, supplementary groups (the
/// primary first, as `getgrouplist` returns them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Where systemd's userdb keeps records that `libnss_systemd` would add.
const USERDB_DIRS: [&str; 6] = [
    "/run/systemd/userdb",
    "/etc/userdb",
    "/run/userdb",
    "/run/host/userdb",
    "/usr/local/lib/userdb",
    "/usr/lib/userdb",
];

/// `name` from the files under `etc` (normally `/etc`), or None when NSS must be
/// asked instead.
pub fn lookup(etc: &Path, name: &str) -> Option<FileUser> {
    let nsswitch = std::fs::read_to_string(etc.join("nsswitch.conf")).ok()?;
    if !files_first(&nsswitch, "passwd") || !files_first(&nsswitch, "group") {
        return None;
    }
    if USERDB_DIRS.iter().any(|d| Path::new(d).exists()) {
        return None;
    }
    let passwd = std::fs::read_to_string(etc.join("passwd")).ok()?;
    let (uid, gid) = passwd_entry(&passwd, name)?;
    let group = std::fs::read_to_string(etc.join("group")).ok()?;
    let groups = member_groups(&group, name, gid)?;
    Some(FileUser { uid, gid, groups })
}

/// Whether the `db:` line of nsswitch.conf names `files` as its first source
/// (without an action such as `[NOTFOUND=return]` right after it). An absent line
/// means glibc's default, which for passwd and group starts with `files`.
pub fn files_first(nsswitch: &str, db: &str) -> bool {
    for line in nsswitch.lines() {
        let line = line.split('#').next().unwrap_or("");
        let Some((key, sources)) = line.split_once(':') else {
            continue;
        };
        if key.trim() != db {
            continue;
        }
        let mut tokens = sources.split_whitespace();
        return tokens.next() == Some("files")
            && !tokens.next().is_some_and(|t| t.starts_with('['));
    }
    true
}

/// (uid, gid) of `name` in a passwd file; None if absent or if the file has NIS
/// compat entries (`+`/`-` lines), which only NSS understands.
pub fn passwd_entry(passwd: &str, name: &str) -> Option<(u32, u32)> {
    let mut found = None;
    for line in passwd.lines() {
        if line.starts_with('+') || line.starts_with('-') {
            return None;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() >= 4 && fields[0] == name && found.is_none() {
            found = Some((fields[2].parse().ok()?, fields[3].parse().ok()?));
        }
    }
    found
}

/// The primary gid, then every group of a group file that lists `name` as a
/// member; None if the file has NIS compat entries.
pub fn member_groups(group: &str, name: &str, primary: u32) -> Option<Vec<u32>> {
    let mut groups = vec![primary];
    for line in group.lines() {
        if line.starts_with('+') || line.starts_with('-') {
            return None;
        }
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 || !fields[3].split(',').any(|m| m.trim() == name) {
            continue;
        }
        if let Ok(gid) = fields[2].parse::<u32>() {
            if !groups.contains(&gid) {
                groups.push(gid);
            }
        }
    }
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_must_come_first_for_the_fast_path() {
        let conf = "# comment\npasswd:         files systemd\ngroup: files\nhosts: dns\n";
        assert!(files_first(conf, "passwd"));
        assert!(files_first(conf, "group"));
        assert!(!files_first("passwd: ldap files\n", "passwd"));
        assert!(!files_first(
            "passwd: files [NOTFOUND=continue] ldap\n",
            "passwd"
        ));
        assert!(!files_first("passwd: compat\n", "passwd"));
        assert!(
            files_first("hosts: dns\n", "passwd"),
            "glibc's default starts with files"
        );
    }

    #[test]
    fn passwd_and_groups_come_from_the_files() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nwww-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n";
        let group = "root:x:0:\nwww-data:x:33:\nadm:x:4:syslog,www-data\nstaff:x:50:bob\nweb:x:60: www-data \n";
        assert_eq!(passwd_entry(passwd, "www-data"), Some((33, 33)));
        assert_eq!(passwd_entry(passwd, "nobody"), None);
        assert_eq!(member_groups(group, "www-data", 33), Some(vec![33, 4, 60]));
        assert_eq!(member_groups(group, "nobody", 65534), Some(vec![65534]));
    }

    #[test]
    fn nis_compat_entries_send_the_lookup_to_nss() {
        assert_eq!(passwd_entry("a:x:1:1::/:/bin/sh\n+@netgroup\n", "a"), None);
        assert_eq!(member_groups("g:x:1:a\n+\n", "a", 1), None);
    }

    #[test]
    fn lookup_reads_an_etc_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nsswitch.conf"),
            "passwd: files\ngroup: files\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("passwd"),
            "svc:x:1000:1000::/home/svc:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("group"), "svc:x:1000:\nextra:x:1001:svc\n").unwrap();
        let found = lookup(dir.path(), "svc");
        // A host with userdb records always goes through NSS.
        if USERDB_DIRS.iter().any(|d| Path::new(d).exists()) {
            assert_eq!(found, None);
        } else {
            assert_eq!(
                found,
                Some(FileUser {
                    uid: 1000,
                    gid: 1000,
                    groups: vec![1000, 1001]
                })
            );
        }
        assert_eq!(lookup(dir.path(), "missing"), None);
        std::fs::write(dir.path().join("nsswitch.conf"), "passwd: ldap files\n").unwrap();
        assert_eq!(lookup(dir.path(), "svc"), None);
    }
}
