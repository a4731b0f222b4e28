//! Load (issues 15 and 31): simulated agents (`drover_tests::load`) in this process
//! against a real master over real HTTP. 5,000 tasks on 300 agents are placed with
//! no over-commit and no agent ever lost; the master restarts and every agent
//! re-registers and reconciles without a task killed or replaced (sizes:
//! `DROVER_LOAD_AGENTS`, `DROVER_LOAD_TASKS`). 5,000 tasks on 1,000 agents run with
//! the cell's heartbeats held to `max_heartbeat_rate` (sizes: `DROVER_CELL_AGENTS`,
//! `DROVER_CELL_TASKS`). The heartbeat CPU measurement is `#[ignore]`d (a minute
//! long): `cargo test -p drover-tests --release --test load -- --ignored`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_common::wire::{ClusterView, JobSummary, JobView};
use drover_tests::load::Fleet;
use drover_tests::{spawn_master, Proc};
use serde_json::json;

const MASTER_CONFIG: &str = r#"
heartbeat_interval = "1s"
agent_timeout = "5s"
restart_grace = "8s"
max_heartbeat_rate = 100
"#;

/// The cell's heartbeats a second, at most (`max_heartbeat_rate` above).
const MAX_HEARTBEAT_RATE: f64 = 100.0;

/// Instances per job.
const PER_JOB: usize = 100;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Setup {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    master: Proc,
    url: String,
    http: reqwest::Client,
    /// The master's bootstrap admin token, where the master has one.
    admin: Option<String>,
    jobs: Vec<String>,
    fleet: Fleet,
    agents: usize,
    tasks: usize,
}

fn start_master(dir: &Path, listen: &str) -> anyhow::Result<(Proc, String)> {
    let (proc, addr) = spawn_master(dir, listen)?;
    let url = format!("http://{}", addr.trim_start_matches("http://"));
    Ok((proc, url))
}

/// `request` with the admin token, if there is one.
fn auth(request: reqwest::RequestBuilder, token: &Option<String>) -> reqwest::RequestBuilder {
    match token {
        Some(t) => request.bearer_auth(t),
        None => request,
    }
}

async fn get<T: serde::de::DeserializeOwned>(s: &Setup, url: &str) -> anyhow::Result<T> {
    let r = auth(s.http.get(url), &s.admin).send().await?;
    anyhow::ensure!(r.status().is_success(), "GET {url}: {}", r.status());
    Ok(r.json().await?)
}

async fn wait<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        anyhow::ensure!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every task id of every job, and whether all are RUNNING with no history.
async fn tasks_of(s: &Setup) -> anyhow::Result<(Vec<String>, bool)> {
    let mut ids = Vec::new();
    let mut settled = true;
    for key in &s.jobs {
        let view: JobView = get(s, &format!("{}/v1/jobs/{key}", s.url)).await?;
        for i in &view.instances {
            settled &= i.history.is_empty();
            match &i.current {
                Some(t) => {
                    settled &= t.state == TaskState::Running;
                    ids.push(t.task_id.clone());
                }
                None => settled = false,
            }
        }
    }
    Ok((ids, settled))
}

async fn cluster(s: &Setup) -> anyhow::Result<ClusterView> {
    get(s, &format!("{}/v1/cluster", s.url)).await
}

/// An agent token for each of `agents` simulated agents (None each without
/// authentication), asked for a few at a time.
async fn agent_tokens(
    http: &reqwest::Client,
    url: &str,
    admin: &Option<String>,
    agents: usize,
) -> anyhow::Result<Vec<Option<String>>> {
    if admin.is_none() {
        return Ok(vec![None; agents]);
    }
    let mut tokens = Vec::with_capacity(agents);
    while tokens.len() < agents {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..(agents - tokens.len()).min(16) {
            let request =
                auth(http.post(format!("{url}/v1/tokens")), admin).json(&json!({"kind": "agent"}));
            batch.spawn(async move {
                let r = request.send().await?;
                anyhow::ensure!(r.status().is_success(), "POST /v1/tokens: {}", r.status());
                let body: serde_json::Value = r.json().await?;
                let token = body["token"].as_str();
                Ok(token
                    .ok_or_else(|| anyhow::anyhow!("no token in {body}"))?
                    .to_string())
            });
        }
        while let Some(token) = batch.join_next().await {
            tokens.push(Some(token??));
        }
    }
    Ok(tokens)
}

/// RUNNING tasks over every job, from the job list's state counts.
async fn running(s: &Setup) -> anyhow::Result<usize> {
    let jobs: Vec<JobSummary> = get(s, &format!("{}/v1/jobs?role=load", s.url)).await?;
    Ok(jobs
        .iter()
        .map(|j| {
            j.state_counts
                .get(&TaskState::Running)
                .copied()
                .unwrap_or(0) as usize
        })
        .sum())
}

/// A master, `agents` simulated agents registered, and `tasks` tasks RUNNING.
async fn setup(agents: usize, tasks: usize) -> anyhow::Result<Setup> {
    let tmp = tempfile::Builder::new().prefix("drover-load-").tempdir()?;
    let dir = tmp.path().to_path_buf();
    std::fs::create_dir_all(dir.join("master"))?;
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::write(dir.join("master.toml"), MASTER_CONFIG)?;
    let (master, url) = start_master(&dir, "127.0.0.1:0")?;
    let http = reqwest::Client::new();
    // A master with authentication writes its bootstrap admin token; each simulated
    // agent then gets an agent token of its own.
    let admin = std::fs::read_to_string(dir.join("master/admin.token"))
        .ok()
        .map(|t| t.trim().to_string());
    let tokens = agent_tokens(&http, &url, &admin, agents).await?;
    let fleet = Fleet::start(&url, tokens);
    let mut s = Setup {
        _dir: tmp,
        dir,
        master,
        url,
        http,
        admin,
        jobs: Vec::new(),
        fleet,
        agents,
        tasks,
    };
    wait(
        "every simulated agent registered",
        Duration::from_secs(60),
        || async {
            let c = cluster(&s).await.ok()?;
            (c.reachable_agents as usize == agents).then_some(())
        },
    )
    .await?;
    let started = Instant::now();
    let mut left = tasks;
    let mut j = 0;
    while left > 0 {
        let n = left.min(PER_JOB);
        let name = format!("load{j}");
        let spec = json!({
            "role": "load", "environment": "test", "name": name, "instances": n,
            "service": false,
            "task": {"processes": [{"name": "main", "cmdline": "sleep 1000000"}],
                     "resources": {"cpu": 0.1, "ram": "64MiB", "disk": "64MiB"}}
        });
        let r = auth(s.http.post(format!("{}/v1/jobs", s.url)), &s.admin)
            .json(&spec)
            .send()
            .await?;
        let status = r.status();
        anyhow::ensure!(
            status.as_u16() == 201,
            "create {name}: {status}: {}",
            r.text().await.unwrap_or_default()
        );
        s.jobs.push(format!("load/test/{name}"));
        left -= n;
        j += 1;
    }
    wait("every task RUNNING", Duration::from_secs(180), || async {
        (running(&s).await.ok()? == tasks).then_some(())
    })
    .await?;
    let (_, settled) = tasks_of(&s).await?;
    anyhow::ensure!(settled, "a task is not RUNNING or was replaced");
    println!(
        "MEASURE {} tasks on {} simulated agents: created -> all RUNNING in {:.2}s",
        s.tasks,
        s.agents,
        started.elapsed().as_secs_f64()
    );
    Ok(s)
}

fn check_fleet(s: &Setup) -> anyhow::Result<()> {
    let st = &s.fleet.stats;
    anyhow::ensure!(
        st.overcommits.load(Ordering::Relaxed) == 0,
        "an agent got more than its capacity"
    );
    anyhow::ensure!(
        st.kills.load(Ordering::Relaxed) == 0,
        "{} tasks taken from agents",
        st.kills.load(Ordering::Relaxed)
    );
    Ok(())
}

/// For `d`, every agent stays reachable.
async fn all_reachable_for(s: &Setup, d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        let c = cluster(s).await?;
        anyhow::ensure!(
            c.reachable_agents as usize == s.agents && !c.eviction_guard.engaged,
            "agents lost: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_tasks_on_300_simulated_agents_survive_a_master_restart() {
    let mut s = setup(
        env_or("DROVER_LOAD_AGENTS", 300),
        env_or("DROVER_LOAD_TASKS", 5_000),
    )
    .await
    .unwrap();
    let (before, _) = tasks_of(&s).await.unwrap();
    assert_eq!(before.len(), s.tasks);
    all_reachable_for(&s, Duration::from_secs(7)).await.unwrap();
    check_fleet(&s).unwrap();

    // Restart: every agent comes back at once.
    let registrations = s.fleet.stats.registrations.load(Ordering::Relaxed);
    let full_sets = s.fleet.stats.full_sets.load(Ordering::Relaxed);
    s.master.stop(Duration::from_secs(10));
    let listen = s.url.trim_start_matches("http://").to_string();
    let (master, url) = start_master(&s.dir, &listen).unwrap();
    s.master = master;
    assert_eq!(url, s.url);
    let restarted = Instant::now();
    wait(
        "every agent reconciled after the restart",
        Duration::from_secs(60),
        || async {
            let c = cluster(&s).await.ok()?;
            let resent = s.fleet.stats.full_sets.load(Ordering::Relaxed) - full_sets;
            (c.reachable_agents as usize == s.agents && resent >= s.agents as u64).then_some(())
        },
    )
    .await
    .unwrap();
    let back = restarted.elapsed();
    // Past the restart grace: anything the master wanted to replace would be.
    all_reachable_for(&s, Duration::from_secs(10))
        .await
        .unwrap();
    let (after, settled) = tasks_of(&s).await.unwrap();
    assert!(
        settled,
        "a task is not RUNNING or was replaced after the restart"
    );
    assert_eq!(after, before, "task ids changed");
    check_fleet(&s).unwrap();
    // Every agent reconciled with the restarted master (its full task set).
    let resent = s.fleet.stats.full_sets.load(Ordering::Relaxed) - full_sets;
    assert!(resent >= s.agents as u64, "only {resent} full task sets");
    println!(
        "MEASURE master restart with {} agents: every agent reachable and its full task set taken {:.2}s after the master started again; {} re-registrations, {} full task sets sent in all",
        s.agents,
        back.as_secs_f64(),
        s.fleet.stats.registrations.load(Ordering::Relaxed) - registrations,
        s.fleet.stats.full_sets.load(Ordering::Relaxed)
    );
    s.fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_agents_run_their_tasks_within_the_cells_heartbeat_rate() {
    // 5,000 tasks keep CI's debug master to about a minute; the issue's 20,000:
    // DROVER_CELL_TASKS=20000 (a release master: DROVER_BIN_DIR=target/release).
    let s = setup(
        env_or("DROVER_CELL_AGENTS", 1_000),
        env_or("DROVER_CELL_TASKS", 5_000),
    )
    .await
    .unwrap();
    check_fleet(&s).unwrap();
    // The master tells a cell this size a longer interval than `heartbeat_interval`
    // (agents / max_heartbeat_rate), and the agents follow it.
    let told = s.fleet.stats.told_interval_ms.load(Ordering::Relaxed);
    let expected = (s.agents as f64 / MAX_HEARTBEAT_RATE * 1000.0).max(1000.0) as u64;
    assert_eq!(told, expected, "the interval told to the agents");
    // Over two told intervals every agent heartbeats about twice, and the cell
    // stays within its rate (a fifth over for the phase of each agent's
    // timer against the window) with every agent reachable.
    let window = Duration::from_millis(2 * told);
    let beats0 = s.fleet.stats.heartbeats.load(Ordering::Relaxed);
    let start = Instant::now();
    all_reachable_for(&s, window).await.unwrap();
    let beats = s.fleet.stats.heartbeats.load(Ordering::Relaxed) - beats0;
    let rate = beats as f64 / start.elapsed().as_secs_f64();
    println!(
        "MEASURE {} simulated agents told to heartbeat every {told} ms: {beats} heartbeats in {:.1}s ({rate:.0}/s), {} tasks RUNNING",
        s.agents,
        start.elapsed().as_secs_f64(),
        s.tasks
    );
    assert!(
        rate <= MAX_HEARTBEAT_RATE * 1.2,
        "{rate:.0} heartbeats/s from the cell, max_heartbeat_rate {MAX_HEARTBEAT_RATE}"
    );
    assert!(
        beats as usize >= s.agents,
        "only {beats} heartbeats from {} agents in two intervals",
        s.agents
    );
    let (after, settled) = tasks_of(&s).await.unwrap();
    assert!(settled, "a task is not RUNNING or was replaced");
    assert_eq!(after.len(), s.tasks);
    check_fleet(&s).unwrap();
    s.fleet.stop().await;
}

/// The master's user + system CPU time in clock ticks, from /proc/<pid>/stat.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("bad stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime); `after` starts at field 3.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a minute long: the heartbeat CPU measurement (run with --ignored)"]
async fn heartbeat_handling_of_a_cell_costs_under_a_tenth_of_a_core() {
    let s = setup(
        env_or("DROVER_LOAD_AGENTS", 300),
        env_or("DROVER_LOAD_TASKS", 5_000),
    )
    .await
    .unwrap();
    let secs = env_or("DROVER_LOAD_SECS", 60) as u64;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = s.master.pid();
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let beats0 = s.fleet.stats.heartbeats.load(Ordering::Relaxed);
    let t0 = cpu_ticks(pid).unwrap();
    let start = Instant::now();
    all_reachable_for(&s, Duration::from_secs(secs))
        .await
        .unwrap();
    let used = (cpu_ticks(pid).unwrap() - t0) as f64 / ticks_per_s;
    let wall = start.elapsed().as_secs_f64();
    let beats = s.fleet.stats.heartbeats.load(Ordering::Relaxed) - beats0;
    let share = used / wall;
    println!(
        "MEASURE master CPU with {} agents heartbeating every {} ms and {} tasks: {:.1}% of one core over {:.0}s ({} heartbeats, {:.0} us CPU each)",
        s.agents,
        s.fleet.stats.told_interval_ms.load(Ordering::Relaxed),
        s.tasks,
        share * 100.0,
        wall,
        beats,
        used * 1e6 / beats.max(1) as f64
    );
    check_fleet(&s).unwrap();
    assert!(share < 0.10, "{:.1}% of a core", share * 100.0);
    s.fleet.stop().await;
}
