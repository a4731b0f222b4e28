//! `drover-agent unpack-artifact`: the short-lived helper that puts one artifact
//! into a sandbox. The agent runs it as the task user (never as root when the task
//! is not root), with the cached file on stdin or, for a `file://` URL, the path to
//! read (so a task can only read host files its user can). Each archive member is
//! checked ([`crate::artifacts::check_member`]) before it is written; a refused
//! member fails the whole artifact. Directories on the way to `dest` are created
//! without following links, and a copied file is written to a new temporary name
//! and renamed into place, so an entry in the way is replaced, never followed. A zip
//! archive is unpacked member by member by this module (the same way: directories
//! never through a link, files renamed into place, links checked again once all
//! are there); a tar archive by the `tar` crate after each member's check.
//!
//! Arguments (positional, internal to the agent):
//! `SANDBOX DEST KIND MODE MAX_BYTES SOURCE [SHA256]`: the sandbox directory, the
//! destination relative to it, `file`/`tar`/`tar.gz`/`tar.zst`/`zip`, the octal mode of a copied
//! file, the most bytes an archive may unpack to, the file to read (`-`: stdin) and,
//! when the source still needs verifying, its sha256. Exits 0 when done, else 1
//! with one line on stderr saying why.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_common::artifact::{relative_parts, Unpack};
use sha2::{Digest, Sha256};

use crate::artifacts::{check_member, resolves_inside, zip_member, Member, MemberKind};

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
    // Stdin is the cached file the agent opened: a file, so a zip can seek in it.
    let source = match &job.source {
        Some(path) => {
            fs::File::open(path).map_err(io_err(format!("cannot read {}", path.display())))?
        }
        None => io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map(fs::File::from)
            .map_err(io_err("cannot read stdin"))?,
    };
    let input = io::BufReader::with_capacity(256 * 1024, source);
    match job.kind {
        Unpack::File => {
            let (name, parents) = job
                .dest
                .split_last()
                .ok_or(UnpackError::Usage("DEST names no file"))?;
            let dir = make_dirs(&job.sandbox, parents)?;
            let written = write_file(
                &dir,
                name,
                input.take(job.max_bytes.saturating_add(1)),
                job.mode,
            )?;
            if written > job.max_bytes {
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
        Unpack::TarZst => {
            let zst = zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|e| UnpackError::Refused(format!("not a readable zstd stream: {e}")))?;
            unpack_tar(&job, zst)
        }
        Unpack::Zip => unpack_zip(&job, input),
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
/// over whatever is there. Returns the bytes written.
fn write_file(dir: &Path, name: &str, mut input: impl Read, mode: u32) -> Result<u64, UnpackError> {
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
    let written = io::copy(&mut input, &mut file).and_then(|n| {
        file.flush()?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        fs::rename(&tmp, &final_path)?;
        Ok(n)
    });
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(format!("cannot write {}", final_path.display()))(e)
    })
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
    check_links(&dest, &links)
}

/// Checks every symlink unpacked into `dest` (its components and target) again once
/// all are there: a link may point outside only through another one (`a -> .`,
/// `b -> a/..`). Removes the first one found pointing out and refuses the archive.
fn check_links(dest: &Path, links: &[(Vec<String>, String)]) -> Result<(), UnpackError> {
    let read_link = |p: &[String]| {
        fs::read_link(dest.join(p.join("/")))
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    };
    for (parts, target) in links {
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

/// The longest symlink target read from a zip member.
const MAX_LINK: u64 = 4096;

/// Unpacks the zip archive `input` into the destination directory, member by
/// member: each checked, then written without following a link.
fn unpack_zip(job: &Job, input: impl Read + io::Seek) -> Result<(), UnpackError> {
    let dest = make_dirs(&job.sandbox, &job.dest)?;
    let bad =
        |e: zip::result::ZipError| UnpackError::Refused(format!("not a readable zip archive: {e}"));
    let mut archive = zip::ZipArchive::new(input).map_err(bad)?;
    let mut total: u64 = 0;
    let mut links: Vec<(Vec<String>, String)> = Vec::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(bad)?;
        let path = String::from_utf8(entry.name_raw().to_vec()).map_err(|e| {
            UnpackError::Refused(format!(
                "member `{}` has a name that is not UTF-8",
                String::from_utf8_lossy(e.as_bytes()).escape_debug()
            ))
        })?;
        let unix = (entry.system() == zip::System::Unix && entry.external_attributes() >> 16 != 0)
            .then(|| entry.external_attributes() >> 16);
        let (kind, mode) = zip_member(path.ends_with('/'), unix);
        let member_err =
            |e: io::Error| UnpackError::Refused(format!("member `{}`: {e}", path.escape_debug()));
        let link = if kind == MemberKind::Symlink {
            let mut target = Vec::new();
            (&mut entry)
                .take(MAX_LINK)
                .read_to_end(&mut target)
                .map_err(member_err)?;
            Some(String::from_utf8(target).map_err(|_| {
                UnpackError::Refused(format!("member `{path}` links to a name that is not UTF-8"))
            })?)
        } else {
            None
        };
        let parts = check_member(&Member {
            path: &path,
            kind,
            link: link.as_deref(),
            mode,
        })
        .map_err(|e| UnpackError::Refused(e.to_string()))?;
        let Some((name, parents)) = parts.split_last() else {
            continue; // `./`: the directory itself
        };
        if kind == MemberKind::Dir {
            make_dirs(&dest, &parts)?;
            continue;
        }
        let dir = make_dirs(&dest, parents)?;
        if let Some(target) = link {
            let at = dir.join(name);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {
                    return Err(UnpackError::Refused(format!(
                        "member `{}` would replace a directory",
                        path.escape_debug()
                    )))
                }
                Ok(_) => fs::remove_file(&at).map_err(member_err)?,
                Err(_) => {}
            }
            std::os::unix::fs::symlink(&target, &at).map_err(member_err)?;
            links.push((parts, target));
            continue;
        }
        let left = job.max_bytes.saturating_sub(total);
        let written = write_file(
            &dir,
            name,
            (&mut entry).take(left.saturating_add(1)),
            mode & 0o777,
        )?;
        total = total.saturating_add(written);
        if total > job.max_bytes {
            let _ = fs::remove_file(dir.join(name));
            return Err(UnpackError::Refused(format!(
                "the archive unpacks to more than {} bytes (artifact_task_max_size)",
                job.max_bytes
            )));
        }
    }
    check_links(&dest, &links)
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

#[cfg(test)]
mod archive_tests {
    //! Zip and tar.zst archives unpacked by the helper's `main` into a temporary
    //! sandbox; hostile ones refused with nothing written beside the sandbox.

    use std::io::Write;

    use super::*;

    /// One zip member: name, external attributes' Unix mode, content.
    type ZipMember<'a> = (&'a str, u32, &'a [u8]);

    fn zip_of(members: &[ZipMember<'_>]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        for (name, mode, data) in members {
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated)
                .external_attributes(mode << 16);
            w.start_file(*name, opts).unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    /// Unpacks `archive` (as `kind`) into `<tmp>/sandbox/out`; returns the result and
    /// the temporary directory (its `canary` beside the sandbox).
    fn unpack(
        kind: &str,
        archive: &[u8],
        max: u64,
    ) -> (Result<(), UnpackError>, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("sandbox")).unwrap();
        fs::write(tmp.path().join("canary"), "canary").unwrap();
        let src = tmp.path().join("archive");
        fs::write(&src, archive).unwrap();
        let arg = |p: &Path| p.display().to_string();
        let args = [
            arg(&tmp.path().join("sandbox")),
            "out".to_string(),
            kind.to_string(),
            "644".to_string(),
            max.to_string(),
            arg(&src),
        ];
        (main(&args), tmp)
    }

    /// The names beside the sandbox (`archive`, `canary`, `sandbox` when untouched).
    fn beside(tmp: &tempfile::TempDir) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_zip_is_unpacked_with_its_modes_and_inner_links() {
        let archive = zip_of(&[
            ("app/", 0o040_755, b""),
            ("app/run.sh", 0o100_755, b"#!/bin/sh\necho ran\n"),
            ("app/data.txt", 0o644, b"hello hello hello hello"),
            ("app/current", 0o120_777, b"data.txt"),
            ("top.txt", 0, b"top"),
        ]);
        let (result, tmp) = unpack("zip", &archive, 1 << 20);
        result.unwrap();
        let out = tmp.path().join("sandbox/out");
        let mode = |p: &str| fs::metadata(out.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("app/run.sh"), 0o755);
        assert_eq!(mode("app/data.txt"), 0o644);
        assert_eq!(mode("top.txt"), 0o644);
        assert_eq!(
            fs::read_link(out.join("app/current")).unwrap(),
            Path::new("data.txt")
        );
        assert_eq!(
            fs::read_to_string(out.join("app/current")).unwrap(),
            "hello hello hello hello"
        );
    }

    #[test]
    fn hostile_zips_are_refused_and_write_nothing_outside() {
        let cases: [(&str, Vec<ZipMember<'_>>, &str); 8] = [
            ("slip", vec![("../../canary", 0o644, b"pwned")], ".."),
            (
                "absolute",
                vec![("/tmp/drover-zip-abs", 0o644, b"pwned")],
                "absolute",
            ),
            ("symlink", vec![("esc", 0o120_777, b"../..")], "outside"),
            (
                "link then write",
                vec![("esc", 0o120_777, b"/"), ("esc/canary", 0o644, b"pwned")],
                "outside",
            ),
            (
                "chain",
                vec![("a", 0o120_777, b"."), ("b", 0o120_777, b"a/../..")],
                "outside",
            ),
            ("device", vec![("null2", 0o020_666, b"")], "device"),
            ("fifo", vec![("fifo", 0o010_644, b"")], "device"),
            ("setuid", vec![("sh", 0o104_755, b"#!/bin/sh")], "setuid"),
        ];
        for (what, members, word) in cases {
            let (result, tmp) = unpack("zip", &zip_of(&members), 1 << 20);
            let e = result.expect_err(what).to_string();
            assert!(
                e.contains("unpack refused") && e.contains(word),
                "{what}: {e}"
            );
            assert_eq!(beside(&tmp), ["archive", "canary", "sandbox"], "{what}");
            assert_eq!(
                fs::read_to_string(tmp.path().join("canary")).unwrap(),
                "canary"
            );
        }
        assert!(!Path::new("/tmp/drover-zip-abs").exists());
        // A link out through an inner link: refused once all links are there.
        let (result, tmp) = unpack(
            "zip",
            &zip_of(&[("a", 0o120_777, b"."), ("sub/b", 0o120_777, b"../a/..")]),
            1 << 20,
        );
        let e = result.unwrap_err().to_string();
        assert!(e.contains("through another link"), "{e}");
        assert!(fs::symlink_metadata(tmp.path().join("sandbox/out/sub/b")).is_err());
    }

    #[test]
    fn a_zip_bomb_stops_at_the_size_limit() {
        let zeros = vec![0u8; 1 << 20];
        let (result, tmp) = unpack("zip", &zip_of(&[("zeros", 0o644, &zeros)]), 1000);
        let e = result.unwrap_err().to_string();
        assert!(e.contains("more than 1000 bytes"), "{e}");
        assert!(!tmp.path().join("sandbox/out/zeros").exists());
    }

    #[test]
    fn a_tar_zst_is_unpacked_and_a_hostile_one_refused() {
        let tar_of = |name: &str, data: &[u8]| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            h.set_cksum();
            b.append(&h, data).unwrap();
            zstd::stream::encode_all(&b.into_inner().unwrap()[..], 3).unwrap()
        };
        let (result, tmp) = unpack("tar.zst", &tar_of("bin/tool", b"tool"), 1 << 20);
        result.unwrap();
        assert_eq!(
            fs::read_to_string(tmp.path().join("sandbox/out/bin/tool")).unwrap(),
            "tool"
        );
        let (result, tmp) = unpack("tar.zst", &tar_of("../../canary", b"pwned"), 1 << 20);
        assert!(result.unwrap_err().to_string().contains(".."));
        assert_eq!(
            fs::read_to_string(tmp.path().join("canary")).unwrap(),
            "canary"
        );
        let (result, _tmp) = unpack("tar.zst", b"not zstd at all", 1 << 20);
        assert!(matches!(result, Err(UnpackError::Refused(_))), "{result:?}");
        let (result, _tmp) = unpack("zip", b"not a zip", 1 << 20);
        let e = result.unwrap_err().to_string();
        assert!(e.contains("not a readable zip archive"), "{e}");
    }
}
