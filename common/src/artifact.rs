//! `task.artifacts`: files a task names by URL (and checksum) that the agent puts
//! into its sandbox before the first process starts. The model lives in
//! [`crate::spec`]; here are the pure rules both the validator and the agent apply:
//! which URLs are accepted, what `extract: auto` means for a URL, where in the
//! sandbox an artifact lands and which modes are allowed.

use crate::spec::{Artifact, Extract};

/// How an artifact is put into the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unpack {
    /// Copied as one file to `dest`.
    File,
    /// A tar archive unpacked into the directory `dest`.
    Tar,
    /// A gzip-compressed tar archive unpacked into the directory `dest`.
    TarGz,
    /// A zstd-compressed tar archive unpacked into the directory `dest`.
    TarZst,
    /// A zip archive unpacked into the directory `dest`.
    Zip,
}

impl Unpack {
    /// The name the agent's unpack helper takes (`--kind`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Unpack::File => "file",
            Unpack::Tar => "tar",
            Unpack::TarGz => "tar.gz",
            Unpack::TarZst => "tar.zst",
            Unpack::Zip => "zip",
        }
    }

    /// The inverse of [`Unpack::as_str`].
    pub fn parse(s: &str) -> Option<Unpack> {
        match s {
            "file" => Some(Unpack::File),
            "tar" => Some(Unpack::Tar),
            "tar.gz" => Some(Unpack::TarGz),
            "tar.zst" => Some(Unpack::TarZst),
            "zip" => Some(Unpack::Zip),
            _ => None,
        }
    }
}

/// Where an artifact comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    File,
}

/// An artifact that cannot be used, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    #[error("`{0}` is not an http://, https:// or file:// URL; write e.g. https://example.com/app.tar.gz or file:///opt/pkg/app.tar")]
    Scheme(String),
    #[error("a file:// URL needs an absolute path (file:///opt/app.tar)")]
    FilePath,
    #[error("is an archive format Drover cannot unpack (tar.bz2, tar.xz); repackage it as .tar, .tar.gz, .tar.zst or .zip, or set extract: none to copy it as one file")]
    UnsupportedArchive,
    #[error("`{0}` is not a relative path inside the sandbox; use a path without a leading `/` and without `..`, e.g. app or bin/tool")]
    Dest(String),
    #[error("the URL ends in `/` and names no file; set dest to the file name to write")]
    NoFileName,
}

/// The scheme of `url`.
pub fn scheme(url: &str) -> Result<Scheme, ArtifactError> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        if url.len() <= lower.find("//").map_or(0, |i| i + 2) {
            return Err(ArtifactError::Scheme(url.to_string()));
        }
        Ok(Scheme::Http)
    } else if lower.starts_with("file://") {
        if !url["file://".len()..].starts_with('/') {
            return Err(ArtifactError::FilePath);
        }
        Ok(Scheme::File)
    } else {
        Err(ArtifactError::Scheme(url.to_string()))
    }
}

/// The path of a `file://` URL (percent-escapes are not decoded).
pub fn file_path(url: &str) -> Option<&str> {
    url.get("file://".len()..).filter(|p| p.starts_with('/'))
}

/// The last path segment of `url`, without query or fragment.
pub fn file_name(url: &str) -> Option<&str> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let after_scheme = path.find("://").map_or(path, |i| &path[i + 3..]);
    let (_, rest) = after_scheme.split_once('/')?;
    let name = rest.rsplit('/').next()?;
    (!name.is_empty()).then_some(name)
}

/// How `artifact` is put into the sandbox: `extract: none` copies it; `auto` unpacks
/// `.tar`, `.tar.gz`/`.tgz`, `.tar.zst`/`.tzst` and `.zip`, and refuses the archive
/// formats it cannot unpack (`.tar.bz2`, `.tar.xz`).
pub fn unpack_of(artifact: &Artifact) -> Result<Unpack, ArtifactError> {
    if artifact.extract == Extract::None {
        return Ok(Unpack::File);
    }
    let name = file_name(&artifact.url).unwrap_or("").to_ascii_lowercase();
    if name.ends_with(".tar") {
        Ok(Unpack::Tar)
    } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        Ok(Unpack::TarGz)
    } else if name.ends_with(".tar.zst") || name.ends_with(".tzst") {
        Ok(Unpack::TarZst)
    } else if name.ends_with(".zip") {
        Ok(Unpack::Zip)
    } else if [".tar.bz2", ".tbz2", ".tar.xz", ".txz"]
        .iter()
        .any(|s| name.ends_with(s))
    {
        Err(ArtifactError::UnsupportedArchive)
    } else {
        Ok(Unpack::File)
    }
}

/// The checked relative path in the sandbox: `dest`, else the URL's file name for a
/// file and `.` (the sandbox itself) for an archive. Components are normalized (`.`
/// and empty ones dropped); an empty result is the sandbox itself.
pub fn dest_of(artifact: &Artifact, unpack: Unpack) -> Result<Vec<String>, ArtifactError> {
    let dest = match (&artifact.dest, unpack) {
        (Some(d), _) => d.as_str(),
        (None, Unpack::File) => file_name(&artifact.url).ok_or(ArtifactError::NoFileName)?,
        (None, _) => ".",
    };
    let parts = relative_parts(dest).ok_or_else(|| ArtifactError::Dest(dest.to_string()))?;
    if unpack == Unpack::File && parts.is_empty() {
        return Err(ArtifactError::Dest(dest.to_string()));
    }
    Ok(parts)
}

/// The components of a relative path that stays inside its base: no leading `/`, no
/// `..`, no NUL; `.` and empty components dropped. None when it would leave the base.
pub fn relative_parts(path: &str) -> Option<Vec<String>> {
    if path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => parts.push(c.to_string()),
        }
    }
    Some(parts)
}

/// The permission bits of `mode` (octal, e.g. `0755`): at most 0777 (no setuid,
/// setgid or sticky bits). None when it is not that.
pub fn parse_mode(mode: &str) -> Option<u32> {
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    if digits.is_empty() || digits.len() > 4 {
        return None;
    }
    u32::from_str_radix(digits, 8).ok().filter(|m| *m <= 0o777)
}

/// The mode a file artifact gets: `mode` (default 0644), plus the execute bits
/// where read is allowed when `executable`.
pub fn file_mode(artifact: &Artifact) -> u32 {
    let base = artifact
        .mode
        .as_deref()
        .and_then(parse_mode)
        .unwrap_or(0o644);
    if artifact.executable {
        base | ((base & 0o444) >> 2)
    } else {
        base
    }
}

/// Whether `s` is a sha256 in hex (64 digits).
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn art(url: &str) -> Artifact {
        Artifact {
            url: url.into(),
            sha256: None,
            dest: None,
            extract: Extract::Auto,
            mode: None,
            executable: false,
        }
    }

    #[test]
    fn schemes_are_http_https_and_absolute_file_urls() {
        assert_eq!(scheme("https://x/a.tar"), Ok(Scheme::Http));
        assert_eq!(scheme("HTTP://x/a"), Ok(Scheme::Http));
        assert_eq!(scheme("file:///opt/a"), Ok(Scheme::File));
        assert_eq!(scheme("file://opt/a"), Err(ArtifactError::FilePath));
        assert!(scheme("ftp://x/a").is_err());
        assert!(scheme("https://").is_err());
    }

    #[test]
    fn auto_extract_follows_the_file_name() {
        assert_eq!(unpack_of(&art("https://h/a.tar?x=1")), Ok(Unpack::Tar));
        assert_eq!(unpack_of(&art("https://h/a.TGZ")), Ok(Unpack::TarGz));
        assert_eq!(unpack_of(&art("https://h/a.tar.gz")), Ok(Unpack::TarGz));
        assert_eq!(unpack_of(&art("https://h/a.bin")), Ok(Unpack::File));
        assert_eq!(unpack_of(&art("https://h/a.tar.zst")), Ok(Unpack::TarZst));
        assert_eq!(unpack_of(&art("https://h/a.tzst")), Ok(Unpack::TarZst));
        assert_eq!(unpack_of(&art("https://h/a.Zip#x")), Ok(Unpack::Zip));
        assert_eq!(
            unpack_of(&art("https://h/a.tar.xz")),
            Err(ArtifactError::UnsupportedArchive)
        );
        for u in [
            Unpack::File,
            Unpack::Tar,
            Unpack::TarGz,
            Unpack::TarZst,
            Unpack::Zip,
        ] {
            assert_eq!(Unpack::parse(u.as_str()), Some(u));
        }
        let mut none = art("https://h/a.zip");
        none.extract = Extract::None;
        assert_eq!(unpack_of(&none), Ok(Unpack::File));
    }

    #[test]
    fn dest_stays_inside_the_sandbox() {
        let mut a = art("https://h/dir/tool");
        assert_eq!(dest_of(&a, Unpack::File), Ok(vec!["tool".to_string()]));
        assert_eq!(dest_of(&a, Unpack::Tar), Ok(vec![]));
        a.dest = Some("./bin//tool".into());
        assert_eq!(
            dest_of(&a, Unpack::File),
            Ok(vec!["bin".to_string(), "tool".to_string()])
        );
        for bad in ["/etc/passwd", "../x", "a/../../x", "."] {
            a.dest = Some(bad.into());
            assert!(dest_of(&a, Unpack::File).is_err(), "{bad}");
        }
        assert_eq!(
            dest_of(&art("https://h/dir/"), Unpack::File),
            Err(ArtifactError::NoFileName)
        );
    }

    #[test]
    fn modes_are_permission_bits_only() {
        assert_eq!(parse_mode("0755"), Some(0o755));
        assert_eq!(parse_mode("640"), Some(0o640));
        assert_eq!(parse_mode("4755"), None);
        assert_eq!(parse_mode("rwx"), None);
        let mut a = art("https://h/t");
        a.executable = true;
        assert_eq!(file_mode(&a), 0o755);
        a.mode = Some("0600".into());
        assert_eq!(file_mode(&a), 0o700);
    }
}
