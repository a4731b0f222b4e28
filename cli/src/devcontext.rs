//! The settings of a running `drover dev` cluster, where the CLI finds them: while
//! it runs, `drover dev` writes `dev.toml` beside the user's config file (see
//! [`crate::credentials::config_path`]: `$DROVER_CONFIG`'s directory, else
//! `$XDG_CONFIG_HOME/drover/dev.toml`, else `~/.config/drover/dev.toml`) with its
//! master's address, CA and admin token file, and removes it at exit. A command
//! given neither `--master` nor `DROVER_MASTER` uses it (saying so on stderr) while
//! the `drover dev` that wrote it is alive, so `drover job list` in another shell
//! just works. Only one `drover dev` at a time owns the file: a second one leaves
//! it alone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use drover_os::fs::{write_private, Durability};

/// The file's name in the config directory.
pub const FILE_NAME: &str = "dev.toml";

/// What `drover dev` writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevContext {
    /// The master's address (`https://127.0.0.1:P`).
    pub master: String,
    /// The cluster CA.
    pub ca: PathBuf,
    /// The admin token's file.
    pub token_file: PathBuf,
    /// The `drover dev` process that wrote it.
    pub pid: u32,
}

/// The file's path from the environment: beside the config file (None: no home to
/// look in).
pub fn path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let config = crate::credentials::config_path(env)?;
    Some(config.parent()?.join(FILE_NAME))
}

/// The context in `path` if its writer is still `alive`; None when there is no
/// file, it cannot be read, or its `drover dev` is gone (killed without cleaning up).
pub fn read(path: &Path, alive: impl Fn(u32) -> bool) -> Option<DevContext> {
    let text = std::fs::read_to_string(path).ok()?;
    let context: DevContext = toml::from_str(&text).ok()?;
    alive(context.pid).then_some(context)
}

/// Whether process `pid` is a running `drover` (its command name), so a pid
/// reused by another program after a killed `drover dev` does not count.
pub fn drover_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim_end() == "drover")
}

/// Holds `dev.toml` while `drover dev` runs; removes it on drop if it is still
/// this one's.
#[derive(Debug)]
pub struct Written {
    path: PathBuf,
    pid: u32,
}

impl Written {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        if read(&self.path, |_| true).is_some_and(|c| c.pid == self.pid) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What [`write`] did.
#[derive(Debug)]
pub enum WriteOutcome {
    /// Written; removed when the guard drops.
    Written(Written),
    /// Another live `drover dev` owns the file.
    Taken(DevContext),
}

/// Writes `context` to `path` (0600, its directory made if missing) unless a live
/// `drover dev` (by `alive`) owns it.
pub fn write(
    path: &Path,
    context: &DevContext,
    alive: impl Fn(u32) -> bool,
) -> std::io::Result<WriteOutcome> {
    if let Some(other) = read(path, |pid| pid != context.pid && alive(pid)) {
        return Ok(WriteOutcome::Taken(other));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let text = toml::to_string(context).map_err(std::io::Error::other)?;
    write_private(
        path,
        format!(
            "# Written by `drover dev` (pid {}), removed when it exits.\n{text}",
            context.pid
        )
        .as_bytes(),
        Durability::Synced,
    )?;
    Ok(WriteOutcome::Written(Written {
        path: path.to_path_buf(),
        pid: context.pid,
    }))
}

/// Where a command's master, CA and token file come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub master: String,
    /// A note for stderr when the master was not given.
    pub note: Option<String>,
    pub ca: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
}

/// Picks the master: `--master`/`DROVER_MASTER` when given; else a live dev
/// context (its CA and token file unless `--ca` / a token was given: `has_token`
/// says `--token-file` or `DROVER_TOKEN` is set); else the default master.
pub fn choose(
    master: Option<String>,
    ca: Option<PathBuf>,
    token_file: Option<PathBuf>,
    has_token: bool,
    dev: Option<(PathBuf, DevContext)>,
) -> Chosen {
    let given = master.filter(|m| !m.trim().is_empty());
    match (given, dev) {
        (None, Some((path, dev))) => Chosen {
            note: Some(format!(
                "note: talking to the `drover dev` cluster at {} (pid {}; settings in {}; \
                 --master or DROVER_MASTER choose another)",
                dev.master,
                dev.pid,
                path.display()
            )),
            master: dev.master,
            ca: ca.or(Some(dev.ca)),
            token_file: if has_token {
                token_file
            } else {
                Some(dev.token_file)
            },
        },
        (given, _) => {
            let (master, note) = crate::args::master_or_default(given);
            Chosen {
                master,
                note,
                ca,
                token_file,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pid: u32) -> DevContext {
        DevContext {
            master: "https://127.0.0.1:7070".to_string(),
            ca: "/d/tls/ca.pem".into(),
            token_file: "/d/master/admin.token".into(),
            pid,
        }
    }

    #[test]
    fn the_file_lives_in_the_config_directory() {
        let env = |k: &str| (k == "XDG_CONFIG_HOME").then(|| "/x".to_string());
        assert_eq!(path(env), Some(PathBuf::from("/x/drover/dev.toml")));
        let env = |k: &str| (k == "HOME").then(|| "/home/u".to_string());
        assert_eq!(
            path(env),
            Some(PathBuf::from("/home/u/.config/drover/dev.toml"))
        );
        assert_eq!(path(|_| None), None);
        let env = |k: &str| (k == "DROVER_CONFIG").then(|| "/etc/drover/cli.toml".to_string());
        assert_eq!(path(env), Some(PathBuf::from("/etc/drover/dev.toml")));
    }

    #[test]
    fn written_while_running_removed_on_drop_ignored_once_its_writer_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("drover").join(FILE_NAME);
        let WriteOutcome::Written(guard) = write(&file, &context(7), |_| true).unwrap() else {
            panic!("not written");
        };
        assert_eq!(read(&file, |_| true), Some(context(7)));
        assert_eq!(
            read(&file, |_| false),
            None,
            "a dead writer's file is ignored"
        );
        // A second dev while the first lives leaves the file alone.
        match write(&file, &context(8), |_| true).unwrap() {
            WriteOutcome::Taken(other) => assert_eq!(other.pid, 7),
            WriteOutcome::Written(_) => panic!("overwrote a live dev's file"),
        }
        drop(guard);
        assert!(!file.exists());
        // A dead writer's leftover is replaced.
        write_private(
            &file,
            toml::to_string(&context(7)).unwrap().as_bytes(),
            Durability::Synced,
        )
        .unwrap();
        assert!(matches!(
            write(&file, &context(9), |pid| pid != 7).unwrap(),
            WriteOutcome::Written(_)
        ));
    }

    #[test]
    fn a_given_master_wins_else_the_dev_context_else_the_default() {
        let dev = Some((PathBuf::from("/c/dev.toml"), context(7)));
        let chosen = choose(Some("https://m:1".into()), None, None, false, dev.clone());
        assert_eq!((chosen.master.as_str(), chosen.note), ("https://m:1", None));
        assert_eq!(chosen.ca, None);

        let chosen = choose(None, None, None, false, dev.clone());
        assert_eq!(chosen.master, "https://127.0.0.1:7070");
        assert_eq!(chosen.ca, Some("/d/tls/ca.pem".into()));
        assert_eq!(chosen.token_file, Some("/d/master/admin.token".into()));
        let note = chosen.note.unwrap();
        assert!(
            note.contains("drover dev") && note.contains("/c/dev.toml"),
            "{note}"
        );

        // An explicit CA or token wins over the context's.
        let chosen = choose(None, Some("/my/ca.pem".into()), None, true, dev);
        assert_eq!(chosen.ca, Some("/my/ca.pem".into()));
        assert_eq!(chosen.token_file, None);

        let chosen = choose(None, None, None, false, None);
        assert_eq!(chosen.master, crate::args::DEFAULT_MASTER);
        assert!(chosen.note.is_some());
    }
}
