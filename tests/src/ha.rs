//! Several masters on a real etcd cluster, for the HA tests: a 3-member etcd
//! (`etcd::EtcdCluster`), `n` drover-masters with `--store etcd://...` on fixed
//! loopback ports and one agent given every master's URL. The token registry is
//! in etcd, shared by the masters: the first master is started alone so the
//! bootstrap admin token is written to its data dir, creates the agent's token,
//! then the others join.
//!
//! With `HaOptions::netns` each master runs in a network namespace of its own
//! (`netns::NetNs`), joined to the root namespace (etcd, the agent, the test) by
//! a veth pair: `cut_master` takes the link down, a network partition of that
//! master from everything else, and `heal_master` brings it back.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use std::collections::BTreeSet;

use anyhow::{bail, Context};
use drover_common::state::TaskState;
use drover_common::wire::JobView;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use crate::etcd::{free_ports, EtcdCluster, EtcdSettings};
use crate::netns::{NetNs, SubnetClaim};
use crate::{bin, AdminApi, Proc, TEST_MASTER_CONFIG, WAIT};

/// The agent's id.
pub const AGENT_ID: &str = "ha-agent-0";

/// The port masters listen on inside their own network namespaces.
const NETNS_MASTER_PORT: u16 = 7070;

/// How an `HaCluster` is set up.
#[derive(Clone, Debug)]
pub struct HaOptions {
    /// How many masters.
    pub masters: usize,
    /// Every master's config file (TOML).
    pub master_config: String,
    /// Each master in a network namespace of its own, cut off by `cut_master`.
    pub netns: bool,
    /// How etcd runs (3 members by default; `hosts` is set here for `netns`).
    pub etcd: EtcdSettings,
}

impl HaOptions {
    /// `masters` masters with `TEST_MASTER_CONFIG` on loopback.
    pub fn new(masters: usize) -> HaOptions {
        HaOptions {
            masters,
            master_config: TEST_MASTER_CONFIG.to_string(),
            netns: false,
            etcd: EtcdSettings {
                members: 3,
                ..EtcdSettings::default()
            },
        }
    }
}

/// The masters' network namespaces (master k in `namespaces[k]`) and the
/// subnet block they use, released when dropped.
struct MasterNets {
    namespaces: Vec<NetNs>,
    _claim: SubnetClaim,
}

/// The etcd cluster, the masters and the agent.
pub struct HaCluster {
    /// The etcd members.
    pub etcd: EtcdCluster,
    masters: Vec<Option<Proc>>,
    /// Each master's URL (`http://127.0.0.1:PORT`).
    pub urls: Vec<String>,
    agent: Option<Proc>,
    /// The bootstrap admin token (the same on every master).
    pub token: String,
    /// With `HaOptions::netns`: dropped after the masters (it kills what is
    /// left in the namespaces).
    net: Option<MasterNets>,
    dir: tempfile::TempDir,
}

impl HaCluster {
    /// Starts etcd (3 members), `masters` masters and one agent; waits until one
    /// master leads and the agent registered.
    pub fn start(masters: usize) -> anyhow::Result<HaCluster> {
        HaCluster::start_with(HaOptions::new(masters))
    }

    /// Like `start`, set up as `options` say.
    pub fn start_with(options: HaOptions) -> anyhow::Result<HaCluster> {
        let masters = options.masters;
        let dir = tempfile::Builder::new().prefix("drover-ha-").tempdir()?;
        crate::reap::mark_checkout(dir.path())?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        for sub in ["logs", "sandbox"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
            std::fs::set_permissions(dir.path().join(sub), std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::write(dir.path().join("master.toml"), &options.master_config)?;
        let net = if options.netns {
            let (claim, lock) = SubnetClaim::take()?;
            let namespaces = (0..masters)
                .map(|k| NetNs::create(claim.octet, k))
                .collect::<anyhow::Result<Vec<_>>>()?;
            drop(lock);
            Some(MasterNets {
                namespaces,
                _claim: claim,
            })
        } else {
            None
        };
        let (etcd, urls) = match &net {
            Some(net) => {
                let hosts: Vec<String> = net.namespaces.iter().map(|n| n.host_ip.clone()).collect();
                let urls = net
                    .namespaces
                    .iter()
                    .map(|n| format!("http://{}:{NETNS_MASTER_PORT}", n.ns_ip))
                    .collect();
                let settings = EtcdSettings {
                    hosts,
                    ..options.etcd.clone()
                };
                (EtcdCluster::start_with(dir.path(), &settings)?, urls)
            }
            None => {
                let urls = free_ports(masters)?
                    .iter()
                    .map(|p| format!("http://127.0.0.1:{p}"))
                    .collect();
                (EtcdCluster::start_with(dir.path(), &options.etcd)?, urls)
            }
        };
        let mut cluster = HaCluster {
            etcd,
            masters: (0..masters).map(|_| None).collect(),
            urls,
            agent: None,
            token: String::new(),
            net,
            dir,
        };
        // The first master alone: it leads and creates the tokens (in etcd).
        cluster.start_master(0)?;
        cluster.wait_leader(WAIT)?;
        let mut api = AdminApi::new()?;
        api.url = cluster.urls[0].clone();
        api.use_admin_token(&cluster.master_dir(0))?;
        cluster.token = api.token.clone().unwrap_or_default();
        let agent_dir = cluster.dir.path().join("agent");
        std::fs::create_dir_all(&agent_dir)?;
        std::fs::write(agent_dir.join("agent-id"), format!("{AGENT_ID}\n"))?;
        let token = api.create_token(&json!({"kind": "agent"}))?;
        drover::credentials::write_token_file(&agent_dir.join("agent.token"), &token)?;
        for k in 1..masters {
            cluster.start_master(k)?;
        }
        cluster.wait_leader(WAIT)?;
        cluster.start_agent()?;
        cluster.wait_for("the agent to register", WAIT, |c| {
            let agents: Vec<Value> = c.get("/v1/agents").ok()?;
            agents
                .iter()
                .any(|a| a["reachable"] == json!(true))
                .then_some(())
        })?;
        Ok(cluster)
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn master_dir(&self, k: usize) -> PathBuf {
        self.dir.path().join(format!("master-{k}"))
    }

    /// Starts master `k` (again).
    pub fn start_master(&mut self, k: usize) -> anyhow::Result<()> {
        let listen = self.urls[k].trim_start_matches("http://").to_string();
        let (mut command, store) = match &self.net {
            Some(net) => {
                let ns = &net.namespaces[k];
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net=/run/netns/{}", ns.name))
                    .arg("--")
                    .arg(bin("drover-master")?)
                    // Plain HTTP on the veth, inside this test's own namespaces.
                    .arg("--insecure");
                (command, self.etcd.store_url_via(&ns.host_ip))
            }
            None => (Command::new(bin("drover-master")?), self.etcd.store_url()),
        };
        command
            .arg("--config")
            .arg(self.dir.path().join("master.toml"))
            .arg("--store")
            .arg(store)
            .arg("--listen")
            .arg(&listen)
            .arg("--data-dir")
            .arg(self.master_dir(k))
            .env("RUST_LOG", "info,drover_master::leader=debug");
        let log = self.dir.path().join(format!("logs/master-{k}.log"));
        self.masters[k] = Some(Proc::spawn(&format!("master {k}"), command, &log)?);
        Ok(())
    }

    fn start_agent(&mut self) -> anyhow::Result<()> {
        let mut command = Command::new(bin("drover-agent")?);
        command
            .arg("--master")
            .arg(self.urls.join(","))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(self.dir.path().join("agent"))
            .arg("--sandbox-root")
            .arg(self.dir.path().join("sandbox"))
            .arg("--executor")
            .arg(bin("drover-executor")?)
            .arg("--cpu")
            .arg("64")
            .arg("--ram")
            .arg("64GiB")
            .arg("--disk")
            .arg("64GiB")
            .arg("--hostname")
            .arg("agent-0")
            // "executor started" (debug) counts the launches.
            .env("RUST_LOG", "info,drover_agent::runtime::watching=debug");
        let log = self.dir.path().join("logs/agent.log");
        self.agent = Some(Proc::spawn("agent", command, &log)?);
        Ok(())
    }

    /// The `/health` answer of master `k` (None: no answer).
    pub fn health(&self, k: usize) -> Option<Value> {
        reqwest::blocking::Client::new()
            .get(format!("{}/health", self.urls[k]))
            .timeout(Duration::from_millis(500))
            .send()
            .ok()?
            .json()
            .ok()
    }

    /// The master that says it leads, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.urls.len()).find(|&k| {
            self.health(k)
                .is_some_and(|h| h["leader"] == Value::Bool(true))
        })
    }

    /// Waits until a master leads; returns it.
    pub fn wait_leader(&self, timeout: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(k) = self.leader() {
                return Ok(k);
            }
            if Instant::now() > deadline {
                bail!("no master leads after {timeout:?}\n{}", self.diagnostics());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An admin client of master `k`.
    pub fn api(&self, k: usize) -> anyhow::Result<AdminApi> {
        let mut api = AdminApi::new()?;
        api.url = self.urls[k].clone();
        api.token = Some(self.token.clone());
        Ok(api)
    }

    /// GET `path` from the leader (found again for each call).
    pub fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let k = self.leader().context("no leader")?;
        self.api(k)?.get(path)
    }

    /// Polls `check` every 100 ms until Some or `timeout`.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&HaCluster) -> Option<T>,
    ) -> anyhow::Result<T> {
        let mut me = self;
        crate::poll_for(&mut me, what, timeout, |c| check(c), |c| c.diagnostics())
    }

    /// The pid of master `k`, if it runs.
    pub fn master_pid(&self, k: usize) -> Option<u32> {
        self.masters[k].as_ref().map(Proc::pid)
    }

    /// Cuts master `k` off the network (etcd, the agent, the other masters, the
    /// test): its veth goes down. Only with `HaOptions::netns`.
    pub fn cut_master(&self, k: usize) -> anyhow::Result<()> {
        self.master_ns(k)?.cut()
    }

    /// Heals `cut_master`.
    pub fn heal_master(&self, k: usize) -> anyhow::Result<()> {
        self.master_ns(k)?.heal()
    }

    fn master_ns(&self, k: usize) -> anyhow::Result<&NetNs> {
        self.net
            .as_ref()
            .and_then(|n| n.namespaces.get(k))
            .with_context(|| format!("master {k} has no network namespace (HaOptions::netns)"))
    }

    /// SIGKILLs master `k`.
    pub fn kill_master(&mut self, k: usize) {
        if let Some(mut m) = self.masters[k].take() {
            m.kill();
        }
    }

    /// Sends `signal` to master `k` (SIGSTOP, SIGCONT).
    pub fn signal_master(&self, k: usize, signal: Signal) {
        if let Some(pid) = self.master_pid(k) {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    /// The job `www-data/test/<name>` as the leader shows it.
    pub fn job(&self, name: &str) -> anyhow::Result<JobView> {
        self.get(&job_path(name))
    }

    /// Waits until every job in `names` has each instance FINISHED, then checks
    /// that each instance ran exactly one task (no second launch).
    pub fn wait_finished_once(&self, names: &BTreeSet<String>) -> anyhow::Result<()> {
        self.wait_for("every job FINISHED", WAIT * 3, |c| {
            names
                .iter()
                .all(|name| {
                    c.job(name).is_ok_and(|v| {
                        v.instances.iter().all(|i| {
                            i.current
                                .as_ref()
                                .is_some_and(|t| t.state == TaskState::Finished)
                        })
                    })
                })
                .then_some(())
        })?;
        for name in names {
            let view = self.job(name)?;
            for i in &view.instances {
                if !i.history.is_empty() {
                    bail!(
                        "instance {} of {name} ran more than once: {:?}",
                        i.instance,
                        i.history
                    );
                }
            }
        }
        Ok(())
    }

    /// How many executors the agent started so far (one per task launch).
    pub fn launches(&self) -> usize {
        self.agent_log().matches("executor started").count()
    }

    /// The agent's log.
    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("logs/agent.log")).unwrap_or_default()
    }

    /// Master `k`'s log.
    pub fn master_log(&self, k: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("logs/master-{k}.log")))
            .unwrap_or_default()
    }

    /// Every log's tail, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for k in 0..self.urls.len() {
            let path = self.dir.path().join(format!("logs/master-{k}.log"));
            out.push_str(&format!(
                "--- master {k} ({}):\n{}\n",
                self.urls[k],
                crate::log_tail(&path)
            ));
        }
        out.push_str(&format!(
            "--- agent:\n{}\n",
            crate::log_tail(&self.dir.path().join("logs/agent.log"))
        ));
        out.push_str(&self.etcd.logs());
        out
    }

    /// Stops every master and the agent (SIGKILL) and every etcd member.
    pub fn kill_everything(&mut self) {
        for k in 0..self.masters.len() {
            self.kill_master(k);
        }
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        for k in 0..3 {
            self.etcd.kill(k);
        }
    }

    /// Starts every etcd member, every master and the agent again.
    pub fn start_everything(&mut self) -> anyhow::Result<()> {
        for k in 0..3 {
            self.etcd.restart(k)?;
        }
        self.etcd.wait_ready()?;
        for k in 0..self.masters.len() {
            self.start_master(k)?;
        }
        self.wait_leader(WAIT)?;
        self.start_agent()
    }
}

impl Drop for HaCluster {
    /// The agent first (it would start executors again), then its executors and
    /// their tasks (`reap::sweep`); the masters, etcd members and namespaces go with
    /// their fields.
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.kill();
        }
        let sandbox = self.dir.path().join("sandbox");
        crate::reap::sweep_and_report("HA cluster", self.dir.path(), &[sandbox], "drover");
        for k in 0..self.masters.len() {
            self.kill_master(k);
        }
    }
}

/// The API path of job `www-data/test/<name>` (the jobs of `command_job`).
pub fn job_path(name: &str) -> String {
    format!("/v1/jobs/www-data/test/{name}")
}

/// Submits jobs to whichever master leads, moving on when one cannot be reached
/// or refuses as a standby: what the CLI and agents do with a list of masters.
pub struct Submitter {
    urls: Vec<String>,
    token: String,
    http: reqwest::blocking::Client,
    current: usize,
}

/// What became of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged (2xx).
    Ok(Value),
    /// Refused with this status (the master answered; nothing was done).
    Refused(u16, String),
    /// No answer (connection lost): it may or may not have happened.
    Unknown,
}

impl Submitter {
    /// A client of every master of `cluster`.
    pub fn new(cluster: &HaCluster) -> anyhow::Result<Submitter> {
        Ok(Submitter {
            urls: cluster.urls.clone(),
            token: cluster.token.clone(),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .connect_timeout(Duration::from_secs(1))
                .build()?,
            current: 0,
        })
    }

    /// One attempt at `method path` on the current master; moves on after a
    /// refusal by a standby or no answer.
    pub fn once(&mut self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Outcome {
        let url = format!("{}{path}", self.urls[self.current]);
        let mut request = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        match request.send() {
            Ok(r) if r.status().is_success() => Outcome::Ok(r.json().unwrap_or(Value::Null)),
            Ok(r) => {
                let status = r.status().as_u16();
                let leader = r
                    .headers()
                    .get(drover_common::wire::LEADER_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let text = r.text().unwrap_or_default();
                if status == 502 {
                    // A standby's leader took it and was lost: may have happened.
                    self.current = (self.current + 1) % self.urls.len();
                    return Outcome::Unknown;
                }
                if status == 503 {
                    self.current = leader
                        .and_then(|l| self.urls.iter().position(|u| *u == l))
                        .unwrap_or((self.current + 1) % self.urls.len());
                }
                Outcome::Refused(status, text)
            }
            Err(e) => {
                if e.is_connect() {
                    self.current = (self.current + 1) % self.urls.len();
                    // Nothing was sent: certainly not done.
                    return Outcome::Refused(0, e.to_string());
                }
                self.current = (self.current + 1) % self.urls.len();
                Outcome::Unknown
            }
        }
    }

    /// Retries `once` until acknowledged or answered with a client error, for
    /// up to `timeout`; the last outcome.
    pub fn until_done(
        &mut self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Outcome {
        let deadline = Instant::now() + timeout;
        let mut unknown = false;
        loop {
            let outcome = self.once(method.clone(), path, body);
            match &outcome {
                Outcome::Ok(_) => return outcome,
                Outcome::Refused(s, _) if (400..500).contains(s) => {
                    return if unknown { Outcome::Unknown } else { outcome };
                }
                Outcome::Unknown => unknown = true,
                Outcome::Refused(..) => {}
            }
            if Instant::now() > deadline {
                return if unknown { Outcome::Unknown } else { outcome };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
