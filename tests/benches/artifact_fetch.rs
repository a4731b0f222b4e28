//! Artifacts (issue 29 asks: a cached 10 MiB tarball adds < 5 ms to a task's start;
//! a cold fetch of 100 MiB from a local server at >= 80 % of `curl`'s speed).
//!
//! 1. Cached unpack: `drover-agent unpack-artifact`, run as the agent runs it (as
//!    `www-data` when the bench is root, the cached file on stdin) into a new
//!    sandbox directory, wall time from spawn to exit, for a 10 MiB plain tar (one
//!    8 MiB file and 32 of 64 KiB, incompressible bytes) and the same tar gzipped;
//!    beside it the floor of any helper run: the same binary refusing too few
//!    arguments (exec, dynamic loading, exit). With `BENCH_OLD_AGENT=PATH` another
//!    `drover-agent` (an older build) runs the same, alternating with this one run by
//!    run. `BENCH_RUNS` runs each (default 40).
//!    Beside them, in the same rounds, what a cache hit costs this build: the
//!    archive's unpacked tree (made once by this build's helper, run as the agent
//!    runs it for the cache, and frozen with `drover_agent::runtime::tree::freeze`)
//!    placed into a new root-owned sandbox by `tree::place` and the sandbox chowned
//!    to the task user (what the agent does on a hit, in its own process).
//! 2. Cold fetch: a one-agent cluster fetching a 100 MiB file artifact
//!    (`BENCH_FETCH_MIB`) from a local HTTP/1.1 server in this process (a new
//!    content, so a new sum, every run: always a cache miss); the agent's own fetch
//!    time (the `artifact_fetch_seconds` sum of its `/metrics`, which covers the
//!    download with hashing and writing to the cache), alternating with
//!    `curl -s -o FILE` of the same URL (wall time, its process start included).
//!    `BENCH_FETCH_RUNS` runs each (default 5; 0 skips this part).
//! 3. Start (`BENCH_START_RUNS`, default 0: off; as root): a one-agent cluster of
//!    the `DROVER_BIN_DIR` build starting one `sleep` task with the 10 MiB tar as an
//!    artifact, with it gzipped, and with none, round by round in that order after
//!    one warm-up round that fills the cache: each task's ASSIGNED -> RUNNING from
//!    its events (the master's and the executor's stamps, in ms), and what the
//!    artifact adds (median with it minus median without); and the agent's own
//!    time putting the artifacts in place (its `artifacts in place` log line, from
//!    the sandbox's creation to its handing over, in µs).
//!
//! Prints median, minimum and maximum of each. Not run in CI:
//! `DROVER_BIN_DIR=$PWD/target/release cargo bench -p drover-tests --bench
//! artifact_fetch` (as root; without `DROVER_BIN_DIR`, the debug binaries).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use drover_common::state::TaskState;
use drover_tests::{command_job, Cluster, ClusterConfig};
use sha2::{Digest, Sha256};

/// Median, minimum and maximum of `ms`, as one line.
fn summary(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    format!(
        "median {:.2}, min {:.2}, max {:.2} ({} runs)",
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    )
}

/// `n` bytes that do not compress (xorshift), different for each `seed`.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The 10 MiB tar: `app/big.bin` (8 MiB) and `app/lib/NN.so` (32 × 64 KiB).
fn ten_mib_tar() -> anyhow::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        b.append_data(&mut h, path, data)
    };
    add("app/big.bin", &noise(8 << 20, 1))?;
    for i in 0..32 {
        add(&format!("app/lib/{i:02}.so"), &noise(64 << 10, 100 + i))?;
    }
    Ok(b.into_inner()?)
}

/// Who the helper runs as: `www-data` when this is root (as the agent runs it for
/// a task), else this user.
fn task_user() -> anyhow::Result<Option<(u32, u32)>> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("www-data")?.context("no user www-data")?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// Runs `agent unpack-artifact` on `archive` (`kind`) into a new sandbox below
/// `dir`; returns the wall ms.
fn unpack_once(
    agent: &Path,
    dir: &Path,
    archive: &Path,
    kind: &str,
    user: Option<(u32, u32)>,
) -> anyhow::Result<f64> {
    let sandbox = dir.join("sandbox");
    if sandbox.exists() {
        std::fs::remove_dir_all(&sandbox)?;
    }
    std::fs::create_dir(&sandbox)?;
    let mut cmd = Command::new(agent);
    cmd.args(["unpack-artifact"])
        .arg(&sandbox)
        .args([".", kind, "644", "1073741824", "-"])
        .stdin(std::fs::File::open(archive)?)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_clear();
    if let Some((uid, gid)) = user {
        nix::unistd::chown(
            &sandbox,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    let start = Instant::now();
    let out = cmd.output()?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        out.status.success(),
        "{} unpack-artifact {kind}: {}",
        agent.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        std::fs::metadata(sandbox.join("app/big.bin"))?.len() == 8 << 20,
        "app/big.bin not unpacked"
    );
    Ok(ms)
}

/// Unpacks `archive` (`kind`) with `agent unpack-artifact` as this user into
/// `dir/t` and freezes it, as the agent makes a cache's unpacked tree.
fn make_tree(
    agent: &Path,
    dir: &Path,
    archive: &Path,
    kind: &str,
) -> anyhow::Result<drover_agent::runtime::tree::Tree> {
    let t = dir.join("t");
    std::fs::create_dir_all(&t)?;
    let out = Command::new(agent)
        .arg("unpack-artifact")
        .arg(&t)
        .args([".", kind, "644", "1073741824", "-"])
        .stdin(std::fs::File::open(archive)?)
        .stderr(Stdio::piped())
        .env_clear()
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(drover_agent::runtime::tree::freeze(&t)?)
}

/// Places `tree` into a new sandbox below `dir` (root's until chowned to `user`
/// at the end, as the agent hands it over); returns the wall ms of placing and
/// handing over.
fn place_once(
    tree: &drover_agent::runtime::tree::Tree,
    dir: &Path,
    user: Option<(u32, u32)>,
) -> anyhow::Result<f64> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let sandbox = dir.join("sandbox");
    if sandbox.exists() {
        std::fs::remove_dir_all(&sandbox)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(&sandbox)?;
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(&sandbox)?;
    let owner = user.unwrap_or((
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    ));
    let start = Instant::now();
    drover_agent::runtime::tree::place(tree, &fd, &[], owner, 1 << 30)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    nix::unistd::fchown(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        Some(nix::unistd::Uid::from_raw(owner.0)),
        Some(nix::unistd::Gid::from_raw(owner.1)),
    )?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        std::fs::metadata(sandbox.join("app/big.bin"))?.len() == 8 << 20,
        "app/big.bin not placed"
    );
    Ok(ms)
}

/// The wall ms of `agent unpack-artifact` refusing too few arguments.
fn floor_once(agent: &Path) -> anyhow::Result<f64> {
    let start = Instant::now();
    let out = Command::new(agent)
        .arg("unpack-artifact")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(!out.status.success(), "too few arguments accepted");
    Ok(ms)
}

fn bench_unpack(runs: usize) -> anyhow::Result<()> {
    let mut agents = vec![("this", drover_tests::bin("drover-agent")?)];
    if let Some(old) = std::env::var_os("BENCH_OLD_AGENT") {
        agents.push(("old", PathBuf::from(old)));
    }
    let tmp = tempfile::tempdir()?;
    // The cache is root's; the helper reads it on stdin, as the agent gives it.
    let tar = ten_mib_tar()?;
    std::fs::write(tmp.path().join("app.tar"), &tar)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar)?;
    std::fs::write(tmp.path().join("app.tar.gz"), gz.finish()?)?;
    let user = task_user()?;
    let work = tempfile::tempdir()?;
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let trees = tempfile::tempdir()?;
    let tree_tar = make_tree(
        &agents[0].1,
        &trees.path().join("tar"),
        &tmp.path().join("app.tar"),
        "tar",
    )?;
    let tree_gz = make_tree(
        &agents[0].1,
        &trees.path().join("gz"),
        &tmp.path().join("app.tar.gz"),
        "tar.gz",
    )?;
    let mut times: HashMap<(&str, &str), Vec<f64>> = HashMap::new();
    for run in 0..runs + 2 {
        let plain = place_once(&tree_tar, work.path(), user)?;
        let gz = place_once(&tree_gz, work.path(), user)?;
        if run >= 2 {
            times.entry(("hit", "tar")).or_default().push(plain);
            times.entry(("hit", "tar.gz")).or_default().push(gz);
        }
        for (name, agent) in &agents {
            let plain = unpack_once(agent, work.path(), &tmp.path().join("app.tar"), "tar", user)?;
            let gz = unpack_once(
                agent,
                work.path(),
                &tmp.path().join("app.tar.gz"),
                "tar.gz",
                user,
            )?;
            let floor = floor_once(agent)?;
            // The first two of each are warm-up.
            if run >= 2 {
                times.entry((name, "tar")).or_default().push(plain);
                times.entry((name, "tar.gz")).or_default().push(gz);
                times.entry((name, "floor")).or_default().push(floor);
            }
        }
    }
    println!("cache hit, this build: the unpacked tree linked into a new sandbox:");
    for kind in ["tar", "tar.gz"] {
        let ms = times.remove(&("hit", kind)).unwrap_or_default();
        println!("  10 MiB {kind:<7} ms: {}", summary(ms));
    }
    for (name, agent) in &agents {
        println!("cached unpack, {name} build ({}):", agent.display());
        for kind in ["tar", "tar.gz", "floor"] {
            let what = match kind {
                "tar" => "10 MiB tar     ",
                "tar.gz" => "10 MiB tar.gz  ",
                _ => "helper floor   ",
            };
            let ms = times.remove(&(*name, kind)).unwrap_or_default();
            println!("  {what} ms: {}", summary(ms));
        }
    }
    Ok(())
}

/// Serves `files` over HTTP/1.1 (one request per connection) on 127.0.0.1; returns
/// the base URL. The thread lives as long as the process.
fn serve(files: Arc<Mutex<HashMap<String, Arc<Vec<u8>>>>>) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let files = files.clone();
            std::thread::spawn(move || {
                let Ok(read_half) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(read_half);
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    return;
                }
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
                let body = files.lock().ok().and_then(|f| f.get(&path).cloned());
                let _ = match body {
                    Some(body) => write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .and_then(|()| stream.write_all(&body)),
                    None => stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    ),
                };
            });
        }
    });
    Ok(format!("http://{addr}"))
}

/// The token the bench gives the agent for its `/metrics`.
const METRICS_TOKEN: &str = "bench-metrics-token-0123456789";

/// The sum of the agent's `artifact_fetch_seconds` histogram.
fn fetch_seconds(cluster: &Cluster) -> anyhow::Result<f64> {
    let agents = cluster.agents()?;
    let text = cluster
        .http()
        .get(format!(
            "{}/metrics",
            agents[0].address.trim_end_matches('/')
        ))
        .bearer_auth(METRICS_TOKEN)
        .send()?
        .error_for_status()?
        .text()?;
    text.lines()
        .find(|l| l.contains("artifact_fetch_seconds_sum"))
        .and_then(|l| l.split_whitespace().last())
        .context("no artifact_fetch_seconds_sum in the agent's /metrics")?
        .parse()
        .context("artifact_fetch_seconds_sum is not a number")
}

fn bench_fetch(runs: usize, mib: usize) -> anyhow::Result<()> {
    let tokens = tempfile::tempdir()?;
    let token_file = tokens.path().join("metrics.token");
    std::fs::write(&token_file, METRICS_TOKEN)?;
    let mut config = ClusterConfig::agents(1);
    config.agent_config = format!(
        "metrics_token_file = {:?}\nartifact_max_size = \"{}MiB\"\nartifact_cache_size = \"{}MiB\"\n",
        token_file.display().to_string(),
        mib + 1,
        2 * mib + 2
    );
    let files = Arc::new(Mutex::new(HashMap::new()));
    let base = serve(files.clone())?;
    let mut cluster = Cluster::start(config)?;
    let out = tempfile::tempdir()?;
    let (mut agent_ms, mut curl_ms) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let data = Arc::new(noise(mib << 20, 1000 + run as u64));
        let sha = sha256(&data);
        let path = format!("/blob-{run}.bin");
        files
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(path.clone(), data);
        let url = format!("{base}{path}");

        let before = fetch_seconds(&cluster)?;
        let name = format!("fetch{run}");
        let mut spec = command_job(&name, 1, false, "test -s blob.bin");
        spec["environment"] = "bench".into();
        spec["task"]["artifacts"] =
            serde_json::json!([{"url": url, "sha256": sha, "dest": "blob.bin"}]);
        cluster.create_job(&spec)?;
        let key = format!("www-data/bench/{name}");
        cluster.wait_for_all(&key, TaskState::Finished)?;
        let after = fetch_seconds(&cluster)?;
        agent_ms.push((after - before) * 1000.0);
        cluster.kill_job(&key)?;

        let file = out.path().join("curl.bin");
        let start = Instant::now();
        let status = Command::new("curl")
            .args(["-s", "-f", "-o"])
            .arg(&file)
            .arg(&url)
            .status()
            .context("run curl")?;
        curl_ms.push(start.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(status.success(), "curl {url}: {status}");
        anyhow::ensure!(std::fs::metadata(&file)?.len() == (mib << 20) as u64);
        std::fs::remove_file(&file)?;
        files
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .remove(&path);
    }
    let rate = |ms: &[f64]| {
        let mut v: Vec<f64> = ms.iter().map(|ms| mib as f64 / (ms / 1000.0)).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, c) = (rate(&agent_ms), rate(&curl_ms));
    println!("cold fetch of {mib} MiB from a local server:");
    println!(
        "  agent ms: {} -> median {a:.0} MiB/s",
        summary(agent_ms.clone())
    );
    println!(
        "  curl  ms: {} -> median {c:.0} MiB/s",
        summary(curl_ms.clone())
    );
    println!("  agent / curl: {:.0} %", 100.0 * a / c);
    Ok(())
}

/// The ms from a task's ASSIGNED event to its RUNNING one.
fn assigned_to_running(cluster: &Cluster, key: &str) -> anyhow::Result<f64> {
    let view = cluster.job(key)?;
    let task = view
        .instances
        .first()
        .and_then(|i| i.current.clone())
        .context("no task")?;
    let at = |state: TaskState| {
        task.events
            .iter()
            .find(|e| e.state == state)
            .map(|e| e.timestamp_ms as f64)
            .with_context(|| format!("no {state:?} event"))
    };
    Ok(at(TaskState::Running)? - at(TaskState::Assigned)?)
}

fn bench_start(runs: usize) -> anyhow::Result<()> {
    let tar = ten_mib_tar()?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar)?;
    let gz = gz.finish()?;
    let files = Arc::new(Mutex::new(HashMap::new()));
    let base = serve(files.clone())?;
    let mut artifacts = Vec::new();
    for (path, data) in [("/app.tar", tar), ("/app.tar.gz", gz)] {
        artifacts
            .push(serde_json::json!([{"url": format!("{base}{path}"), "sha256": sha256(&data)}]));
        files
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(path.to_string(), Arc::new(data));
    }
    let mut config = ClusterConfig::agents(1);
    config.agent_config =
        "artifact_max_size = \"64MiB\"\nartifact_cache_size = \"1GiB\"\n".to_string();
    let mut cluster = Cluster::start(config)?;
    let kinds = ["tar", "tar.gz", "none"];
    let mut times: HashMap<&str, Vec<f64>> = HashMap::new();
    for run in 0..=runs {
        for (i, kind) in kinds.iter().enumerate() {
            let name = format!("start{run}-{i}");
            let mut spec = command_job(&name, 1, false, "exec sleep 600");
            spec["environment"] = "bench".into();
            if let Some(a) = artifacts.get(i) {
                spec["task"]["artifacts"] = a.clone();
            }
            cluster.create_job(&spec)?;
            let key = format!("www-data/bench/{name}");
            cluster.wait_for_all(&key, TaskState::Running)?;
            let ms = assigned_to_running(&cluster, &key)?;
            cluster.kill_job(&key)?;
            let k = key.clone();
            cluster.wait_for("the task to end", drover_tests::WAIT, move |c| {
                let view = c.job(&k).ok()?;
                let i = view.instances.first()?;
                i.current
                    .iter()
                    .chain(i.history.iter())
                    .any(|t| t.state.is_terminal())
                    .then_some(())
            })?;
            // The first round fills the cache.
            if run > 0 {
                times.entry(kind).or_default().push(ms);
            }
        }
    }
    // The agent's own time per task with artifacts, by kind (job `start<run>-<i>`).
    let log = std::fs::read_to_string(cluster.dir().join("logs/agent-0.log"))?;
    let mut agent_ms: HashMap<(&str, &str), Vec<f64>> = HashMap::new();
    let field = |line: &str, name: &str| {
        line.split(&format!(" {name}="))
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|d| d.parse::<f64>().ok())
    };
    for line in log.lines().filter(|l| l.contains("artifacts in place")) {
        let kind = (1..=runs).find_map(|run| {
            (0..2).find_map(|i| {
                let name = format!("start{run}-{i}");
                line.match_indices(&name)
                    .any(|(at, _)| {
                        !line[at + name.len()..].starts_with(|c: char| c.is_ascii_digit())
                    })
                    .then_some(kinds[i])
            })
        });
        for part in ["micros", "fetch_micros", "tree_micros"] {
            if let (Some(us), Some(kind)) = (field(line, part), kind) {
                agent_ms.entry((kind, part)).or_default().push(us / 1000.0);
            }
        }
    }
    if agent_ms.is_empty() {
        if let Some(line) = log.lines().find(|l| l.contains("artifacts in place")) {
            println!("(no time read from the agent's log line: {line})");
        }
    }
    println!("agent, artifacts in place (from its log):");
    for kind in &kinds[..2] {
        for (part, what) in [
            ("micros", "all"),
            ("fetch_micros", "cache lookup"),
            ("tree_micros", "tree placed"),
        ] {
            let ms = agent_ms.remove(&(*kind, part)).unwrap_or_default();
            if !ms.is_empty() {
                println!("  {kind:<7} {what:<12} ms: {}", summary(ms));
            }
        }
    }
    println!("task start, ASSIGNED -> RUNNING (event stamps):");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let none = median(times.get("none").map_or(&[][..], Vec::as_slice));
    for kind in kinds {
        let ms = times.remove(kind).unwrap_or_default();
        let m = median(&ms);
        println!("  {kind:<7} ms: {} (added: {:.1})", summary(ms), m - none);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let start_runs = drover_tests::env_number("BENCH_START_RUNS", 0);
    if start_runs > 0 && drover_tests::running_as_root("artifact start bench") {
        return bench_start(start_runs);
    }
    let runs = drover_tests::env_number("BENCH_RUNS", 40);
    bench_unpack(runs)?;
    let fetch_runs = drover_tests::env_number("BENCH_FETCH_RUNS", 5);
    if fetch_runs > 0 && drover_tests::running_as_root("artifact fetch bench") {
        let runs = fetch_runs;
        let mib = drover_tests::env_number("BENCH_FETCH_MIB", 100);
        bench_fetch(runs, mib)?;
    }
    Ok(())
}
