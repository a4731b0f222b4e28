//! Fault-test harness across real network boundaries: every agent runs in its own
//! network namespace, joined to the master's (root) namespace by a veth pair, so a
//! test can cut an agent off (`ip link set <host veth> down`) and heal it again. Also
//! the invariant checker run after every fault scenario (docs/testing.md).
//!
//! Agents are started with `nsenter --net=/run/netns/NAME` rather than `ip netns
//! exec`: the latter also unshares the mount namespace and remounts /sys, which hides
//! the cgroup mounts from the agent's executors. Each cluster gets its own subnet
//! `10.<a>.<k>.0/24` (agent k; master side `.1`, agent side `.2`) and its own cgroup
//! parent, so tests running in parallel (nextest: one process per test) never see
//! each other's tasks. Everything (processes in the namespaces, cgroups, namespaces,
//! veths) is removed on Drop, also after a panic; subnets left behind by a killed test
//! process are reclaimed by the next allocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use drover_common::state::{DesiredState, TaskState};
use drover_common::wire::TaskView;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::reap::Parent;
use crate::{bin, log_tail, poll_for, process_alive, temp_dir_path, AdminApi, Proc, WAIT};

/// Where subnet claims live: `<a>.pid` holds the pid of the test process using
/// `10.<a>.0.0/16`.
const CLAIMS_DIR: &str = "/run/drover-netns-tests";

/// The second octets handed out to test clusters.
const OCTETS: std::ops::RangeInclusive<u8> = 160..=250;

/// Master config for fault tests: 5 s agent timeout, 300 ms heartbeats, a short
/// restart grace and exclusive lease, fast reconciliation retries.
pub const FAULT_MASTER_CONFIG: &str = r#"
heartbeat_interval = "300ms"
agent_timeout = "5s"
flapping_threshold = "1s"
throttle_initial = "1s"
throttle_max = "2s"
transient_state_timeout = "60s"
restart_grace = "10s"
exclusive_lease = "4s"
missing_grace = "3s"
reconcile_interval = "20s"
reconcile_backoff_initial = "500ms"
reconcile_backoff_max = "4s"
"#;

/// The agents' fallback exclusive lease; the master's `exclusive_lease` in
/// `FAULT_MASTER_CONFIG` (the same value) is what the agents apply.
pub const FAULT_AGENT_LEASE: &str = "4s";

/// Whether network-namespace tests can run here: root, `ip` and `nsenter`. Prints why
/// the test is skipped otherwise.
pub fn netns_available(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping {test}: network-namespace fault tests need root");
        return false;
    }
    for tool in ["ip", "nsenter"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            eprintln!(
                "skipping {test}: `{tool}` is missing (scripts/setup.sh installs iproute2 \
                 and util-linux)"
            );
            return false;
        }
    }
    true
}

/// Runs `ip` with `args`; fails with its stderr.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ip")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `ip` ignoring failures (cleanup).
fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The pids inside network namespace `name`.
pub fn pids_in_netns(name: &str) -> Vec<u32> {
    Command::new("ip")
        .args(["netns", "pids", name])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILLs everything in namespace `name` until nothing is left (at most 10 s).
fn kill_netns_processes(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = pids_in_netns(name);
        let live: Vec<u32> = pids.into_iter().filter(|p| process_alive(*p)).collect();
        if live.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in live {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Names of the namespace and veths of agent `k` in subnet block `octet`.
fn names(octet: u8, k: usize) -> (String, String, String) {
    (
        format!("drv{octet}n{k}"),
        format!("drv{octet}h{k}"),
        format!("drv{octet}a{k}"),
    )
}

/// Removes namespaces and veths of block `octet` (agents 0..32).
fn remove_block(octet: u8) {
    for k in 0..32 {
        let (ns, host, _) = names(octet, k);
        if Path::new("/run/netns").join(&ns).exists() {
            kill_netns_processes(&ns);
            ip_quiet(&["netns", "del", &ns]);
        }
        if Path::new("/sys/class/net").join(&host).exists() {
            ip_quiet(&["link", "del", &host]);
        }
        remove_unreachable_route(octet, k);
    }
}

/// The subnet of agent `k` in block `octet`.
fn subnet(octet: u8, k: usize) -> String {
    format!("10.{octet}.{k}.0/24")
}

/// Removes the `unreachable` route `NetNs::create` added for agent `k`'s subnet.
fn remove_unreachable_route(octet: u8, k: usize) {
    ip_quiet(&[
        "route",
        "del",
        "unreachable",
        &subnet(octet, k),
        "metric",
        "1000",
    ]);
}

/// A claimed `10.<octet>.0.0/16`, released (claim file removed) on Drop.
#[derive(Debug)]
pub(crate) struct SubnetClaim {
    pub(crate) octet: u8,
}

impl SubnetClaim {
    /// Claims a free block under an exclusive lock, reclaiming blocks whose owner died.
    pub(crate) fn take() -> anyhow::Result<(SubnetClaim, Flock<File>)> {
        std::fs::create_dir_all(CLAIMS_DIR)?;
        let lock = File::create(Path::new(CLAIMS_DIR).join("lock"))?;
        let lock = Flock::lock(lock, FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow!("cannot lock {CLAIMS_DIR}/lock: {e}"))?;
        crate::reap::sweep_stale_parents();
        let in_use = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        for octet in OCTETS {
            let claim = Path::new(CLAIMS_DIR).join(format!("{octet}.pid"));
            if let Ok(text) = std::fs::read_to_string(&claim) {
                let owner: u32 = text.trim().parse().unwrap_or(0);
                if owner != 0 && process_alive(owner) {
                    continue;
                }
                // Left behind by a test process that died: take it back.
                remove_block(octet);
                let _ = std::fs::remove_file(&claim);
            }
            if in_use.contains(&format!(" 10.{octet}.")) {
                continue;
            }
            std::fs::write(&claim, std::process::id().to_string())?;
            return Ok((SubnetClaim { octet }, lock));
        }
        bail!("no free 10.X.0.0/16 block for a test cluster (X in {OCTETS:?})")
    }
}

impl Drop for SubnetClaim {
    fn drop(&mut self) {
        remove_block(self.octet);
        let _ = std::fs::remove_file(Path::new(CLAIMS_DIR).join(format!("{}.pid", self.octet)));
    }
}

/// One agent's network namespace and its veth pair.
#[derive(Debug)]
pub struct NetNs {
    /// The namespace's name (`/run/netns/<name>`).
    pub name: String,
    /// The veth end in the root namespace; cut/heal toggles it.
    pub host_veth: String,
    /// The master-side address, `10.a.k.1`.
    pub host_ip: String,
    /// The agent-side address, `10.a.k.2`.
    pub ns_ip: String,
    /// Its subnet block and index (for the `unreachable` route).
    block: (u8, usize),
}

impl NetNs {
    pub(crate) fn create(octet: u8, k: usize) -> anyhow::Result<NetNs> {
        let (name, host, peer) = names(octet, k);
        let ns = NetNs {
            name,
            host_veth: host,
            host_ip: format!("10.{octet}.{k}.1"),
            ns_ip: format!("10.{octet}.{k}.2"),
            block: (octet, k),
        };
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link",
            "add",
            &ns.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            &ns.name,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", ns.host_ip),
            "dev",
            &ns.host_veth,
        ])?;
        ip(&["link", "set", &ns.host_veth, "up"])?;
        // While the link is down its subnet is unreachable, rather than sent to
        // the default route (a gateway there may answer in the agent's place).
        ip(&[
            "route",
            "replace",
            "unreachable",
            &subnet(octet, k),
            "metric",
            "1000",
        ])?;
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{}/24", ns.ns_ip),
            "dev",
            &peer,
        ])?;
        ip(&["-n", &ns.name, "link", "set", &peer, "up"])?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Cuts the namespace off: the host-side veth goes down.
    pub fn cut(&self) -> anyhow::Result<()> {
        ip(&["link", "set", &self.host_veth, "down"])
    }

    /// Heals a cut.
    pub fn heal(&self) -> anyhow::Result<()> {
        ip(&["link", "set", &self.host_veth, "up"])
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        kill_netns_processes(&self.name);
        ip_quiet(&["netns", "del", &self.name]);
        ip_quiet(&["link", "del", &self.host_veth]);
        remove_unreachable_route(self.block.0, self.block.1);
    }
}

/// An agent in its namespace.
#[derive(Debug)]
pub struct NetAgent {
    /// Its namespace (dropped after the process).
    pub ns: NetNs,
    proc: Option<Proc>,
    /// `--config` of the agent.
    pub config: PathBuf,
    /// Its data dir (agent id, outbox).
    pub data_dir: PathBuf,
    /// Its sandbox root.
    pub sandbox_root: PathBuf,
    log: PathBuf,
}

/// Each cluster of this process gets its own cgroup parent.
static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// A master in the root namespace and agents each in their own network namespace.
pub struct NetCluster {
    // Field order is drop order: agents and their namespaces first, the claim last.
    agents: Vec<NetAgent>,
    master: Option<Proc>,
    /// The admin API as seen from the test (`url` is `http://127.0.0.1:PORT`); the
    /// cluster derefs to it.
    pub api: AdminApi,
    port: u16,
    /// The cgroup parent of this cluster's tasks (`drover-t<pid>-<n>`).
    pub cgroup_parent: String,
    dir: Option<tempfile::TempDir>,
    /// Held for its Drop: releases the subnet block.
    _claim: SubnetClaim,
}

impl NetCluster {
    /// Starts a master (config `master_config`) and `n` agents, each in its own
    /// namespace, and waits until every agent is registered and reachable.
    pub fn start(n: usize, master_config: &str) -> anyhow::Result<NetCluster> {
        NetCluster::start_some(n, n, master_config)
    }

    /// Like `start`, but only agents `0..running` are started (and waited for); the
    /// others get their namespace and config and start with `start_agent`, e.g. so
    /// the first jobs all land on agent 0.
    pub fn start_some(n: usize, running: usize, master_config: &str) -> anyhow::Result<NetCluster> {
        let (claim, lock) = SubnetClaim::take()?;
        let octet = claim.octet;
        let dir = crate::cluster_dir("drover-ft-", master_config)?;
        let cgroup_parent = format!(
            "drover-t{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::SeqCst)
        );
        let mut namespaces = Vec::new();
        for k in 0..n {
            namespaces.push(NetNs::create(octet, k)?);
        }
        drop(lock);
        let mut cluster = NetCluster {
            agents: Vec::new(),
            master: None,
            api: AdminApi::new()?,
            port: 0,
            cgroup_parent,
            dir: Some(dir),
            _claim: claim,
        };
        cluster.make_certificates(&namespaces)?;
        cluster.start_master()?;
        for (k, ns) in namespaces.into_iter().enumerate() {
            let agent = cluster.write_agent_config(k, ns)?;
            cluster.agents.push(agent);
        }
        crate::start_agents(&mut cluster, running)?;
        Ok(cluster)
    }

    /// The cluster's temporary directory.
    pub fn dir(&self) -> &Path {
        temp_dir_path(&self.dir)
    }

    /// The cluster CA in `<dir>/tls`, the master's certificate (for 127.0.0.1 and
    /// every namespace's master-side address) and one certificate per agent for the
    /// agent id written to its data dir (`ft-agent-K`).
    fn make_certificates(&mut self, namespaces: &[NetNs]) -> anyhow::Result<()> {
        let hosts: Vec<String> = namespaces.iter().map(|ns| ns.host_ip.clone()).collect();
        let ca = crate::make_certificates(self.dir(), "ft-agent", namespaces.len(), &hosts)?;
        self.api.trust_ca(&ca)
    }

    fn start_master(&mut self) -> anyhow::Result<()> {
        let (master, addr) = crate::start_master(
            temp_dir_path(&self.dir),
            &format!("0.0.0.0:{}", self.port),
            &[],
            &mut self.api,
            |addr| Ok(format!("https://127.0.0.1:{}", master_port(addr)?)),
        )?;
        // A restarted master must come back on the same port for the agents.
        self.port = master_port(&addr)?;
        self.master = Some(master);
        Ok(())
    }

    fn write_agent_config(&self, k: usize, ns: NetNs) -> anyhow::Result<NetAgent> {
        let data_dir = self.dir().join(format!("agent-{k}"));
        let sandbox_root = self.dir().join(format!("sandboxes/agent-{k}"));
        std::fs::create_dir_all(&sandbox_root)?;
        std::fs::set_permissions(
            self.dir().join("sandboxes"),
            std::fs::Permissions::from_mode(0o755),
        )?;
        std::fs::set_permissions(&sandbox_root, std::fs::Permissions::from_mode(0o755))?;
        let config = self.dir().join(format!("agent-{k}.toml"));
        let tls = self.dir().join("tls");
        let text = format!(
            r#"master = "https://{host}:{port}"
tls_ca = "{ca}"
tls_cert = "{cert}"
tls_key = "{key}"
listen = "{ns_ip}:0"
data_dir = "{data}"
sandbox_root = "{sandboxes}"
executor = "{executor}"
cpu = 4.0
ram = "4GiB"
disk = "16GiB"
ports = "20000-20199"
cgroup_parent = "{parent}"
lease = "{lease}"

[attributes]
host = "agent-{k}"
rack = "r{k}"
"#,
            host = ns.host_ip,
            ca = tls.join("ca.pem").display(),
            cert = tls.join(format!("agent-ft-agent-{k}.pem")).display(),
            key = tls.join(format!("agent-ft-agent-{k}.key")).display(),
            port = self.port,
            ns_ip = ns.ns_ip,
            data = data_dir.display(),
            sandboxes = sandbox_root.display(),
            executor = bin("drover-executor")?.display(),
            parent = self.cgroup_parent,
            lease = FAULT_AGENT_LEASE,
        );
        std::fs::write(&config, text)?;
        Ok(NetAgent {
            ns,
            proc: None,
            config,
            data_dir,
            sandbox_root,
            log: self.dir().join(format!("logs/agent-{k}.log")),
        })
    }

    /// Starts agent `k` (again) in its namespace with its config.
    pub fn start_agent(&mut self, k: usize) -> anyhow::Result<()> {
        let agent = self
            .agents
            .get_mut(k)
            .ok_or_else(|| anyhow!("no agent {k}"))?;
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", agent.ns.name))
            .arg("--")
            .arg(bin("drover-agent")?)
            .arg("--config")
            .arg(&agent.config)
            .env("RUST_LOG", "info");
        agent.proc = Some(Proc::spawn(
            &format!("drover-agent {k}"),
            command,
            &agent.log,
        )?);
        Ok(())
    }

    /// `kill -9` of agent k (its executors keep running).
    pub fn kill_agent(&mut self, k: usize) {
        if let Some(mut proc) = self.agents.get_mut(k).and_then(|a| a.proc.take()) {
            proc.kill();
        }
    }

    /// Waits until agent k is registered and reachable.
    pub fn wait_reachable(&mut self, k: usize) -> anyhow::Result<()> {
        self.wait_for(&format!("agent {k} to be reachable"), WAIT, |c| {
            let id = c.agent_id(k).ok()?;
            let agents = c.agents().ok()?;
            agents
                .iter()
                .any(|a| a.agent_id == id && a.reachable)
                .then_some(())
        })
    }

    /// Agent k's namespace.
    pub fn ns(&self, k: usize) -> &NetNs {
        &self.agents[k].ns
    }

    /// Agent k's files.
    pub fn agent(&self, k: usize) -> &NetAgent {
        &self.agents[k]
    }

    /// Agent k's id (from its data dir, else its sandbox root).
    pub fn agent_id(&self, k: usize) -> anyhow::Result<String> {
        let agent = &self.agents[k];
        std::fs::read_to_string(agent.data_dir.join("agent-id"))
            .or_else(|_| std::fs::read_to_string(agent.sandbox_root.join(".agent-id")))
            .map(|s| s.trim().to_string())
            .with_context(|| format!("agent {k} has no id yet"))
    }

    /// `kill -9` of the master.
    pub fn kill_master(&mut self) {
        if let Some(mut master) = self.master.take() {
            master.kill();
        }
    }

    /// SIGTERM to the master (SIGKILL after `grace`).
    pub fn stop_master(&mut self, grace: Duration) {
        if let Some(mut master) = self.master.take() {
            master.stop(grace);
        }
    }

    /// Starts the master again on the same port and data dir.
    pub fn start_master_again(&mut self) -> anyhow::Result<()> {
        self.start_master()
    }

    /// Polls `check` every 100 ms until Some, or fails after `timeout` with logs.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl FnMut(&NetCluster) -> Option<T>,
    ) -> anyhow::Result<T> {
        poll_for(self, what, timeout, check, NetCluster::diagnostics)
    }

    /// The current task of `key`'s instance `instance` once it is in `state`.
    pub fn wait_for_state(
        &mut self,
        key: &str,
        instance: u32,
        state: TaskState,
    ) -> anyhow::Result<TaskView> {
        self.wait_for(&format!("{key}/{instance} to be {state}"), WAIT, |c| {
            let view = c.job(key).ok()?;
            let current = view
                .instances
                .iter()
                .find(|i| i.instance == instance)?
                .current
                .clone()?;
            (current.state == state).then_some(current)
        })
    }

    /// Log tails of every daemon and the master's view of every job.
    pub fn diagnostics(&mut self) -> String {
        let mut out = String::new();
        if let Ok(keys) = self.job_keys() {
            for key in keys {
                if let Ok(view) = self.job(&key) {
                    for instance in &view.instances {
                        for task in instance.current.iter().chain(instance.history.iter()) {
                            out.push_str(&format!(
                                "--- {key}/{} {} {} {:?} on {:?}: {:?}\n",
                                instance.instance,
                                task.task_id,
                                task.state,
                                task.exit_reason,
                                task.agent_id,
                                task.events
                                    .iter()
                                    .map(|e| e.state.as_str())
                                    .collect::<Vec<_>>()
                            ));
                        }
                    }
                }
            }
        }
        if let Some(master) = self.master.as_ref() {
            out.push_str(&format!("--- master log:\n{}\n", master.log_tail()));
        }
        for agent in &self.agents {
            out.push_str(&format!(
                "--- {} log:\n{}\n",
                agent.ns.name,
                log_tail(&agent.log)
            ));
        }
        out
    }

    /// The task cgroups of this cluster and the pids in each (pids controller, or
    /// memory when there is none; v1 layout).
    pub fn task_cgroups(&self) -> BTreeMap<String, Vec<u32>> {
        let mut out = BTreeMap::new();
        let parent = ["pids", "memory"]
            .iter()
            .map(|c| {
                Path::new("/sys/fs/cgroup")
                    .join(c)
                    .join(&self.cgroup_parent)
            })
            .find(|p| p.is_dir());
        let Some(parent) = parent else {
            return out;
        };
        let Ok(entries) = std::fs::read_dir(&parent) else {
            return out;
        };
        for entry in entries.flatten() {
            if !entry.path().is_dir() {
                continue;
            }
            let pids: Vec<u32> = std::fs::read_to_string(entry.path().join("cgroup.procs"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .filter(|p| process_alive(*p))
                .collect();
            out.insert(entry.file_name().to_string_lossy().to_string(), pids);
        }
        out
    }

    /// The live pids in task `id`'s cgroup.
    pub fn task_pids(&self, id: &str) -> Vec<u32> {
        self.task_cgroups().remove(id).unwrap_or_default()
    }

    /// The executor pid of a task from its sandbox (the agent's `agent.json`, else
    /// the executor's `status.json`), if that process is a live executor.
    pub fn executor_pid(&self, id: &str) -> Option<u32> {
        self.agents.iter().find_map(|a| {
            let drover = a.sandbox_root.join(id);
            let from_meta = || {
                let meta: Value =
                    serde_json::from_slice(&std::fs::read(drover.join("agent.json")).ok()?).ok()?;
                Some(meta.get("executor_pid")?.as_u64()? as u32)
            };
            let from_checkpoint = || {
                let bytes = std::fs::read(drover.join("status.json")).ok()?;
                Some(drover_common::wire::checkpointed_status(&bytes)?.executor_pid)
            };
            from_meta()
                .or_else(from_checkpoint)
                .filter(|&pid| crate::is_executor(pid))
        })
    }

    /// The task directory of a task (its working directory is `sandbox/` in it) on
    /// whichever agent has it.
    pub fn sandbox_of(&self, id: &str) -> Option<PathBuf> {
        self.agents
            .iter()
            .map(|a| a.sandbox_root.join(id))
            .find(|d| d.is_dir())
    }

    /// Checks the fault invariants for the acknowledged jobs `acked` (docs/testing.md):
    /// every acked job exists; no task's history moved backwards; then, waiting up to
    /// `settle` for the cluster to converge: each service instance has exactly one
    /// RUNNING task, and every process in this cluster's task cgroups belongs to a
    /// task the master knows as non-terminal, at most one per instance.
    pub fn check_invariants(&mut self, acked: &[String], settle: Duration) -> anyhow::Result<()> {
        let keys = self.job_keys()?;
        for key in acked {
            if !keys.contains(key) {
                bail!("acknowledged job {key} is missing; the master has {keys:?}");
            }
        }
        for key in &keys {
            let view = self.job(key)?;
            for instance in &view.instances {
                for task in instance.current.iter().chain(instance.history.iter()) {
                    check_history(task)?;
                }
            }
        }
        let deadline = Instant::now() + settle;
        loop {
            let last_problem = match self.converged_problem(&keys) {
                Ok(None) => return Ok(()),
                Ok(Some(problem)) => problem,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "invariant violated after {}s: {last_problem}\n{}",
                    settle.as_secs(),
                    self.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What is not (yet) converged, if anything.
    fn converged_problem(&self, keys: &[String]) -> anyhow::Result<Option<String>> {
        for key in keys {
            let view = self.job(key)?;
            if !view.spec.service {
                continue;
            }
            for instance in &view.instances {
                let running = instance
                    .current
                    .iter()
                    .chain(instance.history.iter())
                    .filter(|t| t.state == TaskState::Running)
                    .count();
                // A killed instance (desired SHUTDOWN) must have none, others one.
                let killed = instance
                    .current
                    .as_ref()
                    .is_some_and(|t| t.desired == DesiredState::Shutdown);
                let want = usize::from(!killed);
                if running != want {
                    return Ok(Some(format!(
                        "{key}/{} has {running} RUNNING tasks, not {want}",
                        instance.instance
                    )));
                }
            }
        }
        let mut per_instance: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
        for (id, pids) in self.task_cgroups() {
            if pids.is_empty() {
                continue;
            }
            let Some(task) = self.get_opt::<TaskView>(&format!("/v1/tasks/{id}"))? else {
                return Ok(Some(format!(
                    "processes {pids:?} run in the cgroup of {id}, unknown to the master"
                )));
            };
            if task.state.is_terminal() {
                return Ok(Some(format!(
                    "processes {pids:?} run in the cgroup of {id}, which the master has as {}",
                    task.state
                )));
            }
            per_instance
                .entry((task.job.clone(), task.instance))
                .or_default()
                .push(id);
        }
        for ((job, instance), ids) in per_instance {
            if ids.len() > 1 {
                return Ok(Some(format!(
                    "{job}/{instance} has processes in {} task cgroups: {ids:?}",
                    ids.len()
                )));
            }
        }
        Ok(None)
    }
}

impl std::ops::Deref for NetCluster {
    type Target = AdminApi;

    fn deref(&self) -> &AdminApi {
        &self.api
    }
}

impl crate::Harness for NetCluster {
    fn start_agent(&mut self, k: usize) -> anyhow::Result<()> {
        NetCluster::start_agent(self, k)
    }

    fn diagnostics(&mut self) -> String {
        NetCluster::diagnostics(self)
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        // Everything in the agents' namespaces first (the agents too); then the end
        // every cluster has, for whatever left a namespace's reach or runs in none.
        for agent in &self.agents {
            kill_netns_processes(&agent.ns.name);
        }
        let roots: Vec<PathBuf> = self.agents.iter().map(|a| a.sandbox_root.clone()).collect();
        crate::end_cluster(
            "net cluster",
            self.agents.iter_mut().filter_map(|a| a.proc.as_mut()),
            self.master.as_mut(),
            &mut self.dir,
            &roots,
            Parent::Own(&self.cgroup_parent),
        );
    }
}

/// The port of the master's bound address `addr` (`host:port`, from `master.addr`).
fn master_port(addr: &str) -> anyhow::Result<u16> {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .ok_or_else(|| anyhow!("the master wrote `{addr}` to master.addr, not host:port"))
}

/// Walks a task's events: each step stays in its state or is a legal transition of
/// `drover_common::state`, and time never goes back.
pub fn check_history(task: &TaskView) -> anyhow::Result<()> {
    for pair in task.events.windows(2) {
        let (from, to) = (&pair[0], &pair[1]);
        if from.state != to.state && from.state.check_transition(to.state).is_err() {
            bail!(
                "task {} moved backwards: {} -> {} (events {:?})",
                task.task_id,
                from.state,
                to.state,
                task.events.iter().map(|e| e.state).collect::<Vec<_>>()
            );
        }
        if to.timestamp_ms < from.timestamp_ms {
            bail!("task {} has events out of time order", task.task_id);
        }
    }
    if let Some(last) = task.events.last() {
        if last.state != task.state {
            bail!(
                "task {} is {} but its last event is {}",
                task.task_id,
                task.state,
                last.state
            );
        }
    }
    Ok(())
}

/// Builds a job spec (role www-data, env test) running `cmdline` with tiny resources,
/// a 1 s finalization wait and `partition_policy` as given.
pub fn fault_job(
    name: &str,
    instances: u32,
    service: bool,
    cmdline: &str,
    partition: Value,
) -> Value {
    serde_json::json!({
        "role": "www-data",
        "environment": "test",
        "name": name,
        "instances": instances,
        "service": service,
        "task": {
            "processes": [{"name": "main", "cmdline": cmdline}],
            "resources": {"cpu": 0.01, "ram": "16MiB", "disk": "16MiB"},
            "finalization_wait": "1s"
        },
        "partition_policy": partition
    })
}

/// The job key of `fault_job(name, ..)`.
pub fn key(name: &str) -> String {
    format!("www-data/test/{name}")
}
