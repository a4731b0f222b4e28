//! `drover dev`: a whole cluster on this host in one command. Starts drover-master
//! and N drover-agents (with their executors) as child processes in one data
//! directory, optionally submits a job and prints each of its task events, and on
//! Ctrl-C (or once the job runs, with --exit-when-running) kills every job, waits for
//! the kill escalation, and stops agents and master.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use drover_common::JobSpec;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::args::DevArgs;
use crate::client::Client;
use crate::credentials;
use crate::devcontext;
use crate::procs::{sweep_executors, wait_for_address, Binaries, Daemon};
use crate::progress::{wait_outcome, EventFollower, Outcome};
use crate::specfile;

/// The master's settings for a dev cluster: short timeouts so that failures,
/// throttling and lost agents show within seconds instead of minutes.
pub const DEV_MASTER_CONFIG: &str = r#"# Written by `drover dev`: short timeouts for a one-host dev cluster.
heartbeat_interval = "500ms"
agent_timeout = "5s"
flapping_threshold = "10s"
throttle_initial = "2s"
throttle_max = "20s"
transient_state_timeout = "60s"
restart_grace = "5s"
# Announced services in DNS (docs/master.md, "DNS"): a free port, printed at start
# and written to master/dns.addr.
dns_listen = "127.0.0.1:0"
"#;

/// How long to wait for the daemons to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `drover dev` waits for tasks to be killed before stopping the agents.
const KILL_TIMEOUT: Duration = Duration::from_secs(45);

/// Ports each agent offers to its tasks.
pub const PORTS_PER_AGENT: u32 = 200;
/// Dev clusters take their agents' ports from here up to the kernel's ephemeral
/// range (32768).
const DEV_PORTS_START: u32 = 20_000;
const DEV_PORTS_END: u32 = 32_768;

/// Agent K's port range (K from 1) in a block that starts at `base`: the block's
/// first port is the lock (see `reserve_port_block`), then 200 ports per agent, so
/// that tasks on different agents of the same host never get the same number.
pub fn agent_port_range(base: u16, k: u32) -> (u16, u16) {
    let low = u32::from(base) + 1 + (k - 1) * PORTS_PER_AGENT;
    (low as u16, (low + PORTS_PER_AGENT - 1) as u16)
}

/// The candidate block starts for `agents` agents, lowest first.
pub fn port_block_candidates(agents: u32) -> Vec<u16> {
    let size = 1 + agents * PORTS_PER_AGENT;
    let stride = size.div_ceil(1000) * 1000;
    (0..)
        .map(|i| DEV_PORTS_START + i * stride)
        .take_while(|base| base + size <= DEV_PORTS_END)
        .map(|base| base as u16)
        .collect()
}

/// Finds a block of ports no other `drover dev` on this host uses, and holds it by
/// listening on its first port for as long as the returned listener lives.
pub fn reserve_port_block(agents: u32) -> anyhow::Result<(std::net::TcpListener, u16)> {
    for base in port_block_candidates(agents) {
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", base)) {
            return Ok((listener, base));
        }
    }
    bail!(
        "no free block of ports for {agents} agents between {DEV_PORTS_START} and \
         {DEV_PORTS_END}: stop another drover dev, or use fewer --agents"
    )
}

/// The command line of agent K (from 1).
pub fn agent_command(
    bins: &Binaries,
    master_url: &str,
    dir: &Path,
    k: u32,
    ports_base: u16,
    no_isolation: bool,
) -> Command {
    let (low, high) = agent_port_range(ports_base, k);
    let mut command = Command::new(&bins.agent);
    command
        .arg("--master")
        .arg(master_url)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.join(format!("agent-{k}")))
        .arg("--sandbox-root")
        .arg(dir.join("sandboxes").join(format!("agent-{k}")))
        .arg("--executor")
        .arg(&bins.executor)
        .arg("--ports")
        .arg(format!("{low}-{high}"))
        .arg("--hostname")
        .arg(format!("dev-agent-{k}"))
        .arg("--attribute")
        .arg(format!("host=dev-agent-{k}"))
        .arg("--attribute")
        .arg(format!("rack=r{k}"));
    if no_isolation {
        command.arg("--no-isolation");
    }
    command
}

/// The running cluster.
struct Cluster {
    client: Client,
    master: Daemon,
    agents: Vec<Daemon>,
    sandbox_roots: Vec<PathBuf>,
    executor: PathBuf,
    /// The master's DNS server (from master/dns.addr).
    dns: Option<String>,
    /// Held while the cluster runs: marks its agents' port block as taken.
    _port_lock: std::net::TcpListener,
}

impl Cluster {
    /// Err if a daemon died.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        self.master.check_alive()?;
        for agent in &mut self.agents {
            agent.check_alive()?;
        }
        Ok(())
    }
}

/// SIGINT and SIGTERM, whichever comes first.
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Runs `drover dev`; Ok(false) means exit 1.
pub async fn run(args: DevArgs) -> anyhow::Result<bool> {
    let bins = Binaries::beside_current_exe()?;
    // Read the job first: a typo should not cost a cluster start.
    let job = match &args.job {
        Some(path) => match specfile::load(path) {
            Ok(spec) => Some(spec),
            Err(errors) => {
                eprintln!("{}", errors.with_error_prefix());
                return Ok(false);
            }
        },
        None => None,
    };
    let (dir, mut temp) = match &args.data_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create --data-dir {}", dir.display()))?;
            (std::fs::canonicalize(dir)?, None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("drover-dev-")
                .tempdir()
                .context("cannot create a temporary data dir; pass --data-dir DIR")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    // Task processes run as the job's role: they must be able to reach their sandbox.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    for sub in ["logs", "master", "sandboxes"] {
        std::fs::create_dir_all(dir.join(sub))?;
        std::fs::set_permissions(dir.join(sub), std::fs::Permissions::from_mode(0o755))?;
    }
    let mut signals = Signals::new()?;
    let mut cluster = match start(&bins, &dir, &args).await {
        Ok(cluster) => cluster,
        Err(e) => {
            keep_for_inspection(temp.take());
            let hint = if format!("{e:#}").contains("in use") {
                format!(
                    " (port {} is taken: --port picks another, 0 any free one)",
                    args.port
                )
            } else {
                String::new()
            };
            return Err(e.context(format!("the dev cluster did not start{hint}")));
        }
    };
    println!("Drover dev cluster is up");
    println!("  API:      {}", cluster.client.base());
    println!("  agents:   {}", cluster.agents.len());
    println!(
        "  data dir: {}{}",
        dir.display(),
        if args.data_dir.is_some() {
            ""
        } else {
            " (removed on exit)"
        }
    );
    println!("  logs:     {}", dir.join("logs").display());
    if let Some(dns) = &cluster.dns {
        let (host, port) = dns.rsplit_once(':').unwrap_or((dns, "53"));
        println!(
            "  DNS:      {dns} (announced services, e.g. dig @{host} -p {port} JOB.ENV.ROLE.drover)"
        );
    }
    println!(
        "  token:    {} (admin)",
        dir.join("master").join(ADMIN_TOKEN_FILE).display()
    );
    println!(
        "  TLS:      CA {} (agents present certificates from the same dir)",
        dir.join("tls").join(crate::tls::CA_CERT).display()
    );
    let ca = dir.join("tls").join(crate::tls::CA_CERT);
    let token = dir.join("master").join(ADMIN_TOKEN_FILE);
    let secret = credentials::read_token(&token)?;
    println!(
        "  web page: {}\n            (signs the page in with the admin token, carried in the \
         fragment, which the browser never sends;\n            the browser warns about the \
         dev CA {}: see docs/ui.md)",
        ui_sign_in_url(cluster.client.base(), &secret),
        ca.display(),
    );
    println!(
        "  try:      {}   (Ctrl-C stops everything)",
        try_line(&this_binary(), cluster.client.base(), &ca, &token)
    );
    let _context = write_context(cluster.client.base(), &ca, &token);

    let mut follower = EventFollower::new();
    let result = match &job {
        Some(spec) => follow_job(&mut cluster, spec, &args, &mut signals, &mut follower).await,
        None => {
            tokio::select! {
                _ = signals.next() => Ok(true),
                result = watch_daemons(&mut cluster) => result,
            }
        }
    };
    if let Err(e) = &result {
        eprintln!("error: {e:#}");
    }
    println!("stopping: killing every job, then the agents and the master");
    let followed = job.as_ref().map(|spec| (spec.key(), &mut follower));
    shutdown(&mut cluster, &mut signals, followed).await;
    if args.data_dir.is_some() {
        println!("kept the data dir {}", dir.display());
    } else if result.is_err() {
        keep_for_inspection(temp.take());
    }
    Ok(result.unwrap_or(false))
}

/// Writes the dev context (see [`devcontext`]) so that commands without
/// `--master` find this cluster, and says so; the guard removes it at exit.
fn write_context(master: &str, ca: &Path, token: &Path) -> Option<devcontext::Written> {
    let path = devcontext::path(|k| std::env::var(k).ok())?;
    let context = devcontext::DevContext {
        master: master.to_string(),
        ca: ca.to_path_buf(),
        token_file: token.to_path_buf(),
        pid: std::process::id(),
    };
    match devcontext::write(&path, &context, devcontext::drover_alive) {
        Ok(devcontext::WriteOutcome::Written(guard)) => {
            println!(
                "  settings: {} (until exit: commands without --master or DROVER_MASTER use \
                 this cluster)",
                path.display()
            );
            Some(guard)
        }
        Ok(devcontext::WriteOutcome::Taken(other)) => {
            println!(
                "  settings: {} belongs to the drover dev of pid {} ({}): use the line above",
                path.display(),
                other.pid,
                other.master
            );
            None
        }
        Err(e) => {
            println!(
                "  settings: cannot write {}: {e}; use the line above",
                path.display()
            );
            None
        }
    }
}

/// How to run the `drover` binary that is running now: its path as the shell finds
/// it (`drover` when `drover` on PATH is this binary, else the full path, e.g.
/// `/src/drover/target/debug/drover`), so the printed commands work when pasted.
fn this_binary() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "drover".to_string();
    };
    let on_path = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("drover"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|candidate| candidate.is_file());
    let same = on_path
        .and_then(|p| p.canonicalize().ok())
        .is_some_and(|p| exe.canonicalize().is_ok_and(|e| e == p));
    if same {
        "drover".to_string()
    } else {
        exe.display().to_string()
    }
}

/// The web UI's address that signs the page in with `token`: the token rides in
/// the URL's fragment (`#token=...`), which browsers never send to the server; the
/// page moves it into the tab's sessionStorage and drops it from the address bar.
pub fn ui_sign_in_url(master: &str, token: &str) -> String {
    format!(
        "{}#token={token}",
        crate::open::url(master, &crate::open::Target::Cluster)
    )
}

/// The command line `drover dev` suggests: the master, CA and token it made, and the
/// binary as given by [`this_binary`].
pub fn try_line(binary: &str, master: &str, ca: &Path, token: &Path) -> String {
    format!(
        "DROVER_MASTER={master} DROVER_CA={} DROVER_TOKEN_FILE={} {binary} job list",
        ca.display(),
        token.display()
    )
}

/// Keeps a temporary data dir after a failure so its logs can be read.
fn keep_for_inspection(temp: Option<tempfile::TempDir>) {
    if let Some(temp) = temp {
        let dir = temp.keep();
        eprintln!(
            "kept the data dir {} for inspection (logs in {})",
            dir.display(),
            dir.join("logs").display()
        );
    }
}

/// The bootstrap admin token's file in the master's data dir.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// The throwaway PKI of a dev cluster, in `DIR/tls`.
struct DevTls {
    ca: PathBuf,
    master_cert: PathBuf,
    master_key: PathBuf,
    /// Agent K's (from 1) certificate and key, at index K - 1.
    agents: Vec<(PathBuf, PathBuf)>,
}

/// Makes (or, with a kept `--data-dir`, reuses) a cluster CA in `DIR/tls`, the
/// master's certificate for 127.0.0.1, and one certificate per agent for its agent
/// id: the one in `DIR/agent-K/agent-id`, else `dev-agent-K` written there.
fn make_certificates(dir: &Path, agents: u32) -> anyhow::Result<DevTls> {
    use crate::tls::{init_ca, issue, Kind, CA_CERT};
    let tls = dir.join("tls");
    if !tls.join(CA_CERT).exists() {
        init_ca(&tls)?;
    }
    let (master_cert, master_key) = issue(&tls, Kind::Master, "127.0.0.1", &[])?;
    let mut certs = Vec::new();
    for k in 1..=agents {
        let agent_dir = dir.join(format!("agent-{k}"));
        std::fs::create_dir_all(&agent_dir)?;
        let id_file = agent_dir.join("agent-id");
        let id = match std::fs::read_to_string(&id_file) {
            Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
            _ => {
                let id = format!("dev-agent-{k}");
                std::fs::write(&id_file, format!("{id}\n"))?;
                id
            }
        };
        certs.push(issue(&tls, Kind::Agent, &id, &[])?);
    }
    Ok(DevTls {
        ca: tls.join(CA_CERT),
        master_cert,
        master_key,
        agents: certs,
    })
}

/// Starts the master, then the agents, and waits until every agent registered.
async fn start(bins: &Binaries, dir: &Path, args: &DevArgs) -> anyhow::Result<Cluster> {
    let config = dir.join("master.toml");
    std::fs::write(&config, DEV_MASTER_CONFIG)?;
    let master_dir = dir.join("master");
    let _ = std::fs::remove_file(master_dir.join("master.addr"));
    let _ = std::fs::remove_file(master_dir.join("dns.addr"));
    let mut command = Command::new(&bins.master);
    command
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", args.port))
        .arg("--data-dir")
        .arg(&master_dir);
    let tls = make_certificates(dir, args.agents)?;
    command
        .arg("--tls-cert")
        .arg(&tls.master_cert)
        .arg("--tls-key")
        .arg(&tls.master_key)
        .arg("--tls-client-ca")
        .arg(&tls.ca);
    let mut master = Daemon::spawn("drover-master", command, &dir.join("logs/master.log"))?;
    let url = wait_for_address(
        &mut master,
        &master_dir.join("master.addr"),
        STARTUP_TIMEOUT,
    )
    .await?
    .replacen("http://", "https://", 1);
    let health = Client::connect(&url, None, Some(&tls.ca))?;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while health.health().await.is_err() {
        master.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "the master at {url} does not answer /health; see {}",
                master.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let admin_token = master_dir.join(ADMIN_TOKEN_FILE);
    let client = Client::connect(
        &url,
        Some(credentials::read_token(&admin_token)?),
        Some(&tls.ca),
    )?;

    let no_isolation = !nix::unistd::geteuid().is_root();
    if no_isolation {
        println!("not root: agents run executors with --no-isolation (no cgroups, no user switch)");
    }
    let (port_lock, ports_base) = reserve_port_block(args.agents)?;
    let mut agents = Vec::new();
    let mut sandbox_roots = Vec::new();
    for k in 1..=args.agents {
        let root = dir.join("sandboxes").join(format!("agent-{k}"));
        std::fs::create_dir_all(&root)?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
        sandbox_roots.push(root);
        let mut command = agent_command(bins, &url, dir, k, ports_base, no_isolation);
        let (cert, key) = &tls.agents[(k - 1) as usize];
        command
            .arg("--tls-ca")
            .arg(&tls.ca)
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key);
        let log = dir.join(format!("logs/agent-{k}.log"));
        agents.push(Daemon::spawn(&format!("drover-agent {k}"), command, &log)?);
    }
    let mut cluster = Cluster {
        client,
        master,
        agents,
        sandbox_roots,
        executor: bins.executor.clone(),
        dns: std::fs::read_to_string(master_dir.join("dns.addr"))
            .ok()
            .map(|a| a.trim().to_string()),
        _port_lock: port_lock,
    };
    let want = args.agents as usize;
    loop {
        cluster.check_alive()?;
        let up = cluster
            .client
            .agents()
            .await
            .map(|agents| agents.iter().filter(|a| a.reachable).count())
            .unwrap_or(0);
        if up >= want {
            return Ok(cluster);
        }
        if Instant::now() > deadline {
            bail!(
                "only {up} of {want} agents registered within {}s; see the logs in {}",
                STARTUP_TIMEOUT.as_secs(),
                dir.join("logs").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until a daemon dies (Err) or forever.
async fn watch_daemons(cluster: &mut Cluster) -> anyhow::Result<bool> {
    loop {
        cluster.check_alive()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Submits the job and prints every task event; with --exit-when-running returns
/// once the job reached its goal, failed, or the timeout passed; else until a signal.
async fn follow_job(
    cluster: &mut Cluster,
    spec: &JobSpec,
    args: &DevArgs,
    signals: &mut Signals,
    follower: &mut EventFollower,
) -> anyhow::Result<bool> {
    let key = spec.key();
    let created = cluster.client.create_job(spec).await?;
    println!("created {key}: {}", created.tasks.join(" "));
    let goal = if spec.service { "RUNNING" } else { "FINISHED" };
    let started = Instant::now();
    let mut reported_outcome = Outcome::Waiting;
    loop {
        cluster.check_alive()?;
        let view = cluster.client.job(&key).await?;
        for line in follower.new_lines(&view) {
            println!("{line}");
        }
        let outcome = wait_outcome(&view);
        if args.exit_when_running {
            match outcome {
                Outcome::Done => {
                    println!(
                        "{key}: all {} instance(s) {goal} after {:.1}s",
                        view.instances.len(),
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(true);
                }
                Outcome::Failed(why) => bail!("{key} did not reach {goal}: {why}"),
                Outcome::Waiting if started.elapsed() > args.timeout => bail!(
                    "{key}: not every instance is {goal} after {}s; the logs are in {}",
                    args.timeout.as_secs(),
                    cluster
                        .master
                        .log
                        .parent()
                        .map(Path::display)
                        .map(|d| d.to_string())
                        .unwrap_or_default()
                ),
                Outcome::Waiting => {}
            }
        } else if outcome != reported_outcome {
            match &outcome {
                Outcome::Done => println!("{key}: all {} instance(s) {goal}", view.instances.len()),
                Outcome::Failed(why) => println!("{key}: {why}"),
                Outcome::Waiting => {}
            }
            reported_outcome = outcome;
        }
        tokio::select! {
            _ = signals.next() => return Ok(!args.exit_when_running),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// Kills every job and waits for its tasks (a second signal skips the wait), printing
/// the followed job's last events, stops the agents and the master, then stops any
/// executor left behind.
async fn shutdown(
    cluster: &mut Cluster,
    signals: &mut Signals,
    mut followed: Option<(drover_common::JobKey, &mut EventFollower)>,
) {
    let kill_jobs = async {
        let Ok(jobs) = cluster.client.jobs(None).await else {
            return;
        };
        for job in &jobs {
            let active = job
                .state_counts
                .iter()
                .any(|(state, n)| *n > 0 && !state.is_terminal());
            if let (true, Ok(key)) = (active, drover_common::JobKey::parse(&job.key)) {
                if let Err(e) = cluster.client.kill(&key, None).await {
                    eprintln!("could not kill {key}: {e}");
                }
            }
        }
        let deadline = Instant::now() + KILL_TIMEOUT;
        while Instant::now() < deadline {
            let Ok(jobs) = cluster.client.jobs(None).await else {
                return;
            };
            let active: u32 = jobs
                .iter()
                .flat_map(|j| j.state_counts.iter())
                .filter(|(state, _)| !state.is_terminal())
                .map(|(_, n)| *n)
                .sum();
            if let Some((key, follower)) = followed.as_mut() {
                if let Ok(view) = cluster.client.job(key).await {
                    for line in follower.new_lines(&view) {
                        println!("{line}");
                    }
                }
            }
            if active == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "some tasks were still stopping after {}s",
            KILL_TIMEOUT.as_secs()
        );
    };
    tokio::select! {
        _ = kill_jobs => {}
        _ = signals.next() => eprintln!("second signal: not waiting for tasks to stop"),
    }
    for agent in &mut cluster.agents {
        agent.stop(Duration::from_secs(10)).await;
    }
    let swept = sweep_executors(
        &cluster.executor,
        &cluster.sandbox_roots,
        Duration::from_secs(15),
    )
    .await;
    if swept > 0 {
        println!("stopped {swept} task(s) left behind by the agents");
    }
    cluster.master.stop(Duration::from_secs(10)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_get_disjoint_port_ranges_after_the_lock_port() {
        assert_eq!(agent_port_range(20_000, 1), (20_001, 20_200));
        assert_eq!(agent_port_range(20_000, 2), (20_201, 20_400));
    }

    #[test]
    fn port_blocks_stay_below_the_ephemeral_range() {
        assert_eq!(port_block_candidates(1)[..3], [20_000, 21_000, 22_000]);
        assert_eq!(port_block_candidates(1).len(), 13);
        assert_eq!(port_block_candidates(32), vec![20_000]);
        for agents in [1, 5, 32] {
            for base in port_block_candidates(agents) {
                let (_, last) = agent_port_range(base, agents);
                assert!(u32::from(last) < DEV_PORTS_END, "{agents} agents at {base}");
            }
        }
    }

    #[test]
    fn a_taken_port_block_is_skipped() {
        let (first, base) = reserve_port_block(1).unwrap();
        let (_second, other) = reserve_port_block(1).unwrap();
        assert_ne!(base, other);
        drop(first);
    }

    #[test]
    fn agents_get_distinct_attributes() {
        let bins = Binaries {
            master: "m".into(),
            agent: "a".into(),
            executor: "e".into(),
        };
        let command = agent_command(
            &bins,
            "http://127.0.0.1:1",
            Path::new("/d"),
            2,
            20_000,
            false,
        );
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().to_string())
            .collect();
        let joined = args.join(" ");
        assert!(
            joined.contains("--attribute host=dev-agent-2 --attribute rack=r2"),
            "{joined}"
        );
        assert!(
            joined.contains("--sandbox-root /d/sandboxes/agent-2"),
            "{joined}"
        );
        assert!(!joined.contains("--no-isolation"));
    }
}
