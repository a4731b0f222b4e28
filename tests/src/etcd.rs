//! A real etcd cluster for tests: `n` members of Debian's `etcd` (installed by
//! scripts/setup.sh) on loopback, on free ports, with data dirs under the test's
//! temporary dir, killed when dropped. Members can be killed and started again.
//! Members may also listen on further local addresses (the root-namespace ends of
//! network-namespace veths) so masters in namespaces reach them.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::Proc;

/// Where `free_ports` picks: below the kernel's ephemeral range (32768 and up),
/// so no outgoing connection of a test running beside this one takes a port
/// between the pick and the server's bind; above the netns harness' task ports
/// (20000-20199) and apart from the agents' default task ports (31000-32000).
const FREE_PORTS: std::ops::Range<u16> = 21_000..31_000;

/// `n` loopback ports free when picked (held together while picked, so they
/// differ), from [`FREE_PORTS`], starting at a place that differs between test
/// processes so parallel tests rarely try the same ones.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let span = u32::from(FREE_PORTS.end - FREE_PORTS.start);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    let mut listeners: Vec<TcpListener> = Vec::with_capacity(n);
    for k in 0..span {
        if listeners.len() == n {
            break;
        }
        let port = FREE_PORTS.start + ((seed.wrapping_add(k)) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(l);
        }
    }
    if listeners.len() < n {
        bail!("fewer than {n} free loopback ports in {FREE_PORTS:?}");
    }
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?)
}

/// Whether the `etcd` binary is installed (scripts/setup.sh installs it).
pub fn etcd_installed() -> bool {
    Command::new("etcd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    data_dir: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

/// How a test etcd cluster runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Members.
    pub members: usize,
    /// Each member's `--quota-backend-bytes` (etcd's default when None): a small
    /// quota makes etcd raise its NOSPACE alarm soon.
    pub quota_backend_bytes: Option<u64>,
    /// Further addresses every member's client port listens on.
    pub hosts: Vec<String>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial: String,
    token: String,
    quota_backend_bytes: Option<u64>,
    /// Further addresses every member's client port listens on.
    hosts: Vec<String>,
}

impl EtcdCluster {
    /// Starts `n` members under `dir` and waits until the cluster answers.
    pub fn start(dir: &Path, n: usize) -> anyhow::Result<EtcdCluster> {
        EtcdCluster::start_with(
            dir,
            &EtcdSettings {
                members: n,
                ..EtcdSettings::default()
            },
        )
    }

    /// Starts a cluster as `settings` say under `dir` and waits until it answers.
    pub fn start_with(dir: &Path, settings: &EtcdSettings) -> anyhow::Result<EtcdCluster> {
        let n = settings.members;
        if !etcd_installed() {
            bail!("etcd is not installed: run scripts/setup.sh (Debian package etcd-server)");
        }
        std::fs::create_dir_all(dir.join("logs"))?;
        let ports = free_ports(2 * n)?;
        let members: Vec<Member> = (0..n)
            .map(|k| Member {
                name: format!("etcd{k}"),
                client: ports[2 * k],
                peer: ports[2 * k + 1],
                data_dir: dir.join(format!("etcd{k}")),
                log: dir.join(format!("logs/etcd{k}.log")),
                proc: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("drover-test-{}", ports[0]);
        let mut cluster = EtcdCluster {
            members,
            initial,
            token,
            quota_backend_bytes: settings.quota_backend_bytes,
            hosts: settings.hosts.clone(),
        };
        for k in 0..n {
            cluster.spawn(k)?;
        }
        cluster.wait_ready()?;
        Ok(cluster)
    }

    fn spawn(&mut self, k: usize) -> anyhow::Result<()> {
        let m = &mut self.members[k];
        let client = format!("http://127.0.0.1:{}", m.client);
        let listen: Vec<String> = std::iter::once(client.clone())
            .chain(
                self.hosts
                    .iter()
                    .map(|h| format!("http://{h}:{}", m.client)),
            )
            .collect();
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let mut command = Command::new("etcd");
        command
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .arg("--listen-client-urls")
            .arg(listen.join(","))
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(&self.initial)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.token)
            // Loopback: quick heartbeats so a killed member is noticed fast.
            .arg("--heartbeat-interval")
            .arg("100")
            .arg("--election-timeout")
            .arg("1000")
            .arg("--log-level")
            .arg("warn");
        if let Some(bytes) = self.quota_backend_bytes {
            command.arg("--quota-backend-bytes").arg(bytes.to_string());
        }
        m.proc = Some(Proc::spawn(&m.name, command, &m.log)?);
        Ok(())
    }

    /// `host:port` of each member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect()
    }

    /// The master's `--store` value for this cluster.
    pub fn store_url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The `--store` value for a master reaching the members at `host` (one of
    /// `EtcdSettings::hosts`).
    pub fn store_url_via(&self, host: &str) -> String {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{host}:{}", m.client))
            .collect();
        format!("etcd://{}", endpoints.join(","))
    }

    /// SIGKILLs member `k`.
    pub fn kill(&mut self, k: usize) {
        if let Some(mut p) = self.members[k].proc.take() {
            p.kill();
        }
    }

    /// Starts member `k` again on its data dir (after `kill`).
    pub fn restart(&mut self, k: usize) -> anyhow::Result<()> {
        self.kill(k);
        self.spawn(k)
    }

    /// Waits until every running member reports itself healthy.
    pub fn wait_ready(&mut self) -> anyhow::Result<()> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        for m in &mut self.members {
            let Some(proc) = m.proc.as_mut() else {
                continue;
            };
            let url = format!("http://127.0.0.1:{}/health", m.client);
            loop {
                let healthy = http
                    .get(&url)
                    .send()
                    .ok()
                    .and_then(|r| r.json::<EtcdHealth>().ok())
                    .is_some_and(|h| h.health == "true");
                if healthy {
                    break;
                }
                if !proc.is_running() || Instant::now() > deadline {
                    bail!(
                        "etcd member {} did not become healthy; its log:\n{}",
                        m.name,
                        proc.log_tail()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The logs of every member (for failure messages).
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("--- {}:\n{}", m.name, crate::log_tail(&m.log)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A client of the cluster (in a runtime of its own) for checks.
    pub fn client(&self) -> anyhow::Result<EtcdClient> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let endpoints: Vec<String> = self
            .endpoints()
            .iter()
            .map(|e| format!("http://{e}"))
            .collect();
        let client = runtime
            .block_on(etcd_client::Client::connect(endpoints, None))
            .context("connect to etcd")?;
        Ok(EtcdClient { runtime, client })
    }
}

/// A blocking etcd client for test checks.
pub struct EtcdClient {
    runtime: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

impl EtcdClient {
    /// Every key under `prefix` with its value and mod revision.
    pub fn list(&mut self, prefix: &str) -> anyhow::Result<Vec<(String, String, i64)>> {
        let options = etcd_client::GetOptions::new().with_prefix();
        let resp = self
            .runtime
            .block_on(self.client.get(prefix, Some(options)))?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.mod_revision(),
                )
            })
            .collect())
    }

    /// Puts `key`.
    pub fn put(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        self.runtime.block_on(self.client.put(key, value, None))?;
        Ok(())
    }

    /// The cluster's current revision.
    pub fn revision(&mut self) -> anyhow::Result<i64> {
        let resp = self.runtime.block_on(self.client.get("/", None))?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Runs `f` with the async client on this client's runtime.
    pub fn run<T>(
        &mut self,
        f: impl AsyncFnOnce(&mut etcd_client::Client) -> Result<T, etcd_client::Error>,
    ) -> anyhow::Result<T> {
        Ok(self.runtime.block_on(f(&mut self.client))?)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for k in 0..self.members.len() {
            self.kill(k);
        }
    }
}

/// The body of etcd's own `GET /health` (`{"health":"true","reason":""}`). It is
/// etcd's contract, not Drover's, and only this harness reads it, so it lives here
/// rather than in `common/src/wire.rs`; fields it does not name are ignored.
#[derive(serde::Deserialize)]
struct EtcdHealth {
    health: String,
}
