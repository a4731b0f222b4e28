//! Artifacts on the host: the content-addressed cache `<data_dir>/artifacts/<sha256>`
//! (root's, 0700) and putting a task's artifacts into its sandbox before its executor
//! starts. A download goes to `<sha256>.part`: the bytes received are gathered into
//! 1 MiB pieces that a blocking thread hashes and writes while the next ones arrive
//! (never on the runtime's workers); the file is renamed to its name only when the
//! sum matches, so a file under its sum's name is verified
//! (files found at agent start are hashed again on first use). Concurrent tasks
//! wanting one sum wait for one download (a lock per sum). The cache is bounded by
//! `artifact_cache_size`: after a download the least recently used artifacts no
//! live task uses are deleted ([`crate::artifacts::evictions`]); a task holds its
//! [`Pins`] from its fetch until it ends, and a task re-adopted after an agent
//! restart pins its artifacts again ([`ArtifactCache::pin`]). While a task's
//! artifacts are fetched, its progress is reported every [`PROGRESS_EVERY`]
//! (`fetching 2 of 3 (14 MiB of 40 MiB)`, [`crate::artifacts::fetching`]).
//!
//! The task directory and `sandbox/` are made by root, `sandbox/` kept root's (0700)
//! until it is handed to the task user (chowned through a descriptor, as the
//! executor does). A cached archive is unpacked once into the cache's unpacked tree
//! for its sum and format ([`super::tree`], by the helper run as root into a
//! directory no task can reach) and, while `sandbox/` is still root's, put there as
//! hard links ([`tree::place`], no helper run); everything else (a single file, a
//! `file://` URL, a task running as root, anything after the sandbox was handed
//! over, a tree that cannot be linked) is written by `drover-agent unpack-artifact`
//! ([`crate::unpack`]) run as the task user on the handed-over sandbox, with the
//! cached file open on its stdin, or the `file://` path to read as that user.
//! Root never writes where a task can: the trees are root's, and a tree is placed
//! before any task can see the sandbox.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use drover_common::artifact::{self as rules, Scheme};
use drover_common::layout::{self, Layout};
use drover_common::state::{now_ms, ExitReason, TaskState};
use drover_common::wire::ExecutorTask;
use sha2::{Digest, Sha256};

use super::lock;
use super::tree::{self, PlaceError, Tree};
use crate::artifacts::{evictions, fetching, human, place_inline, shares_tree, tree_name, Cached};
use crate::config::ArtifactLimits;
use crate::host::Verdict;
use crate::metrics::METRICS;
use crate::unpack::{hex, sha256_of, PIECE, SUBCOMMAND};

/// Downloads tried per artifact before giving up (on connection errors, timeouts
/// and 5xx/408/429 answers; never on 4xx, a size or a checksum problem).
const ATTEMPTS: u32 = 3;
/// The wait before the second attempt; doubled before each next one.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Connecting to an artifact server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// No byte from the server for this long fails the attempt.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a download's progress is reported in the task's STARTING status.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Pieces received but not yet hashed and written, at most (each [`PIECE`]).
const PIECES_IN_FLIGHT: usize = 4;
/// The unpacked trees' directory in the cache.
const TREES: &str = "trees";
/// System CA bundles tried, first found wins.
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// One cached artifact.
#[derive(Debug)]
struct Entry {
    size: u64,
    /// Wall ms of its last use (its file's mtime at agent start).
    last_used: u64,
    /// Tasks being prepared with it.
    pins: u32,
    /// Hashed by this agent (downloaded, or checked since start).
    verified: bool,
    /// Its unpacked trees (their names), and what their files hold.
    trees: Vec<String>,
    tree_bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// One lock per sum: who holds it downloads or checks it, the others wait.
    locks: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// Downloads under way: bytes so far, and the size the server announced.
    downloading: HashMap<String, (u64, Option<u64>)>,
    /// The unpacked trees made since the agent started, by name.
    trees: HashMap<String, Arc<Tree>>,
}

/// The host's artifact cache and the client that fills it.
#[derive(Debug)]
pub(super) struct ArtifactCache {
    dir: PathBuf,
    limits: ArtifactLimits,
    client: reqwest::Client,
    /// `drover-agent`, run as `unpack-artifact`.
    helper: PathBuf,
    allow_root: bool,
    state: Mutex<State>,
    /// Numbers the staging directories of trees being unpacked.
    staged: AtomicU64,
}

/// Why a task's artifacts could not be put into its sandbox.
#[derive(Debug)]
pub(super) struct Failure {
    pub url: String,
    pub error: String,
}

impl Failure {
    /// The task's end: FAILED, `artifact_fetch_failed` (`sandbox_setup_failed` when
    /// the sandbox itself could not be made).
    pub fn verdict(self, task_id: &str) -> Verdict {
        if self.url.is_empty() {
            return Verdict::setup_failed(task_id, self.error);
        }
        let reason = ExitReason::ArtifactFetchFailed {
            url: self.url,
            error: self.error,
        };
        Verdict {
            task_id: task_id.to_string(),
            state: TaskState::Failed,
            message: reason.to_string(),
            reason,
        }
    }
}

/// The cached artifacts a task uses: not evicted until dropped.
#[derive(Debug)]
pub(super) struct Pins {
    cache: Arc<ArtifactCache>,
    shas: Vec<String>,
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut state = lock(&self.cache.state);
        for sha in &self.shas {
            if let Some(e) = state.entries.get_mut(sha) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }
}

/// One failed download attempt: whether another may help.
enum Attempt {
    Retry(String),
    Final(String),
}

/// An error with its causes, on one line (reqwest's own says little).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl ArtifactCache {
    /// Opens (creating) the cache in `dir`: removes unfinished downloads and indexes
    /// the artifacts there by their file's mtime.
    pub fn open(
        dir: PathBuf,
        limits: ArtifactLimits,
        tls_ca: Option<&Path>,
        executor: &Path,
        allow_root: bool,
    ) -> io::Result<ArtifactCache> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        // Unpacked trees are not kept across restarts (they cannot be checked
        // against a sum): the tasks using them keep their links.
        let trees = dir.join(TREES);
        match std::fs::remove_dir_all(&trees) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::DirBuilder::new().mode(0o700).create(&trees)?;
        let mut state = State::default();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == TREES {
                continue;
            }
            let meta = entry.metadata()?;
            if !rules::is_sha256(&name) || !meta.is_file() {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let last_used = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            state.entries.insert(
                name,
                Entry {
                    size: meta.len(),
                    last_used,
                    pins: 0,
                    verified: false,
                    trees: Vec::new(),
                    tree_bytes: 0,
                },
            );
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .user_agent(concat!("drover-agent/", env!("CARGO_PKG_VERSION")));
        let mut pems: Vec<Vec<u8>> = Vec::new();
        if let Some(ca) = tls_ca {
            pems.push(std::fs::read(ca)?);
        }
        if let Some(bundle) = SYSTEM_ROOTS.iter().find_map(|p| std::fs::read(p).ok()) {
            pems.push(bundle);
        }
        for pem in pems {
            // A bundle that does not parse leaves https to the other roots.
            for cert in reqwest::Certificate::from_pem_bundle(&pem).unwrap_or_default() {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(io::Error::other)?;
        // The helper is this binary when the agent runs as `drover-agent`, else
        // (the agent inside a test binary) the one beside the executor.
        let helper = std::env::current_exe()
            .ok()
            .filter(|p| p.file_name().is_some_and(|n| n == "drover-agent"))
            .unwrap_or_else(|| executor.with_file_name("drover-agent"));
        Ok(ArtifactCache {
            dir,
            limits,
            client,
            helper,
            allow_root,
            state: Mutex::new(state),
            staged: AtomicU64::new(0),
        })
    }

    fn path(&self, sha: &str) -> PathBuf {
        self.dir.join(sha)
    }

    /// Pins the cached artifacts of a task found running at agent start (its task
    /// file's http(s) artifacts that are still in the cache), so that no download
    /// evicts them while it lives.
    pub fn pin(self: &Arc<Self>, task: &ExecutorTask) -> Pins {
        let mut state = lock(&self.state);
        let shas = task
            .task
            .artifacts
            .iter()
            .filter_map(|a| a.sha256.as_deref().map(str::to_ascii_lowercase))
            .filter(|sha| match state.entries.get_mut(sha) {
                Some(e) => {
                    e.pins += 1;
                    true
                }
                None => false,
            })
            .collect();
        Pins {
            cache: self.clone(),
            shas,
        }
    }

    /// Puts every artifact of `task` into its new sandbox (creating the task
    /// directory and `sandbox/`), in order, telling `report` how far it got (a
    /// STARTING message). The pins keep the cached ones (and their unpacked trees)
    /// until the task ends.
    pub async fn prepare(
        self: &Arc<Self>,
        layout: &Layout,
        task: &ExecutorTask,
        report: &(dyn Fn(String) + Sync),
    ) -> Result<Pins, Failure> {
        let began = Instant::now();
        // Where the time went: fetching or finding in the cache, placing trees.
        let (mut fetch_us, mut place_us) = (0u128, 0u128);
        let mut pins = Pins {
            cache: self.clone(),
            shas: Vec::new(),
        };
        // No URL: a sandbox problem, not an artifact's.
        let setup = |error: String| Failure {
            url: String::new(),
            error,
        };
        let run_as = run_as(task, self.allow_root).map_err(setup)?;
        let (sandbox, sandbox_fd) = create_sandbox(layout, &task.task_id)
            .map_err(|e| setup(format!("cannot create the sandbox: {e}")))?;
        // `sandbox/` stays root's, out of every task's reach, until handed over:
        // before the first artifact the helper writes, or at the end.
        let mut handed_over = false;
        let give = |done: &mut bool| -> Result<(), Failure> {
            if !*done {
                hand_over(&sandbox_fd, run_as)
                    .map_err(|e| setup(format!("cannot hand the sandbox over: {e}")))?;
                *done = true;
            }
            Ok(())
        };
        let mut budget = self.limits.task_max_size;
        let count = task.task.artifacts.len();
        for (i, art) in task.task.artifacts.iter().enumerate() {
            let fail = |error: String| Failure {
                url: art.url.clone(),
                error,
            };
            tracing::info!(task_id = %task.task_id, url = %art.url, "fetching {} of {count}", i + 1);
            report(fetching(i + 1, count, None));
            let unpack = rules::unpack_of(art).map_err(|e| fail(e.to_string()))?;
            let dest = rules::dest_of(art, unpack).map_err(|e| fail(e.to_string()))?;
            let source = match rules::scheme(&art.url).map_err(|e| fail(e.to_string()))? {
                Scheme::Http => {
                    let sha = art
                        .sha256
                        .as_deref()
                        .map(str::to_ascii_lowercase)
                        .filter(|sha| rules::is_sha256(sha))
                        .ok_or_else(|| fail("no valid sha256 (required for http(s))".into()))?;
                    let fetch_began = Instant::now();
                    let fetched = self.fetch(&art.url, &sha, budget.min(self.limits.max_size));
                    tokio::pin!(fetched);
                    let start = tokio::time::Instant::now() + PROGRESS_EVERY;
                    let mut tick = tokio::time::interval_at(start, PROGRESS_EVERY);
                    let mut shown = None;
                    let size = loop {
                        tokio::select! {
                            size = &mut fetched => break size,
                            _ = tick.tick() => {
                                let now = lock(&self.state).downloading.get(&sha).copied();
                                if now.is_some() && now != shown {
                                    report(fetching(i + 1, count, now));
                                    shown = now;
                                }
                            }
                        }
                    }
                    .map_err(fail)?;
                    fetch_us += fetch_began.elapsed().as_micros();
                    pins.shas.push(sha.clone());
                    budget = budget.saturating_sub(size);
                    if let Some(owner) =
                        run_as.filter(|(uid, _)| shares_tree(unpack, Some(*uid), handed_over))
                    {
                        let place_began = Instant::now();
                        let tree = self.tree(&sha, unpack, budget).await.map_err(fail)?;
                        // A small tree is linked right here (a hand-off to a
                        // blocking thread costs a wake-up, milliseconds under load).
                        let placed = if place_inline(tree.nodes.len()) {
                            tree::place(&tree, &sandbox_fd, &dest, owner, budget)
                        } else {
                            let at = sandbox_fd.try_clone().map_err(|e| {
                                fail(format!("cannot place the unpacked tree: {e}"))
                            })?;
                            let parts = dest.clone();
                            tokio::task::spawn_blocking(move || {
                                tree::place(&tree, &at, &parts, owner, budget)
                            })
                            .await
                            .map_err(|e| fail(format!("cannot place the unpacked tree: {e}")))?
                        };
                        place_us += place_began.elapsed().as_micros();
                        match placed {
                            Ok(()) => continue,
                            Err(PlaceError::Refused(e)) => return Err(fail(e)),
                            Err(PlaceError::Io(e)) => tracing::warn!(
                                task_id = %task.task_id, url = %art.url, error = %e,
                                "cannot link the unpacked tree into the sandbox; copying"
                            ),
                        }
                    }
                    Source::Cached(self.path(&sha))
                }
                Scheme::File => Source::Path(
                    rules::file_path(&art.url)
                        .map(PathBuf::from)
                        .ok_or_else(|| fail("not an absolute file:// path".into()))?,
                ),
            };
            give(&mut handed_over)?;
            // A downloaded file was bounded as it came; an archive's members and a
            // file:// copy are bounded by what is left of the task's budget.
            let max_bytes = match (&source, unpack) {
                (Source::Cached(_), rules::Unpack::File) => u64::MAX - 1,
                _ => budget,
            };
            let sha = art.sha256.as_deref().map(str::to_ascii_lowercase);
            self.put(
                &sandbox,
                &dest.join("/"),
                unpack,
                rules::file_mode(art),
                max_bytes,
                source,
                sha.as_deref(),
                run_as,
            )
            .await
            .map_err(fail)?;
        }
        give(&mut handed_over)?;
        tracing::info!(
            task_id = %task.task_id,
            micros = began.elapsed().as_micros() as u64,
            fetch_micros = fetch_us as u64,
            tree_micros = place_us as u64,
            "artifacts in place"
        );
        Ok(pins)
    }

    /// The unpacked tree of the cached archive `sha` as `kind`, unpacked (at most
    /// `max_bytes`) and frozen when this agent has none yet; the caller holds a pin
    /// of `sha`, so that it is not evicted meanwhile.
    async fn tree(
        self: &Arc<Self>,
        sha: &str,
        kind: rules::Unpack,
        max_bytes: u64,
    ) -> Result<Arc<Tree>, String> {
        let name = tree_name(sha, kind);
        if let Some(t) = lock(&self.state).trees.get(&name) {
            return Ok(t.clone());
        }
        let gate = lock(&self.state)
            .locks
            .entry(name.clone())
            .or_default()
            .clone();
        let _held = gate.lock().await;
        let result = self.tree_locked(sha, kind, &name, max_bytes).await;
        let mut state = lock(&self.state);
        if Arc::strong_count(&gate) == 2 {
            state.locks.remove(&name);
        }
        result
    }

    /// [`Self::tree`] with the tree's lock held.
    async fn tree_locked(
        &self,
        sha: &str,
        kind: rules::Unpack,
        name: &str,
        max_bytes: u64,
    ) -> Result<Arc<Tree>, String> {
        if let Some(t) = lock(&self.state).trees.get(name) {
            return Ok(t.clone());
        }
        // `.staging-N/t`: the helper unpacks into `t`, in a directory of its own
        // (root's, 0700, like the cache around it), removed however this ends.
        let n = self.staged.fetch_add(1, Ordering::Relaxed);
        let staging = self.dir.join(TREES).join(format!(".staging-{n}"));
        struct Staged(PathBuf);
        impl Drop for Staged {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _ = std::fs::remove_dir_all(&staging);
        let guard = Staged(staging.clone());
        let unpacked = staging.join("t");
        let keep = |e: io::Error| format!("cannot keep the unpacked archive: {e}");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&unpacked)
            .map_err(keep)?;
        self.put(
            &unpacked,
            ".",
            kind,
            0o644,
            max_bytes,
            Source::Cached(self.path(sha)),
            None,
            None,
        )
        .await?;
        let to = self.dir.join(TREES).join(name);
        let tree = tokio::task::spawn_blocking(move || {
            let mut tree = tree::freeze(&unpacked)?;
            std::fs::rename(&unpacked, &to)?;
            tree.path = to;
            Ok::<_, io::Error>(tree)
        })
        .await
        .map_err(|e| keep(io::Error::other(e)))?
        .map_err(keep)?;
        drop(guard);
        let tree = Arc::new(tree);
        {
            let mut state = lock(&self.state);
            state.trees.insert(name.to_string(), tree.clone());
            if let Some(e) = state.entries.get_mut(sha) {
                e.tree_bytes = e.tree_bytes.saturating_add(tree.bytes);
                e.trees.push(name.to_string());
            }
        }
        tracing::info!(
            sha256 = sha,
            kind = kind.as_str(),
            bytes = tree.bytes,
            "archive unpacked into the cache"
        );
        self.evict();
        Ok(tree)
    }

    /// Makes the artifact `sha` (from `url`, at most `limit` bytes) present and
    /// verified in the cache, pinned once; returns its size.
    async fn fetch(self: &Arc<Self>, url: &str, sha: &str, limit: u64) -> Result<u64, String> {
        let gate = lock(&self.state)
            .locks
            .entry(sha.to_string())
            .or_default()
            .clone();
        let _held = gate.lock().await;
        let result = self.fetch_locked(url, sha, limit).await;
        // The last one through drops the lock (taking one clones under the same
        // mutex, so the count is exact here).
        let mut state = lock(&self.state);
        if Arc::strong_count(&gate) == 2 {
            state.locks.remove(sha);
        }
        result
    }

    /// [`Self::fetch`] with the sum's lock held.
    async fn fetch_locked(&self, url: &str, sha: &str, limit: u64) -> Result<u64, String> {
        // Pinned in the same breath as it is found, so that no other download's
        // eviction takes it from under this task.
        let known = lock(&self.state).entries.get_mut(sha).map(|e| {
            e.pins += 1;
            (e.size, e.verified)
        });
        if let Some((size, verified)) = known {
            // A mismatch deletes the entry, pin and all.
            let ok = verified || self.check(sha).await;
            if ok && size <= limit {
                METRICS.artifact_cache_hits.inc();
                self.touch(sha);
                return Ok(size);
            }
            if ok {
                self.unpin(sha);
                return Err(too_large(size, limit));
            }
        }
        METRICS.artifact_cache_misses.inc();
        let started = Instant::now();
        let downloaded = self.download(url, sha, limit).await;
        METRICS
            .artifact_fetch
            .observe(started.elapsed().as_secs_f64());
        let size = downloaded?;
        {
            let mut state = lock(&self.state);
            state.entries.insert(
                sha.to_string(),
                Entry {
                    size,
                    last_used: now_ms(),
                    pins: 1,
                    verified: true,
                    trees: Vec::new(),
                    tree_bytes: 0,
                },
            );
        }
        self.evict();
        Ok(size)
    }

    /// Hashes a cached file found at start; drops it when it does not match.
    async fn check(&self, sha: &str) -> bool {
        let path = self.path(sha);
        let sum =
            tokio::task::spawn_blocking(move || std::fs::File::open(&path).and_then(sha256_of))
                .await
                .ok()
                .and_then(Result::ok);
        let ok = sum.as_deref() == Some(sha);
        let mut state = lock(&self.state);
        if ok {
            if let Some(e) = state.entries.get_mut(sha) {
                e.verified = true;
            }
        } else {
            tracing::warn!(
                sha256 = sha,
                "cached artifact does not match its sum; fetching it again"
            );
            state.entries.remove(sha);
            let _ = std::fs::remove_file(self.path(sha));
        }
        ok
    }

    /// Stamps the use of `sha` (in memory and as its file's mtime).
    fn touch(&self, sha: &str) {
        if let Some(e) = lock(&self.state).entries.get_mut(sha) {
            e.last_used = now_ms();
        }
        let _ = std::fs::File::open(self.path(sha)).and_then(|f| f.set_modified(SystemTime::now()));
    }

    /// Takes back one pin of `sha`.
    fn unpin(&self, sha: &str) {
        if let Some(e) = lock(&self.state).entries.get_mut(sha) {
            e.pins = e.pins.saturating_sub(1);
        }
    }

    /// Deletes the least recently used unpinned artifacts over `artifact_cache_size`.
    fn evict(&self) {
        let mut state = lock(&self.state);
        let entries: Vec<Cached> = state
            .entries
            .iter()
            .map(|(sha, e)| Cached {
                sha256: sha.clone(),
                size: e.size.saturating_add(e.tree_bytes),
                last_used: e.last_used,
                in_use: e.pins > 0,
            })
            .collect();
        let mut gone = Vec::new();
        for sha in evictions(&entries, self.limits.cache_size, 0) {
            tracing::info!(sha256 = %sha, "evicting artifact from the cache");
            let trees = state
                .entries
                .remove(&sha)
                .map(|e| e.trees)
                .unwrap_or_default();
            if let Err(e) = std::fs::remove_file(self.path(&sha)) {
                tracing::warn!(sha256 = %sha, error = %e, "could not delete a cached artifact");
            }
            gone.extend(trees.iter().filter_map(|name| state.trees.remove(name)));
        }
        drop(state);
        // Outside the lock (a tree may be many files); a task that was given a
        // tree keeps its links to the files.
        for tree in gone {
            if let Err(e) = std::fs::remove_dir_all(&tree.path) {
                tracing::warn!(tree = %tree.path.display(), error = %e, "could not delete an unpacked tree");
            }
        }
    }

    /// Downloads `url` into the cache as `sha`, retrying what may pass.
    async fn download(&self, url: &str, sha: &str, limit: u64) -> Result<u64, String> {
        let part = self.dir.join(format!("{sha}.part"));
        let mut delay = FIRST_BACKOFF;
        let mut attempt = 1;
        // Progress is shown from the first byte to the download's end.
        struct Shown<'a>(&'a ArtifactCache, &'a str);
        impl Drop for Shown<'_> {
            fn drop(&mut self) {
                lock(&self.0.state).downloading.remove(self.1);
            }
        }
        let _shown = Shown(self, sha);
        loop {
            let result = self.download_once(url, sha, limit, &part).await;
            if result.is_err() {
                let _ = tokio::fs::remove_file(&part).await;
            }
            match result {
                Ok(n) => return Ok(n),
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::Retry(e)) if attempt >= ATTEMPTS => {
                    return Err(format!("{e} (after {ATTEMPTS} attempts)"))
                }
                Err(Attempt::Retry(e)) => {
                    tracing::warn!(url, attempt, error = %e, "artifact download failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
            }
        }
    }

    async fn download_once(
        &self,
        url: &str,
        sha: &str,
        limit: u64,
        part: &Path,
    ) -> Result<u64, Attempt> {
        let mut resp = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| Attempt::Retry(format!("request failed: {}", chain(&e))))?;
        let status = resp.status();
        if !status.is_success() {
            let msg = format!("HTTP {status}");
            let again = status.is_server_error() || matches!(status.as_u16(), 408 | 429);
            return Err(if again {
                Attempt::Retry(msg)
            } else {
                Attempt::Final(msg)
            });
        }
        if let Some(len) = resp.content_length().filter(|&len| len > limit) {
            return Err(Attempt::Final(too_large(len, limit)));
        }
        let io = |e: io::Error| Attempt::Final(format!("cannot write to the artifact cache: {e}"));
        // The bytes go in PIECE-sized buffers to a blocking thread that hashes and
        // writes them, while this task goes on receiving.
        // Written pieces come back emptied, to be filled again (a new 1 MiB buffer
        // costs its page faults).
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(PIECES_IN_FLIGHT);
        let (back_tx, mut back_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::task::spawn_blocking({
            let part = part.to_path_buf();
            move || store(&part, rx, &back_tx)
        });
        let total = resp.content_length();
        lock(&self.state)
            .downloading
            .insert(sha.to_string(), (0, total));
        let received = async {
            let mut n: u64 = 0;
            let mut piece = Vec::with_capacity(PIECE);
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| Attempt::Retry(format!("download broke off: {}", chain(&e))))?
            {
                n += chunk.len() as u64;
                if n > limit {
                    return Err(Attempt::Final(too_large(n, limit)));
                }
                METRICS.artifact_bytes_fetched.inc_by(chunk.len() as u64);
                if let Some(p) = lock(&self.state).downloading.get_mut(sha) {
                    p.0 = n;
                }
                piece.extend_from_slice(&chunk);
                if piece.len() >= PIECE {
                    let empty = back_rx
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(PIECE));
                    let full = std::mem::replace(&mut piece, empty);
                    if tx.send(full).await.is_err() {
                        // The writer stopped: its error is the one to report.
                        return Ok(n);
                    }
                }
            }
            if !piece.is_empty() {
                let _ = tx.send(piece).await;
            }
            Ok(n)
        }
        .await;
        // The writer finishes (and closes the file) before anything else happens
        // to it.
        drop(tx);
        let stored = writer
            .await
            .map_err(|e| io(io::Error::other(e)))
            .and_then(|r| r.map_err(io));
        let n = received?;
        let actual = stored?;
        if actual != sha {
            return Err(Attempt::Final(format!(
                "checksum mismatch: expected sha256 {sha}, got {actual}"
            )));
        }
        tokio::fs::rename(part, self.path(sha)).await.map_err(io)?;
        tracing::info!(
            url,
            sha256 = sha,
            bytes = n,
            "artifact fetched ({})",
            human(n)
        );
        Ok(n)
    }

    /// Runs the unpack helper for one artifact, as `run_as` (else as the agent):
    /// into `sandbox` at `dest`, a copied file with `mode`, an archive unpacking to
    /// at most `max_bytes`; a `file://` source checked against `sha` when given.
    #[allow(clippy::too_many_arguments)]
    async fn put(
        &self,
        sandbox: &Path,
        dest: &str,
        unpack: rules::Unpack,
        mode: u32,
        max_bytes: u64,
        source: Source,
        sha: Option<&str>,
        run_as: Option<(u32, u32)>,
    ) -> Result<(), String> {
        let mut cmd = tokio::process::Command::new(&self.helper);
        cmd.arg(SUBCOMMAND)
            .arg(sandbox)
            .arg(if dest.is_empty() { "." } else { dest })
            .arg(unpack.as_str())
            .arg(format!("{mode:o}"))
            .arg(max_bytes.to_string())
            .env_clear()
            .current_dir("/")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match source {
            Source::Cached(path) => {
                let file = std::fs::File::open(&path)
                    .map_err(|e| format!("cannot open the cached copy {}: {e}", path.display()))?;
                cmd.arg("-").stdin(Stdio::from(file));
            }
            Source::Path(path) => {
                cmd.arg(path).stdin(Stdio::null());
                if let Some(sha) = sha {
                    cmd.arg(sha);
                }
            }
        }
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd
            .output()
            .await
            .map_err(|e| format!("cannot run {} {SUBCOMMAND}: {e}", self.helper.display()))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let mut line: String = line.chars().take(500).collect();
        if line.is_empty() {
            line = format!("unpack helper failed ({})", out.status);
        }
        Err(line)
    }
}

/// Writes the pieces `rx` receives to a new `part` (no link followed), hashing
/// them on the way, and hands each back emptied on `back`; returns their sha256
/// once the sender is gone. Runs on a blocking thread.
fn store(
    part: &Path,
    mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    back: &tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
) -> io::Result<String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(part)?;
    let mut hasher = Sha256::new();
    while let Some(mut piece) = rx.blocking_recv() {
        hasher.update(&piece);
        file.write_all(&piece)?;
        piece.clear();
        let _ = back.send(piece);
    }
    Ok(hex(&hasher.finalize()))
}

/// Where the unpack helper reads an artifact.
enum Source {
    /// The verified cache file, opened by root and given as stdin.
    Cached(PathBuf),
    /// A `file://` path, opened by the helper as the task user.
    Path(PathBuf),
}

fn too_large(size: u64, limit: u64) -> String {
    format!(
        "too large: {size} bytes, over the limit of {limit} (artifact_max_size / artifact_task_max_size)"
    )
}

/// The uid and gid the helper runs as: the task user when the agent is root (as
/// the executor resolves it: `task.user`, else the role), else the agent's own.
fn run_as(task: &ExecutorTask, agent_allows_root: bool) -> Result<Option<(u32, u32)>, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let name = task.task.user.as_deref().unwrap_or(&task.role);
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| format!("cannot look up task user `{name}`: {e}"))?
        .ok_or_else(|| format!("task user `{name}` does not exist on this host"))?;
    if user.uid.is_root() && !(task.task.allow_root && agent_allows_root) {
        return Err(format!(
            "the task would run as root (user `{name}`); both task.allow_root and the agent's allow_root must allow that"
        ));
    }
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// Creates the task directory (root's, 0711) and in it `sandbox/` (0700, root's
/// until [`hand_over`]); returns its path and a descriptor opened without following
/// a link.
fn create_sandbox(layout: &Layout, task_id: &str) -> io::Result<(PathBuf, std::fs::File)> {
    crate::sandbox::create_task_dir(layout, task_id)?;
    let sandbox = layout.task(task_id).sandbox();
    std::fs::DirBuilder::new()
        .mode(layout::PRIVATE_DIR_MODE)
        .create(&sandbox)?;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&sandbox)?;
    dir.set_permissions(std::fs::Permissions::from_mode(layout::PRIVATE_DIR_MODE))?;
    Ok((sandbox, dir))
}

/// Hands `sandbox/` (its descriptor) to the task user: chowned, when the agent is
/// root.
fn hand_over(dir: &std::fs::File, run_as: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = run_as {
        nix::unistd::fchown(
            dir.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
    }
    Ok(())
}
