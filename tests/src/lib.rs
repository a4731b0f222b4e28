//! Black-box test harness: starts the real drover-master and drover-agents (which
//! start real drover-executors) from the workspace's target dir in a temporary
//! directory, talks to the master's admin API, waits for conditions by polling with
//! generous timeouts, and kills everything it started when dropped.
//!
//! The binaries must be built first: `cargo build --workspace --bins` (CI does).
//! `DROVER_BIN_DIR` overrides where they are looked for.

pub mod etcd;
pub mod ha;
pub mod load;
pub mod netns;
pub mod reap;

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use drover_common::state::TaskState;
use drover_common::wire::{AgentView, JobView, TaskView};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// Short master timeouts so failures, throttling and replacements show in seconds.
pub const TEST_MASTER_CONFIG: &str = r#"
heartbeat_interval = "300ms"
agent_timeout = "5s"
flapping_threshold = "3s"
throttle_initial = "1s"
throttle_max = "4s"
transient_state_timeout = "60s"
restart_grace = "10s"
"#;

/// How long waits last unless a test says otherwise: generous, for 2 busy cores.
pub const WAIT: Duration = Duration::from_secs(60);

/// A bench's numeric setting from the environment variable `name`, else `default`.
pub fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Where the Drover binaries are: `DROVER_BIN_DIR`, else the profile dir this test
/// binary was built in (`target/debug/deps/..`) if it holds all four, else
/// `<workspace>/target/debug`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DROVER_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let from_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf));
    let complete = |d: &PathBuf| {
        ["drover", "drover-master", "drover-agent", "drover-executor"]
            .iter()
            .all(|b| d.join(b).is_file())
    };
    if let Some(dir) = from_exe.filter(complete) {
        return dir;
    }
    workspace_root().join("target").join("debug")
}

/// The path of a Drover binary; fails saying how to build it.
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.is_file() {
        bail!(
            "{} not found: build the binaries first with cargo build --workspace --bins \
             (or set DROVER_BIN_DIR)",
            path.display()
        );
    }
    Ok(path)
}

/// True when running as root; else prints why the test is skipped. Task processes
/// run as the job's role (www-data), which needs root.
pub fn running_as_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipping {test}: black-box cluster tests need root (task users, cgroups)");
    false
}

/// The `drover` CLI with `args`, `DROVER_MASTER=url` and `DROVER_TOKEN=token` when
/// given, and nothing from this environment or the user's config file.
fn cli(master: Option<&str>, token: Option<&str>, args: &[&str]) -> anyhow::Result<Command> {
    let mut command = Command::new(bin("drover")?);
    command
        .args(args)
        .env_remove("DROVER_MASTER")
        .env_remove("DROVER_TOKEN")
        .env_remove("DROVER_TOKEN_FILE")
        .env("DROVER_CONFIG", "/nonexistent/drover-test-config.toml");
    if let Some(url) = master {
        command.env("DROVER_MASTER", url);
    }
    if let Some(token) = token {
        command.env("DROVER_TOKEN", token);
    }
    command.env_remove("DROVER_CA");
    Ok(command)
}

/// Runs the `drover` CLI with `args` (and `--master url` when given), no token.
pub fn drover(master: Option<&str>, args: &[&str]) -> anyhow::Result<Output> {
    drover_as(master, None, args)
}

/// Runs the `drover` CLI with `args`, the master's url and a token.
pub fn drover_as(
    master: Option<&str>,
    token: Option<&str>,
    args: &[&str],
) -> anyhow::Result<Output> {
    cli(master, token, args)?
        .stdin(Stdio::null())
        .output()
        .context("cannot run drover")
}

/// Runs the `drover` CLI like `drover()`, killing it if it runs longer than
/// `timeout` (then the output says so in stderr).
pub fn drover_with_timeout(
    master: Option<&str>,
    token: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> anyhow::Result<Output> {
    let child = cli(master, token, args)?
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run drover")?;
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(timeout).is_err() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    });
    let output = child.wait_with_output();
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let mut output = output?;
    if output.status.code().is_none() {
        output
            .stderr
            .extend_from_slice(format!("\n[killed after {}s]", timeout.as_secs()).as_bytes());
    }
    Ok(output)
}

/// stdout and stderr of a finished command, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A child process killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    /// Starts `command` with its output appended to `log`, in its own process group,
    /// with SIGKILL as its parent-death signal.
    pub fn spawn(name: &str, command: Command, log: &Path) -> anyhow::Result<Proc> {
        let child = drover::procs::spawn_logged(name, command, log, Signal::SIGKILL)?;
        Ok(Proc {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The end of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns the exit status if it exited
    /// on its own within `grace`, None if it had to be killed (or had exited before).
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if !self.is_running() {
            return None;
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last 30 lines of a log file ("" if it cannot be read).
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A cluster CA in `<dir>/tls`, the master's certificate for 127.0.0.1 and
/// `master_names`, and for each agent K in `0..agents` the agent id `<prefix>-K`
/// written to `<dir>/agent-K/agent-id` and its certificate. Returns the CA's path.
pub fn make_certificates(
    dir: &Path,
    prefix: &str,
    agents: usize,
    master_names: &[String],
) -> anyhow::Result<PathBuf> {
    let tls = dir.join("tls");
    drover::tls::init_ca(&tls)?;
    drover::tls::issue(&tls, drover::tls::Kind::Master, "127.0.0.1", master_names)?;
    for k in 0..agents {
        let id = format!("{prefix}-{k}");
        let data_dir = dir.join(format!("agent-{k}"));
        std::fs::create_dir_all(&data_dir)?;
        std::fs::write(data_dir.join("agent-id"), format!("{id}\n"))?;
        drover::tls::issue(&tls, drover::tls::Kind::Agent, &id, &[])?;
    }
    Ok(tls.join("ca.pem"))
}

/// The master's certificate in `<dir>/tls` (`drover tls issue master 127.0.0.1`).
pub const MASTER_CERT: &str = "master-127.0.0.1.pem";
/// Its key.
pub const MASTER_KEY: &str = "master-127.0.0.1.key";

/// Starts `drover-master` with `<dir>/master.toml`, data dir `<dir>/master`, log
/// `<dir>/logs/master.log`, listening on `listen` (with TLS when `<dir>/tls` holds
/// a cluster CA and the master's certificate), and waits until it has written its
/// bound address to `master.addr`; returns the process and that address.
pub fn spawn_master(dir: &Path, listen: &str) -> anyhow::Result<(Proc, String)> {
    spawn_master_with_env(dir, listen, &[])
}

/// `spawn_master` with extra environment variables (e.g. libfaketime's).
pub fn spawn_master_with_env(
    dir: &Path,
    listen: &str,
    env: &[(String, String)],
) -> anyhow::Result<(Proc, String)> {
    let master_dir = dir.join("master");
    let addr_file = master_dir.join("master.addr");
    // A fixed address (a restart) is known: the master is up once it accepts
    // there (master.addr, which a master on a full disk cannot rewrite, is not
    // needed).
    let fixed = listen
        .parse::<std::net::SocketAddr>()
        .ok()
        .filter(|a| a.port() != 0);
    if fixed.is_none() {
        let _ = std::fs::remove_file(&addr_file);
    }
    let mut command = Command::new(bin("drover-master")?);
    command
        .arg("--config")
        .arg(dir.join("master.toml"))
        .arg("--listen")
        .arg(listen)
        .arg("--data-dir")
        .arg(&master_dir)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)));
    let tls = dir.join("tls");
    if tls.join("ca.pem").is_file() {
        // A cluster with a CA (the fault tests' NetCluster) serves mTLS.
        command
            .arg("--tls-cert")
            .arg(tls.join(MASTER_CERT))
            .arg("--tls-key")
            .arg(tls.join(MASTER_KEY))
            .arg("--tls-client-ca")
            .arg(tls.join("ca.pem"));
    }
    let mut master = Proc::spawn("drover-master", command, &dir.join("logs/master.log"))?;
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(addr) = fixed {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Ok((master, listen.to_string()));
            }
        // Written with a rename: a non-empty file is complete.
        } else if let Ok(text) = std::fs::read_to_string(&addr_file) {
            if !text.trim().is_empty() {
                return Ok((master, text.trim().to_string()));
            }
        }
        if !master.is_running() || Instant::now() > deadline {
            bail!("the master did not start; its log:\n{}", master.log_tail());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `check` on `cluster` every 100 ms until it returns Some, or fails after
/// `timeout` naming what it waited for, with `diagnostics` of the cluster.
pub fn poll_for<C, T>(
    cluster: &mut C,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut(&C) -> Option<T>,
    diagnostics: impl FnOnce(&mut C) -> String,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check(cluster) {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "timed out after {}s waiting for {what}\n{}",
                timeout.as_secs(),
                diagnostics(cluster)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The master's admin API over blocking HTTP, for both kinds of test cluster (they
/// deref to it).
#[derive(Debug)]
pub struct AdminApi {
    /// `http://host:port` of the master.
    pub url: String,
    /// The bearer token sent with every request (the master's bootstrap admin
    /// token once the master is up).
    pub token: Option<String>,
    /// The cluster CA trusted for an https master.
    pub ca: Option<PathBuf>,
    http: reqwest::blocking::Client,
}

impl AdminApi {
    /// A client with a 30 s timeout; `url` is set once the master is up.
    pub fn new() -> anyhow::Result<AdminApi> {
        Ok(AdminApi {
            url: String::new(),
            token: None,
            ca: None,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }

    /// Whether `/health` answers with success.
    pub fn healthy(&self) -> bool {
        self.http
            .get(format!("{}/health", self.url))
            .send()
            .is_ok_and(|r| r.status().is_success())
    }

    /// GET a path of the admin API as T; Err on non-2xx with the body.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let (status, text) = self.get_text(path)?;
        read_answer(path, status, text)
    }

    /// GET a path of the admin API: None on 404.
    pub fn get_opt<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<Option<T>> {
        let (status, text) = self.get_text(path)?;
        if status.as_u16() == 404 {
            return Ok(None);
        }
        read_answer(path, status, text).map(Some)
    }

    /// Trusts the cluster CA in `ca` (PEM) for an https master.
    pub fn trust_ca(&mut self, ca: &Path) -> anyhow::Result<()> {
        let cert = reqwest::Certificate::from_pem(&std::fs::read(ca)?)?;
        self.http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .add_root_certificate(cert)
            .build()?;
        self.ca = Some(ca.to_path_buf());
        Ok(())
    }

    /// The HTTP client (it trusts the cluster CA, if one), e.g. for a test's own
    /// requests.
    pub fn http(&self) -> reqwest::blocking::Client {
        self.http.clone()
    }

    /// A request with the token.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Reads the bootstrap admin token from the master's data dir into `token`.
    pub fn use_admin_token(&mut self, master_dir: &Path) -> anyhow::Result<()> {
        let path = master_dir.join("admin.token");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no admin token at {}", path.display()))?;
        self.token = Some(text.trim().to_string());
        Ok(())
    }

    /// Creates a token (`{"kind": ...}` body of POST /v1/tokens) and returns its text.
    pub fn create_token(&self, body: &Value) -> anyhow::Result<String> {
        let (status, answer) = self.post("/v1/tokens", body)?;
        if status != 201 {
            bail!("creating a token answered HTTP {status}: {answer}");
        }
        answer["token"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no token in {answer}"))
    }

    /// Writes a new agent token to `<agent_dir>/agent.token` (the agent's default
    /// token file) unless one is there (a restarted agent keeps its token).
    pub fn give_agent_token(&self, agent_dir: &Path) -> anyhow::Result<()> {
        let path = agent_dir.join("agent.token");
        if path.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(agent_dir)?;
        let token = self.create_token(&json!({"kind": "agent"}))?;
        drover::credentials::write_token_file(&path, &token)?;
        Ok(())
    }

    /// GET a path of the admin API: the status and the body's text, whatever they are.
    pub fn get_status(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let (status, text) = self.get_text(path)?;
        Ok((status.as_u16(), text))
    }

    fn get_text(&self, path: &str) -> anyhow::Result<(reqwest::StatusCode, String)> {
        let response = self.request(reqwest::Method::GET, path).send()?;
        let status = response.status();
        Ok((status, response.text()?))
    }

    /// POST JSON to a path of the admin API; returns the status and the JSON body.
    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        let response = self
            .request(reqwest::Method::POST, path)
            .json(body)
            .send()?;
        let status = response.status().as_u16();
        let text = response.text()?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    /// POST /v1/jobs; Err unless 201.
    pub fn create_job(&self, spec: &Value) -> anyhow::Result<Value> {
        let (status, body) = self.post("/v1/jobs", spec)?;
        if status != 201 {
            bail!("creating the job answered HTTP {status}: {body}");
        }
        Ok(body)
    }

    /// POST /v1/jobs/{key}/kill.
    pub fn kill_job(&self, key: &str) -> anyhow::Result<()> {
        let (status, _) = self.post(&format!("/v1/jobs/{key}/kill"), &json!({}))?;
        if !(200..300).contains(&status) {
            bail!("killing {key}: HTTP {status}");
        }
        Ok(())
    }

    /// GET /v1/jobs/{key}.
    pub fn job(&self, key: &str) -> anyhow::Result<JobView> {
        self.get(&format!("/v1/jobs/{key}"))
    }

    /// GET /v1/tasks/{id}.
    pub fn task(&self, task_id: &str) -> anyhow::Result<TaskView> {
        self.get(&format!("/v1/tasks/{task_id}"))
    }

    /// GET /v1/agents.
    pub fn agents(&self) -> anyhow::Result<Vec<AgentView>> {
        self.get("/v1/agents")
    }

    /// Every job key the master has.
    pub fn job_keys(&self) -> anyhow::Result<Vec<String>> {
        let jobs: Vec<Value> = self.get("/v1/jobs")?;
        Ok(jobs
            .iter()
            .filter_map(|j| j.get("key").and_then(Value::as_str).map(str::to_string))
            .collect())
    }
}

/// The JSON body of a GET answer as T; Err on non-2xx with the body.
fn read_answer<T: DeserializeOwned>(
    path: &str,
    status: reqwest::StatusCode,
    text: String,
) -> anyhow::Result<T> {
    if !status.is_success() {
        bail!("GET {path}: HTTP {status}: {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("GET {path}: cannot read {text}"))
}

/// What a test cluster looks like.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// One entry per agent: its attributes (`host` is set to `agent-K` unless given).
    /// Agent K reports the host name `agent-K`.
    pub agents: Vec<Vec<(String, String)>>,
    /// The master's TOML config.
    pub master_config: String,
    /// Serve mTLS (a CA per cluster, agent certificates) instead of plain HTTP with
    /// agent tokens.
    pub tls: bool,
    /// Every agent's TOML config file (`--config`; the flags the harness passes win).
    pub agent_config: String,
    /// Extra environment of the master process.
    pub master_env: Vec<(String, String)>,
    /// Extra environment per agent (by index; missing entries: none).
    pub agent_env: Vec<Vec<(String, String)>>,
    /// `cgroup.procs` files every agent process writes itself into before it execs
    /// drover-agent: the agent starts inside cgroups the test made (a delegated
    /// subtree, as systemd's `Delegate=yes` gives a unit).
    pub agent_cgroup: Vec<PathBuf>,
}

impl ClusterConfig {
    /// `n` agents with `host=agent-K` and `rack=rK` (K from 0), the test master config.
    pub fn agents(n: usize) -> ClusterConfig {
        ClusterConfig {
            agents: (0..n)
                .map(|k| vec![("rack".to_string(), format!("r{k}"))])
                .collect(),
            master_config: TEST_MASTER_CONFIG.to_string(),
            tls: false,
            agent_config: String::new(),
            master_env: Vec::new(),
            agent_env: Vec::new(),
            agent_cgroup: Vec::new(),
        }
    }
}

/// Each cluster of this test process gets its own block of ports for its agents.
static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// Ports per cluster: the first is held as a lock, the rest go to the agents.
const PORT_BLOCK: u32 = 200;

/// Reserves a block of `PORT_BLOCK` ports between 10000 and 19999 (below the
/// kernel's ephemeral range and `drover dev`'s agents) by binding its first port:
/// concurrent test processes skip blocks another one holds.
fn reserve_port_block() -> anyhow::Result<(TcpListener, u16)> {
    let blocks = 10_000 / PORT_BLOCK;
    let start = std::process::id() * 7 + CLUSTERS.fetch_add(1, Ordering::SeqCst) * 13;
    for i in 0..blocks {
        let port = (10_000 + ((start + i) % blocks) * PORT_BLOCK) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return Ok((listener, port));
        }
    }
    bail!("no free block of {PORT_BLOCK} ports between 10000 and 19999")
}

/// How an agent of a cluster was started: attributes, port range, config file text.
type AgentStart = (Vec<(String, String)>, (u16, u16), String);

/// A running master and agents in a temporary directory.
pub struct Cluster {
    dir: Option<tempfile::TempDir>,
    /// The admin API (`url` is the master's); the cluster derefs to it.
    pub api: AdminApi,
    listen: String,
    master_env: Vec<(String, String)>,
    agent_env: Vec<Vec<(String, String)>>,
    agent_cgroup: Vec<PathBuf>,
    master: Option<Proc>,
    agents: Vec<Proc>,
    pub sandbox_roots: Vec<PathBuf>,
    /// How each agent was started, for `start_agent_again`.
    agent_starts: Vec<AgentStart>,
    /// Held for the cluster's life: the first port of its agents' port block.
    port_lock: Option<(TcpListener, u16)>,
    /// Agents present certificates from `<dir>/tls` to an https master.
    tls: bool,
}

impl Cluster {
    /// Starts a master and the agents, and waits until every agent is registered.
    pub fn start(config: ClusterConfig) -> anyhow::Result<Cluster> {
        let dir = cluster_dir("drover-bb-", &config.master_config)?;
        let mut cluster = Cluster {
            dir: Some(dir),
            api: AdminApi::new()?,
            listen: "127.0.0.1:0".to_string(),
            master_env: config.master_env.clone(),
            agent_env: config.agent_env.clone(),
            agent_cgroup: config.agent_cgroup.clone(),
            master: None,
            agents: Vec::new(),
            sandbox_roots: Vec::new(),
            agent_starts: Vec::new(),
            port_lock: Some(reserve_port_block()?),
            tls: config.tls,
        };
        if config.tls {
            cluster.make_certificates(config.agents.len())?;
        }
        let base = u32::from(
            cluster
                .port_lock
                .as_ref()
                .map(|(_, port)| *port)
                .unwrap_or(10_000),
        ) + 1;
        let n = config.agents.len() as u32;
        let per_agent = (PORT_BLOCK - 1) / n.max(1);
        for (k, attributes) in config.agents.iter().enumerate() {
            let low = base + k as u32 * per_agent;
            cluster.agent_starts.push((
                attributes.clone(),
                (low as u16, (low + per_agent - 1) as u16),
                config.agent_config.clone(),
            ));
        }
        cluster.start_master()?;
        start_agents(&mut cluster, config.agents.len())?;
        Ok(cluster)
    }

    /// The cluster's directory: master and agent data, logs, sandboxes.
    pub fn dir(&self) -> &Path {
        temp_dir_path(&self.dir)
    }

    /// The cluster CA in `<dir>/tls`, the master's certificate for 127.0.0.1 and
    /// one certificate per agent for the agent id written to its data dir
    /// (`bb-agent-K`).
    fn make_certificates(&mut self, agents: usize) -> anyhow::Result<()> {
        let ca = make_certificates(self.dir(), "bb-agent", agents, &[])?;
        self.api.trust_ca(&ca)
    }

    fn start_master(&mut self) -> anyhow::Result<()> {
        let scheme = if self.tls { "https" } else { "http" };
        let (master, addr) = start_master(
            temp_dir_path(&self.dir),
            &self.listen,
            &self.master_env,
            &mut self.api,
            |addr| {
                let addr = addr.trim_start_matches("http://");
                Ok(format!("{scheme}://{addr}"))
            },
        )?;
        // A restarted master must come back on the same address for the agents.
        self.listen = addr.trim_start_matches("http://").to_string();
        self.master = Some(master);
        Ok(())
    }

    /// Starts agent `k` for the first time, as `agent_starts[k]` says: its sandbox
    /// root (0755) and, without TLS, its agent token.
    fn start_agent(&mut self, k: usize) -> anyhow::Result<()> {
        let (attributes, ports, config) = self
            .agent_starts
            .get(k)
            .cloned()
            .ok_or_else(|| anyhow!("no agent {k}"))?;
        let root = self.dir().join("sandboxes").join(format!("agent-{k}"));
        std::fs::create_dir_all(&root)?;
        if !self.tls {
            self.api
                .give_agent_token(&self.dir().join(format!("agent-{k}")))?;
        }
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
        let agent = self.spawn_agent(k, &attributes, ports, &config)?;
        self.agents.push(agent);
        self.sandbox_roots.push(root);
        Ok(())
    }

    fn spawn_agent(
        &self,
        k: usize,
        attributes: &[(String, String)],
        ports: (u16, u16),
        config: &str,
    ) -> anyhow::Result<Proc> {
        let root = self.dir().join("sandboxes").join(format!("agent-{k}"));
        let mut command = if self.agent_cgroup.is_empty() {
            Command::new(bin("drover-agent")?)
        } else {
            // The same pid joins each cgroup, then becomes the agent.
            let joins: String = self
                .agent_cgroup
                .iter()
                .map(|f| format!("echo $$ > '{}' && ", f.display()))
                .collect();
            let mut c = Command::new("/bin/sh");
            c.arg("-c")
                .arg(format!("{joins}exec \"$@\""))
                .arg("drover-agent")
                .arg(bin("drover-agent")?);
            c
        };
        if self.tls {
            let tls = self.dir().join("tls");
            command
                .arg("--tls-ca")
                .arg(tls.join("ca.pem"))
                .arg("--tls-cert")
                .arg(tls.join(format!("agent-bb-agent-{k}.pem")))
                .arg("--tls-key")
                .arg(tls.join(format!("agent-bb-agent-{k}.key")));
        }
        if !config.is_empty() {
            let file = self.dir().join(format!("agent-{k}.toml"));
            std::fs::write(&file, config)?;
            command.arg("--config").arg(file);
        }
        command
            .arg("--master")
            .arg(&self.api.url)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(self.dir().join(format!("agent-{k}")))
            .arg("--sandbox-root")
            .arg(&root)
            .arg("--executor")
            .arg(bin("drover-executor")?)
            .arg("--cpu")
            .arg("4")
            .arg("--ram")
            .arg("4GiB")
            .arg("--disk")
            .arg("16GiB")
            .arg("--ports")
            .arg(format!("{}-{}", ports.0, ports.1))
            .arg("--hostname")
            .arg(format!("agent-{k}"))
            .arg("--shutdown-marker")
            .arg(self.shutdown_marker(k))
            .env("RUST_LOG", "info");
        if let Some(env) = self.agent_env.get(k) {
            command.envs(env.iter().map(|(k, v)| (k, v)));
        }
        if !attributes.iter().any(|(name, _)| name == "host") {
            command.arg("--attribute").arg(format!("host=agent-{k}"));
        }
        for (name, value) in attributes {
            command.arg("--attribute").arg(format!("{name}={value}"));
        }
        let log = self.dir().join(format!("logs/agent-{k}.log"));
        Proc::spawn(&format!("drover-agent {k}"), command, &log)
    }

    /// Kills agent `k` (SIGKILL: a crash); its executors keep running, as after a
    /// real crash. `start_agent_again` starts it with the same settings.
    pub fn kill_agent(&mut self, k: usize) {
        if let Some(agent) = self.agents.get_mut(k) {
            agent.kill();
        }
    }

    /// Starts agent `k` again after `kill_agent`, with the same settings and dirs.
    pub fn start_agent_again(&mut self, k: usize) -> anyhow::Result<()> {
        let (attributes, ports, config) = self
            .agent_starts
            .get(k)
            .cloned()
            .ok_or_else(|| anyhow!("no agent {k}"))?;
        self.agents[k] = self.spawn_agent(k, &attributes, ports, &config)?;
        Ok(())
    }

    /// Stops the master (SIGTERM) and starts it again on the same address and data.
    /// (If it does not exit within 5 s of SIGTERM it is killed: a restart after a
    /// crash must keep every acknowledged change too.)
    pub fn restart_master(&mut self) -> anyhow::Result<()> {
        self.stop_master(Duration::from_secs(5));
        self.start_master()
    }

    /// SIGTERMs the master; its exit status if it exited within `grace`, else None
    /// (then it was SIGKILLed).
    pub fn stop_master(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.master.take().and_then(|mut master| master.stop(grace))
    }

    /// Starts the master again after `stop_master`, on the same address and data.
    pub fn start_master_again(&mut self) -> anyhow::Result<()> {
        self.start_master()
    }

    /// The master's process, e.g. to check it is still running.
    pub fn master(&mut self) -> Option<&mut Proc> {
        self.master.as_mut()
    }

    /// The file whose existence tells agent `k` at SIGTERM that its host is
    /// shutting down (it then asks for a drain of its host first).
    pub fn shutdown_marker(&self, k: usize) -> PathBuf {
        self.dir().join(format!("agent-{k}.shutting-down"))
    }

    /// SIGTERMs agent `k`; its exit status if it exited within `grace`, else None
    /// (then it was SIGKILLed).
    pub fn stop_agent(&mut self, k: usize, grace: Duration) -> Option<std::process::ExitStatus> {
        self.agents.get_mut(k).and_then(|a| a.stop(grace))
    }

    /// The pids of the cluster's agents.
    pub fn agent_pids(&self) -> Vec<u32> {
        self.agents.iter().map(Proc::pid).collect()
    }

    /// The task directory of a task (root's; the task's own files are in its
    /// `sandbox/`), on whichever agent ran it.
    pub fn sandbox_of(&self, task_id: &str) -> Option<PathBuf> {
        self.sandbox_roots
            .iter()
            .map(|root| root.join(task_id))
            .find(|dir| dir.is_dir())
    }

    /// Runs the `drover` CLI against this cluster.
    pub fn drover(&self, args: &[&str]) -> anyhow::Result<Output> {
        drover_as(Some(&self.api.url), self.api.token.as_deref(), args)
    }

    /// Writes `spec` to `<cluster dir>/<file>` and runs `drover job create <that file>
    /// --wait --timeout 90s` against this cluster.
    pub fn create_with_cli(&self, file: &str, spec: &Value) -> anyhow::Result<Output> {
        let path = self.dir().join(file);
        std::fs::write(&path, spec.to_string())?;
        let path = path
            .to_str()
            .ok_or_else(|| anyhow!("{} is not UTF-8", path.display()))?;
        self.drover(&["job", "create", path, "--wait", "--timeout", "90s"])
    }

    /// Runs the `drover` CLI against this cluster, killing it after `timeout`.
    pub fn drover_with_timeout(&self, args: &[&str], timeout: Duration) -> anyhow::Result<Output> {
        drover_with_timeout(
            Some(&self.api.url),
            self.api.token.as_deref(),
            args,
            timeout,
        )
    }

    /// Polls `check` every 100 ms until it returns Some, or fails after `timeout`
    /// naming what it waited for, with the master's and agents' log tails.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl FnMut(&Cluster) -> Option<T>,
    ) -> anyhow::Result<T> {
        poll_for(self, what, timeout, check, Cluster::diagnostics)
    }

    /// Waits until every instance's current task of `key` is in `state`.
    pub fn wait_for_all(&mut self, key: &str, state: TaskState) -> anyhow::Result<JobView> {
        let key = key.to_string();
        self.wait_for(
            &format!("every instance of {key} to be {state}"),
            WAIT,
            move |c| {
                let view = c.job(&key).ok()?;
                let all = !view.instances.is_empty()
                    && view
                        .instances
                        .iter()
                        .all(|i| i.current.as_ref().is_some_and(|t| t.state == state));
                all.then_some(view)
            },
        )
    }

    /// The end of every daemon's log and the master's view of jobs and agents.
    pub fn diagnostics(&mut self) -> String {
        let mut out = String::new();
        if let Ok(jobs) = self.get::<Value>("/v1/jobs") {
            out.push_str(&format!("--- jobs: {jobs}\n"));
            for job in jobs.as_array().into_iter().flatten() {
                if let Some(key) = job.get("key").and_then(Value::as_str) {
                    if let Ok(view) = self.get::<Value>(&format!("/v1/jobs/{key}")) {
                        out.push_str(&format!("--- {key}: {}\n", summarize_job(&view)));
                    }
                }
            }
        }
        if let Some(master) = self.master.as_mut() {
            let state = if master.is_running() {
                "running"
            } else {
                "EXITED"
            };
            out.push_str(&format!(
                "--- master ({state}) log:\n{}\n",
                master.log_tail()
            ));
        }
        for agent in &mut self.agents {
            let state = if agent.is_running() {
                "running"
            } else {
                "EXITED"
            };
            out.push_str(&format!(
                "--- {} ({state}) log:\n{}\n",
                agent.name,
                agent.log_tail()
            ));
        }
        out
    }
}

impl std::ops::Deref for Cluster {
    type Target = AdminApi;

    fn deref(&self) -> &AdminApi {
        &self.api
    }
}

impl Harness for Cluster {
    fn start_agent(&mut self, k: usize) -> anyhow::Result<()> {
        Cluster::start_agent(self, k)
    }

    fn diagnostics(&mut self) -> String {
        Cluster::diagnostics(self)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        end_cluster(
            "test cluster",
            self.agents.iter_mut(),
            self.master.as_mut(),
            &mut self.dir,
            &self.sandbox_roots,
            reap::Parent::Shared("drover"),
        );
    }
}

/// A test cluster as the start both harnesses share sees it ([`start_agents`]).
trait Harness: std::ops::Deref<Target = AdminApi> {
    /// Starts agent `k`, prepared before.
    fn start_agent(&mut self, k: usize) -> anyhow::Result<()>;
    /// The log tails and views printed when a wait times out.
    fn diagnostics(&mut self) -> String;
}

/// The second half of a test cluster's start (both harnesses; the first is
/// [`start_master`]): agents `0..running`, then the wait until that many are
/// registered and reachable.
fn start_agents<H: Harness>(cluster: &mut H, running: usize) -> anyhow::Result<()> {
    for k in 0..running {
        cluster.start_agent(k)?;
    }
    poll_for(
        cluster,
        "every agent to register",
        WAIT,
        |c| registered(c, running),
        H::diagnostics,
    )
}

/// The first half of a test cluster's start (both harnesses; the second is
/// [`start_agents`]), and its master's restart: starts the master in `dir`
/// ([`spawn_master_with_env`]), points `api` at the address `url` makes of the one
/// it bound, waits until it answers `/health` and takes the admin token it wrote.
/// Returns the process and its bound address.
fn start_master(
    dir: &Path,
    listen: &str,
    env: &[(String, String)],
    api: &mut AdminApi,
    url: impl FnOnce(&str) -> anyhow::Result<String>,
) -> anyhow::Result<(Proc, String)> {
    let (master, addr) = spawn_master_with_env(dir, listen, env)?;
    api.url = url(&addr)?;
    let mut started = (&*api, master);
    poll_for(
        &mut started,
        "the master to answer /health",
        WAIT,
        |(api, _)| api.healthy().then_some(()),
        |(_, master)| format!("--- master log:\n{}\n", master.log_tail()),
    )?;
    let (_, master) = started;
    api.use_admin_token(&dir.join("master"))?;
    Ok((master, addr))
}

/// A test cluster's temporary directory (both harnesses, `Cluster` and
/// `netns::NetCluster`): named `<prefix>...`, marked as this checkout's for the
/// reaper, 0755 like its `master`, `logs` and `sandboxes` directories (task
/// processes run as www-data and must reach their sandbox), with `master.toml`.
fn cluster_dir(prefix: &str, master_config: &str) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    reap::mark_checkout(dir.path())?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(dir.path().join("master.toml"), master_config)?;
    for sub in ["master", "logs", "sandboxes"] {
        std::fs::create_dir_all(dir.path().join(sub))?;
        std::fs::set_permissions(dir.path().join(sub), std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}

/// Whether at least `n` agents are registered and reachable (a cluster's start
/// waits for this).
fn registered(api: &AdminApi, n: usize) -> Option<()> {
    let agents = api.agents().ok()?;
    (agents.iter().filter(|a| a.reachable).count() >= n).then_some(())
}

/// The end of a test cluster (both harnesses' `Drop`, pass or fail): its agents
/// killed first (an agent would start executors again), then the master, then
/// whatever the tasks left swept by working directory and cgroup (executors, task
/// processes, the task cgroups under the agents' `parent`, and the parent itself when
/// it is the cluster's own); the directory goes too unless `DROVER_KEEP_TEST_DIRS`.
fn end_cluster<'a>(
    what: &str,
    agents: impl Iterator<Item = &'a mut Proc>,
    master: Option<&mut Proc>,
    dir: &mut Option<tempfile::TempDir>,
    roots: &[PathBuf],
    parent: reap::Parent<'_>,
) {
    for agent in agents {
        agent.kill();
    }
    if let Some(master) = master {
        master.kill();
    }
    reap::sweep_cluster(what, temp_dir_path(dir), roots, parent);
    keep_temp_dir_if_asked(dir);
}

/// The path of a cluster's temporary directory (`/nonexistent` once it was kept).
fn temp_dir_path(dir: &Option<tempfile::TempDir>) -> &Path {
    dir.as_ref()
        .map(|d| d.path())
        .unwrap_or(Path::new("/nonexistent"))
}

/// With `DROVER_KEEP_TEST_DIRS` set, keeps a cluster's temporary directory (and says
/// where) instead of letting it be removed on drop.
fn keep_temp_dir_if_asked(dir: &mut Option<tempfile::TempDir>) {
    if std::env::var_os("DROVER_KEEP_TEST_DIRS").is_some() {
        if let Some(kept) = dir.take() {
            eprintln!("kept {}", kept.keep().display());
        }
    }
}

/// One line per instance: task, state and history count.
fn summarize_job(view: &Value) -> String {
    let mut parts = Vec::new();
    for instance in view["instances"].as_array().into_iter().flatten() {
        let current = &instance["current"];
        parts.push(format!(
            "[{} {} {} reason={} pending={} history={}]",
            instance["instance"],
            current["task_id"],
            current["state"],
            current["exit_reason"],
            current["pending_reason"],
            instance["history"].as_array().map(Vec::len).unwrap_or(0)
        ));
    }
    parts.join(" ")
}

/// Whether `pid` runs drover-executor (not a reused pid).
pub use drover::procs::is_executor;

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The processes whose working directory is under `dir` (task processes run in
/// their sandbox).
pub fn processes_under(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let cwd = std::fs::read_link(entry.path().join("cwd")).ok()?;
            (cwd.starts_with(dir) && pid != std::process::id() && process_alive(pid)).then_some(pid)
        })
        .collect()
}

/// SIGKILLs every process whose cwd is under `dir`.
pub fn kill_processes_under(dir: &Path) {
    for pid in processes_under(dir) {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

/// A small HTTP service in python3 for task processes: GET /health answers `ok`,
/// POST /quitquitquit exits 0, anything else answers `hello`; every POSTed path is
/// appended to `lifecycle.log` in the working directory (the sandbox). Takes the
/// port as its argument.
pub const PY_SERVICE: &str = r#"import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def answer(s, body):
        s.send_response(200)
        s.send_header("Content-Length", str(len(body)))
        s.end_headers()
        s.wfile.write(body)
    def do_GET(s):
        s.answer(b"ok" if s.path == "/health" else b"hello")
    def do_POST(s):
        with open("lifecycle.log", "a") as f:
            f.write(s.path + "\n")
        s.answer(b"bye")
        if s.path in ("/quitquitquit", "/abortabortabort"):
            os._exit(0)
    def log_message(s, *args):
        pass
print("serving on", sys.argv[1], flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// How many of the job's instances have a current task RUNNING.
pub fn running_instances(view: &JobView) -> usize {
    view.instances
        .iter()
        .filter(|i| {
            i.current
                .as_ref()
                .is_some_and(|t| t.state == TaskState::Running)
        })
        .count()
}

/// A service job (role www-data, env test) running `PY_SERVICE` on port `http` with
/// an HTTP health check and the HTTP lifecycle, with short intervals and waits.
pub fn service_job(name: &str, instances: u32) -> Value {
    json!({
        "role": "www-data",
        "environment": "test",
        "name": name,
        "instances": instances,
        "service": true,
        "task": {
            "processes": [{
                "name": "server",
                "cmdline": format!("exec python3 -c '{PY_SERVICE}' {{{{ports.http}}}}"),
            }],
            "resources": {"cpu": 0.1, "ram": "64MiB", "disk": "64MiB", "ports": ["http"]},
            "finalization_wait": "2s"
        },
        "health_check": {
            "type": "http",
            "port": "http",
            "endpoint": "/health",
            "expected_response": "ok",
            "initial_interval": "10s",
            "interval": "500ms",
            "timeout": "2s",
            "max_consecutive_failures": 5
        },
        "lifecycle": {"http": {
            "port": "http",
            "graceful_shutdown_wait": "1s",
            "shutdown_wait": "1s"
        }}
    })
}

/// A job of one process running `cmdline` (role www-data, env test).
pub fn command_job(name: &str, instances: u32, service: bool, cmdline: &str) -> Value {
    json!({
        "role": "www-data",
        "environment": "test",
        "name": name,
        "instances": instances,
        "service": service,
        "task": {
            "processes": [{"name": "main", "cmdline": cmdline}],
            "resources": {"cpu": 0.1, "ram": "32MiB", "disk": "32MiB"},
            "finalization_wait": "2s"
        }
    })
}

/// The cron firing each run of instance 0 was started for (the Unix ms in its
/// task's first event, "cron firing at N"): the history's newest first, then the
/// current run's.
pub fn cron_firings(view: &JobView) -> Vec<u64> {
    let Some(i) = view.instances.first() else {
        return Vec::new();
    };
    i.history
        .iter()
        .chain(i.current.iter())
        .filter_map(|t| {
            let m = &t.events.first()?.message;
            let rest = &m[m.find("cron firing at ")? + "cron firing at ".len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_jobs_are_valid_specs() {
        for spec in [
            service_job("svc", 3),
            command_job("batch", 2, false, "echo hi"),
        ] {
            let text = spec.to_string();
            if let Err(errors) = drover_common::parse::parse_job("job.json", &text) {
                panic!("{errors}");
            }
        }
    }

    #[test]
    fn python_service_has_no_single_quotes_for_the_shell() {
        assert!(!PY_SERVICE.contains('\''));
        assert!(!PY_SERVICE.contains("{{"));
    }
}
