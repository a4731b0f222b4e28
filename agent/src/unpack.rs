//! `drover-agent unpack-artifact`: the short-lived helper that puts one artifact
//! into a sandbox. The agent runs it as the task user (never as root when the task
//! is not root), with the cached file on stdin or, for a `file://` URL, the path to
//! read (so a task can only read host files its user can). Each archive member is
//! checked ([`crate::artifacts::check_member`]) before it is written; a refused
//! member fails the whole artifact. Directories on the way to `dest` are created
//! without following links, and a copied file is written to a new temporary name
//! and renamed into place, so an entry in the way is replaced, never followed.
//!
//! Arguments (positional, internal to the agent):
//! `SANDBOX DEST KIND MODE MAX_BYTES SOURCE [SHA256]`: the sandbox directory, the
//! destination relative to it, `file`/`tar`/`tar.gz`, the octal mode of a copied
//! file, the most bytes an archive may unpack to, the file to read (`-`: stdin) and,
//! when the source still needs verifying, its sha256. Exits 0 when done, else 1
//! with one line on stderr saying why.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_common::artifact::{relative_parts, Unpack};
use sha2::{Digest, Sha256};

use crate::artifacts::{check_member, resolves_inside, Member, MemberKind};

/// The subcommand's name (`drover-agent unpack-artifact ...`).
pub const SUBCOMMAND: &str = "unpack-artifact";

/// Why an artifact could not be put into the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(
        "usage: drover-agent {SUBCOMMAND} SANDBOX DEST KIND MODE MAX_BYTES SOURCE [SHA256] ({0})"
    )]
    Usage(&'static str),
    #[error("unpack refused: {0}")]
    Refused(String),
    #[error("checksum mismatch: expected sha256 {expected}, got {actual}")]
    Checksum { expected: String, actual: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> UnpackError {
    let what = what.into();
    move |source| UnpackError::Io { what, source }
}

/// What the helper is asked to do.
#[derive(Debug)]
struct Job {
    sandbox: PathBuf,
    dest: Vec<String>,
    kind: Unpack,
    mode: u32,
    max_bytes: u64,
    source: Option<PathBuf>,
    sha256: Option<String>,
}

fn parse(args: &[String]) -> Result<Job, UnpackError> {
    let [sandbox, dest, kind, mode, max, source, rest @ ..] = args else {
        return Err(UnpackError::Usage("too few arguments"));
    };
    Ok(Job {
        sandbox: PathBuf::from(sandbox),
        dest: relative_parts(dest).ok_or(UnpackError::Usage("DEST leaves the sandbox"))?,
        kind: Unpack::parse(kind).ok_or(UnpackError::Usage("unknown KIND"))?,
        mode: u32::from_str_radix(mode, 8).map_err(|_| UnpackError::Usage("MODE is not octal"))?
            & 0o777,
        max_bytes: max
            .parse()
            .map_err(|_| UnpackError::Usage("MAX_BYTES is not a number"))?,
        source: (source != "-").then(|| PathBuf::from(source)),
        sha256: rest.first().cloned(),
    })
}

/// Runs the helper with the arguments after the subcommand's name.
pub fn main(args: &[String]) -> Result<(), UnpackError> {
    let job = parse(args)?;
    if let (Some(path), Some(expected)) = (&job.source, &job.sha256) {
        let file =
            fs::File::open(path).map_err(io_err(format!("cannot read {}", path.display())))?;
        let actual = sha256_of(file).map_err(io_err(format!("cannot read {}", path.display())))?;
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(UnpackError::Checksum {
                expected: expected.clone(),
                actual,
            });
        }
    }
    let input: Box<dyn Read> = match &job.source {
        Some(path) => Box::new(
            fs::File::open(path).map_err(io_err(format!("cannot read {}", path.display())))?,
        ),
        None => Box::new(io::stdin().lock()),
    };
    let input = io::BufReader::with_capacity(256 * 1024, input);
    match job.kind {
        Unpack::File => {
            let (name, parents) = job
                .dest
                .split_last()
                .ok_or(UnpackError::Usage("DEST names no file"))?;
            let dir = make_dirs(&job.sandbox, parents)?;
            write_file(
                &dir,
                name,
                input.take(job.max_bytes.saturating_add(1)),
                job.mode,
            )?;
            if fs::symlink_metadata(dir.join(name)).map_or(0, |m| m.len()) > job.max_bytes {
                let _ = fs::remove_file(dir.join(name));
                return Err(UnpackError::Refused(format!(
                    "the file is over {} bytes (artifact_task_max_size)",
                    job.max_bytes
                )));
            }
            Ok(())
        }
        Unpack::Tar => unpack_tar(&job, input),
        Unpack::TarGz => unpack_tar(&job, flate2::read::GzDecoder::new(input)),
    }
}

/// The sha256 (hex) of everything `r` reads.
pub fn sha256_of(mut r: impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates `parts` below `base`, refusing any entry on the way that is not a
/// directory (a symlink is never followed), and returns the last directory.
fn make_dirs(base: &Path, parts: &[String]) -> Result<PathBuf, UnpackError> {
    let mut dir = base.to_path_buf();
    for part in parts {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(UnpackError::Refused(format!(
                    "{} is in the way and not a directory (links are not followed)",
                    dir.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
                .mode(0o755)
                .create(&dir)
                .map_err(io_err(format!("cannot create {}", dir.display())))?,
            Err(e) => return Err(io_err(format!("cannot inspect {}", dir.display()))(e)),
        }
    }
    Ok(dir)
}

/// Writes `input` to `dir/name` with `mode`: through a new temporary file renamed
/// over whatever is there.
fn write_file(dir: &Path, name: &str, mut input: impl Read, mode: u32) -> Result<(), UnpackError> {
    let final_path = dir.join(name);
    let tmp = dir.join(format!(".{name}.drover-part"));
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io_err(format!("cannot create {}", tmp.display())))?;
    let written = io::copy(&mut input, &mut file)
        .and_then(|_| file.flush())
        .and_then(|()| file.set_permissions(fs::Permissions::from_mode(mode)))
        .and_then(|()| fs::rename(&tmp, &final_path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(format!("cannot write {}", final_path.display()))(e));
    }
    Ok(())
}

/// Unpacks the tar stream `input` into the destination directory, member by member.
fn unpack_tar(job: &Job, input: impl Read) -> Result<(), UnpackError> {
    let dest = make_dirs(&job.sandbox, &job.dest)?;
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let bad = |e: io::Error| UnpackError::Refused(format!("not a readable tar archive: {e}"));
    let mut total: u64 = 0;
    // Every symlink unpacked, checked again once all are there.
    let mut links: Vec<(Vec<String>, String)> = Vec::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let header = entry.header();
        let path_bytes = entry.path_bytes().into_owned();
        let path = String::from_utf8(path_bytes).map_err(|e| {
            UnpackError::Refused(format!(
                "member `{}` has a name that is not UTF-8",
                String::from_utf8_lossy(e.as_bytes()).escape_debug()
            ))
        })?;
        let link = match entry.link_name_bytes() {
            Some(b) => Some(String::from_utf8(b.into_owned()).map_err(|_| {
                UnpackError::Refused(format!("member `{path}` links to a name that is not UTF-8"))
            })?),
            None => None,
        };
        let kind = header.entry_type();
        let kind = if kind.is_file() || kind.is_contiguous() {
            MemberKind::File
        } else if kind.is_dir() {
            MemberKind::Dir
        } else if kind.is_symlink() {
            MemberKind::Symlink
        } else if kind.is_hard_link() {
            MemberKind::Hardlink
        } else {
            MemberKind::Other
        };
        let mode = header.mode().unwrap_or(0o644);
        let parts = check_member(&Member {
            path: &path,
            kind,
            link: link.as_deref(),
            mode,
        })
        .map_err(|e| UnpackError::Refused(e.to_string()))?;
        if let (MemberKind::Symlink, Some(target)) = (kind, &link) {
            links.push((parts, target.clone()));
        }
        total = total.saturating_add(entry.size());
        if total > job.max_bytes {
            return Err(UnpackError::Refused(format!(
                "the archive unpacks to more than {} bytes (artifact_task_max_size)",
                job.max_bytes
            )));
        }
        let unpacked = entry
            .unpack_in(&dest)
            .map_err(|e| UnpackError::Refused(format!("member `{}`: {e}", path.escape_debug())))?;
        if !unpacked {
            return Err(UnpackError::Refused(format!(
                "member `{}` would land outside the sandbox",
                path.escape_debug()
            )));
        }
    }
    // A link may point outside only through another one (`a -> .`, `b -> a/..`).
    let read_link = |p: &[String]| {
        fs::read_link(dest.join(p.join("/")))
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    };
    for (parts, target) in &links {
        let dir = &parts[..parts.len().saturating_sub(1)];
        if !resolves_inside(dir, target, &read_link) {
            let _ = fs::remove_file(dest.join(parts.join("/")));
            return Err(UnpackError::Refused(format!(
                "member `{}` is a symbolic link pointing outside the sandbox through another link",
                parts.join("/").escape_debug()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        let args = |a: &[&str]| parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(matches!(args(&["/s", "d"]), Err(UnpackError::Usage(_))));
        assert!(matches!(
            args(&["/s", "../d", "file", "644", "1", "-"]),
            Err(UnpackError::Usage(_))
        ));
        let job = args(&["/s", "a/b", "tar.gz", "755", "10", "-"]).unwrap();
        assert_eq!(job.kind, Unpack::TarGz);
        assert_eq!(job.mode, 0o755);
        assert!(job.source.is_none() && job.sha256.is_none());
    }

    #[test]
    fn a_hash_is_lower_case_hex() {
        assert_eq!(
            sha256_of(&b"abc"[..]).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
