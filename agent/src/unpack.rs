//! `drover-agent unpack-artifact`: the short-lived helper that puts one artifact
//! into a sandbox. The agent runs it as the task user (never as root when the task
//! is not root), with the cached file on stdin or, for a `file://` URL, the path to
//! read (so a task can only read host files its user can); and as root to unpack a
//! cached archive into the cache's own tree (`runtime::tree`), a directory no task
//! can reach.
//!
//! Every archive member, tar or zip, goes through one [`Budget`]: its header checked
//! ([`crate::artifacts::check_member`]: no absolute path, no `..`, no link out, no
//! device, FIFO or socket, no setuid or setgid bit) and its size counted against
//! `MAX_BYTES`, before anything of it is written; a refused member fails the whole
//! artifact, and the symlinks are checked again once all are there. Directories on
//! the way are created without following links, and a file is written to a new
//! temporary name and renamed into place, so an entry in the way is replaced, never
//! followed.
//!
//! How a file's bytes get there: when the source is a regular file (the cached copy,
//! or a `file://` path), a plain file and the members of an uncompressed tar are
//! copied by the kernel with `copy_file_range(2)` from their offsets in the source
//! (a tar member's offset comes from its header; falling back to `pread` and `write`
//! in 1 MiB pieces where the file systems refuse it); members of a compressed tar
//! and of a zip are decompressed and written in 1 MiB pieces. Directories, links
//! and hard links of a tar are made by the `tar` crate (`unpack_in`), those of a zip
//! by this module.
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
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use drover_common::artifact::{relative_parts, Unpack};
use nix::errno::Errno;
use sha2::{Digest, Sha256};

use crate::artifacts::{check_member, resolves_inside, zip_member, Member, MemberKind};

/// The subcommand's name (`drover-agent unpack-artifact ...`).
pub const SUBCOMMAND: &str = "unpack-artifact";

/// The size of the pieces read and written when a copy goes through memory
/// (hashing, decompressing, the `pread` fallback).
pub const PIECE: usize = 1 << 20;

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
    // Stdin is the cached file the agent opened: a file, so a zip can seek in it
    // and a plain tar's members be copied from their offsets.
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
    // Anything else (a pipe) is read as a stream.
    let regular = source.metadata().is_ok_and(|m| m.is_file());
    let mut buf = Vec::new();
    let stream = |source| io::BufReader::with_capacity(PIECE, source);
    match job.kind {
        Unpack::File => {
            let (name, parents) = job
                .dest
                .split_last()
                .ok_or(UnpackError::Usage("DEST names no file"))?;
            let dir = make_dirs(&job.sandbox, parents)?;
            let limit = job.max_bytes.saturating_add(1);
            let data = if regular {
                Data::Range {
                    src: &source,
                    offset: 0,
                    len: limit,
                }
            } else {
                Data::Stream(Box::new((&source).take(limit)), &mut buf)
            };
            let written = write_file(&dir, name, job.mode, data)?;
            if written > job.max_bytes {
                let _ = fs::remove_file(dir.join(name));
                return Err(UnpackError::Refused(format!(
                    "the file is over {} bytes (artifact_task_max_size)",
                    job.max_bytes
                )));
            }
            Ok(())
        }
        Unpack::Tar if regular => {
            let mut archive = tar_archive(&source);
            unpack_tar(&job, archive.entries_with_seek(), Some(&source), &mut buf)
        }
        Unpack::Tar => unpack_tar(&job, tar_archive(stream(source)).entries(), None, &mut buf),
        Unpack::TarGz => {
            let mut archive = tar_archive(flate2::read::GzDecoder::new(stream(source)));
            unpack_tar(&job, archive.entries(), None, &mut buf)
        }
        Unpack::TarZst => {
            let zst = zstd::stream::read::Decoder::with_buffer(stream(source))
                .map_err(|e| UnpackError::Refused(format!("not a readable zstd stream: {e}")))?;
            unpack_tar(&job, tar_archive(zst).entries(), None, &mut buf)
        }
        Unpack::Zip => unpack_zip(&job, stream(source), &mut buf),
    }
}

/// The sha256 (hex) of everything `r` reads, read in [`PIECE`]s.
pub fn sha256_of(mut r: impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; PIECE];
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

/// Where a written file's bytes come from.
enum Data<'a> {
    /// Read to its end, written in pieces of the buffer's size (grown to [`PIECE`]).
    Stream(Box<dyn Read + 'a>, &'a mut Vec<u8>),
    /// At most `len` bytes of `src` from `offset` (fewer at its end), copied by the
    /// kernel.
    Range {
        src: &'a fs::File,
        offset: u64,
        len: u64,
    },
}

/// Writes `data` to `dir/name` with `mode`: through a new temporary file renamed
/// over whatever is there. Returns the bytes written.
fn write_file(dir: &Path, name: &str, mode: u32, data: Data<'_>) -> Result<u64, UnpackError> {
    let final_path = dir.join(name);
    let tmp = dir.join(format!(".{name}.drover-part"));
    let _ = fs::remove_file(&tmp);
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io_err(format!("cannot create {}", tmp.display())))?;
    let copied = match data {
        Data::Stream(input, buf) => copy_pieces(input, &file, buf),
        Data::Range { src, offset, len } => copy_range(src, offset, len, &file),
    };
    let written = copied.and_then(|n| {
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        fs::rename(&tmp, &final_path)?;
        Ok(n)
    });
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(format!("cannot write {}", final_path.display()))(e)
    })
}

/// Copies all of `input` to `out`, filling `buf` (grown to [`PIECE`]) before each
/// write.
fn copy_pieces(mut input: impl Read, mut out: &fs::File, buf: &mut Vec<u8>) -> io::Result<u64> {
    buf.resize(PIECE, 0);
    let mut total = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if filled == 0 {
            return Ok(total);
        }
        out.write_all(&buf[..filled])?;
        total += filled as u64;
    }
}

/// Copies at most `len` bytes of `src` from `offset` to `out` (at its position):
/// `copy_file_range(2)`, or `pread` and `write` in [`PIECE`]s when the kernel or the
/// file systems do not support it between these two files. Stops early at the end
/// of `src`; returns the bytes copied.
fn copy_range(src: &fs::File, offset: u64, len: u64, out: &fs::File) -> io::Result<u64> {
    let mut off_in = i64::try_from(offset).map_err(io::Error::other)?;
    let mut done = 0u64;
    while done < len {
        // The kernel copies at most about 2 GiB per call anyway.
        let want = (len - done).min(1 << 30) as usize;
        match nix::fcntl::copy_file_range(src, Some(&mut off_in), out, None, want) {
            Ok(0) => break,
            Ok(n) => done += n as u64,
            Err(Errno::EINTR) => {}
            Err(
                Errno::EXDEV | Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EPERM,
            ) if done == 0 => return copy_pread(src, offset, len, out),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// [`copy_range`] through memory.
fn copy_pread(src: &fs::File, offset: u64, len: u64, mut out: &fs::File) -> io::Result<u64> {
    let mut buf = vec![0u8; PIECE.min(usize::try_from(len).unwrap_or(PIECE))];
    let mut done = 0u64;
    while done < len {
        let want = buf
            .len()
            .min(usize::try_from(len - done).unwrap_or(usize::MAX));
        let n = match src.read_at(&mut buf[..want], offset + done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..n])?;
        done += n as u64;
    }
    Ok(done)
}

/// The members admitted so far, for any archive format: each one's header checked
/// and its size counted before anything of it is written.
struct Budget {
    max_bytes: u64,
    total: u64,
    /// Every symlink admitted, checked again once all are there.
    links: Vec<(Vec<String>, String)>,
}

impl Budget {
    fn new(max_bytes: u64) -> Budget {
        Budget {
            max_bytes,
            total: 0,
            links: Vec::new(),
        }
    }

    /// Checks the member `path` (its `kind`, `link` target and `mode`; `size`
    /// bytes unpacked) and returns its path components below the unpack directory;
    /// refuses it, or the archive once it unpacks to more than `MAX_BYTES`.
    fn admit(
        &mut self,
        path: &str,
        kind: MemberKind,
        link: Option<&str>,
        mode: u32,
        size: u64,
    ) -> Result<Vec<String>, UnpackError> {
        let m = Member {
            path,
            kind,
            link,
            mode,
        };
        let parts = check_member(&m).map_err(|e| UnpackError::Refused(e.to_string()))?;
        self.total = self.total.saturating_add(size);
        if self.total > self.max_bytes {
            return Err(UnpackError::Refused(format!(
                "the archive unpacks to more than {} bytes (artifact_task_max_size)",
                self.max_bytes
            )));
        }
        if let (MemberKind::Symlink, Some(target)) = (kind, link) {
            self.links.push((parts.clone(), target.to_string()));
        }
        Ok(parts)
    }

    /// Once every member is unpacked into `dest`: checks the symlinks again.
    fn finish(&self, dest: &Path) -> Result<(), UnpackError> {
        check_links(dest, &self.links)
    }
}

/// A tar archive read as the helper wants: no owners, modes or xattrs kept.
fn tar_archive<R: Read>(input: R) -> tar::Archive<R> {
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    archive
}

/// A member `path` whose bytes are not `expected` long.
fn wrong_size(path: &str, written: u64, expected: u64) -> UnpackError {
    UnpackError::Refused(format!(
        "member `{}` has {written} bytes, its header says {expected}",
        path.escape_debug()
    ))
}

/// Unpacks the tar `entries` into the destination directory, member by member:
/// files written by [`write_file`] (from `raw`, the uncompressed archive itself,
/// at their offsets when given), the rest by the `tar` crate.
fn unpack_tar<R: Read>(
    job: &Job,
    entries: io::Result<tar::Entries<'_, R>>,
    raw: Option<&fs::File>,
    buf: &mut Vec<u8>,
) -> Result<(), UnpackError> {
    let dest = make_dirs(&job.sandbox, &job.dest)?;
    let bad = |e: io::Error| UnpackError::Refused(format!("not a readable tar archive: {e}"));
    let mut budget = Budget::new(job.max_bytes);
    for entry in entries.map_err(bad)? {
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
        let size = entry.size();
        let parts = budget.admit(&path, kind, link.as_deref(), mode, size)?;
        if kind == MemberKind::File {
            let Some((name, parents)) = parts.split_last() else {
                continue; // refused by the check: a file has a name
            };
            let dir = make_dirs(&dest, parents)?;
            let data = match raw {
                Some(src) => Data::Range {
                    src,
                    offset: entry.raw_file_position(),
                    len: size,
                },
                None => Data::Stream(Box::new(&mut entry), &mut *buf),
            };
            let written = write_file(&dir, name, mode & 0o777, data)?;
            if written != size {
                let _ = fs::remove_file(dir.join(name));
                return Err(wrong_size(&path, written, size));
            }
            continue;
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
    budget.finish(&dest)
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
/// member: each admitted by the [`Budget`] with its declared size, then written
/// without following a link (and refused if it unpacks to more than it declared).
fn unpack_zip(
    job: &Job,
    input: impl Read + io::Seek,
    buf: &mut Vec<u8>,
) -> Result<(), UnpackError> {
    let dest = make_dirs(&job.sandbox, &job.dest)?;
    let bad =
        |e: zip::result::ZipError| UnpackError::Refused(format!("not a readable zip archive: {e}"));
    let mut archive = zip::ZipArchive::new(input).map_err(bad)?;
    let mut budget = Budget::new(job.max_bytes);
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
        let size = entry.size();
        let parts = budget.admit(&path, kind, link.as_deref(), mode, size)?;
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
            continue;
        }
        let data = Data::Stream(
            Box::new((&mut entry).take(size.saturating_add(1))),
            &mut *buf,
        );
        let written = write_file(&dir, name, mode & 0o777, data)?;
        if written > size {
            let _ = fs::remove_file(dir.join(name));
            return Err(wrong_size(&path, written, size));
        }
    }
    budget.finish(&dest)
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
    fn a_plain_tar_is_copied_from_its_offsets() {
        // A long name (GNU long-name entry before the header), a directory, an
        // inner link, an empty file and files of odd sizes after each other.
        let long = format!("deep/{}/f.bin", "d".repeat(120));
        let big: Vec<u8> = (0..(3 * PIECE + 777)).map(|i| (i % 251) as u8).collect();
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8], mode: u32| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            b.append_data(&mut h, path, data).unwrap();
        };
        add("a.txt", b"alpha", 0o644);
        add(&long, &big, 0o755);
        add("empty", b"", 0o600);
        add("b.txt", b"beta beta", 0o640);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "link", "a.txt").unwrap();
        let archive = b.into_inner().unwrap();
        let (result, tmp) = unpack("tar", &archive, 1 << 30);
        result.unwrap();
        let out = tmp.path().join("sandbox/out");
        assert_eq!(fs::read(out.join(&long)).unwrap(), big);
        assert_eq!(fs::read(out.join("a.txt")).unwrap(), b"alpha");
        assert_eq!(fs::read(out.join("b.txt")).unwrap(), b"beta beta");
        assert_eq!(fs::read(out.join("empty")).unwrap(), b"");
        assert_eq!(fs::read(out.join("link")).unwrap(), b"alpha");
        let mode = |p: &str| fs::metadata(out.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&long), 0o755);
        assert_eq!(mode("b.txt"), 0o640);
        // The budget counts the members' sizes before writing them.
        let (result, tmp) = unpack("tar", &archive, 100);
        let e = result.unwrap_err().to_string();
        assert!(e.contains("more than 100 bytes"), "{e}");
        assert!(!tmp.path().join("sandbox/out").join(&long).exists());
        // A tar cut short in a member's data is refused, the member not left there.
        // (`a.txt` and the long name's entry take 2048 bytes, then its header.)
        let cut = &archive[..2048 + 512 + PIECE];
        let (result, tmp) = unpack("tar", cut, 1 << 30);
        let e = result.unwrap_err().to_string();
        assert!(e.contains("its header says"), "{e}");
        assert!(!tmp.path().join("sandbox/out").join(&long).exists());
    }

    #[test]
    fn the_pread_fallback_copies_the_same_range() {
        let tmp = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(PIECE + 4096)).map(|i| (i % 253) as u8).collect();
        fs::write(tmp.path().join("src"), &data).unwrap();
        let src = fs::File::open(tmp.path().join("src")).unwrap();
        for (offset, len) in [(0u64, data.len() as u64), (10, 2 * PIECE as u64), (7, 100)] {
            let out = fs::File::create(tmp.path().join("out")).unwrap();
            let n = copy_pread(&src, offset, len, &out).unwrap();
            let end = (offset + len).min(data.len() as u64) as usize;
            assert_eq!(n as usize, end - offset as usize);
            assert_eq!(
                fs::read(tmp.path().join("out")).unwrap(),
                &data[offset as usize..end]
            );
        }
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
