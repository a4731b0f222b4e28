//! The agent's configuration: a TOML file whose keys mirror the command-line flags,
//! flags overriding the file, then defaults taken from the host (cpu count, memory,
//! hostname). Every problem names the field at fault so the main can exit 64.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drover_common::units::{setting, ByteSize, Duration as SpecDuration, SettingError};
use serde::Deserialize;

/// The agent's settings as written in the TOML file or given as flags; every key is
/// optional and a flag wins over the file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Master base URL, e.g. `http://10.0.0.1:7070` (several masters on etcd:
    /// separated by commas, or `masters`).
    pub master: Option<String>,
    /// The masters sharing an etcd store, e.g. `["http://10.0.0.1:7070",
    /// "http://10.0.0.2:7070"]`: the agent finds the leader among them. `master`
    /// (flag or key) wins when both are set.
    pub masters: Option<Vec<String>>,
    /// Address the log server binds, e.g. `0.0.0.0:7071` or `127.0.0.1:0`.
    pub listen: Option<String>,
    /// URL the master and CLI use to reach this agent's log server; default:
    /// `http://<listen>` (the hostname when listening on 0.0.0.0 / ::).
    pub advertise: Option<String>,
    /// Where the agent keeps its id, outbox and bound address.
    pub data_dir: Option<PathBuf>,
    /// File holding this agent's token for the master (`drv_...`, from `drover
    /// token create --role agent`); default `<data_dir>/agent.token`.
    pub token_file: Option<PathBuf>,
    /// The cluster CA (PEM) the master's certificate must chain to (https master).
    pub tls_ca: Option<PathBuf>,
    /// This agent's certificate (PEM, `drover tls issue agent <agent id>`); with
    /// tls_key, presented to an https master instead of a token.
    pub tls_cert: Option<PathBuf>,
    /// The private key of tls_cert (PEM).
    pub tls_key: Option<PathBuf>,
    /// One sandbox per task lives below this directory.
    pub sandbox_root: Option<PathBuf>,
    /// Path of the `drover-executor` binary.
    pub executor: Option<PathBuf>,
    /// CPUs offered to tasks.
    pub cpu: Option<f64>,
    /// RAM offered, e.g. `16GiB`.
    pub ram: Option<String>,
    /// Disk offered, e.g. `100GiB`.
    pub disk: Option<String>,
    /// Port range offered, `LO-HI`.
    pub ports: Option<String>,
    /// Attributes such as `rack = "r1"`.
    pub attributes: Option<BTreeMap<String, String>>,
    /// The host name reported to the master (operators name hosts by it in
    /// maintenance commands); default: the machine's host name.
    pub hostname: Option<String>,
    /// Pass `--no-isolation` to executors (no cgroups, no user switch).
    pub no_isolation: Option<bool>,
    /// Pass `--allow-root` to executors: tasks may run as root (the spec must say
    /// `task.allow_root` too). Without it no task runs as root, whatever
    /// `task_users` says.
    pub allow_root: Option<bool>,
    /// The Unix users this agent runs tasks as, by name or uid range, e.g.
    /// `["www-data", "1000-60000"]`; default: `nobody`, `www-data` and every uid
    /// from 1000. An assignment for any other user is refused (FAILED), whatever
    /// the master says.
    pub task_users: Option<Vec<String>>,
    /// Executor `--recovery-timeout`, e.g. `15m`.
    pub executor_recovery_timeout: Option<String>,
    /// The name of the cgroup that holds the task cgroups (executor
    /// `--cgroup-parent`; default `drover`): at the cgroup root, or inside the
    /// agent's delegated cgroup (see `cgroup_delegate`).
    pub cgroup_parent: Option<String>,
    /// Whether task cgroups go inside the agent's own (delegated) cgroup: `auto`
    /// (the default: when systemd started the agent and its cgroup allows it),
    /// `on` or `off` (at the cgroup root). See `crate::cgroup`.
    pub cgroup_delegate: Option<String>,
    /// The largest pids limit a task may ask for (`task.resources.pids`); executor
    /// `--pids-max`.
    pub max_task_pids: Option<u64>,
    /// Executor `--log-max-size`: rotate process logs at this size, e.g. `100MiB`.
    pub executor_log_max_size: Option<String>,
    /// Executor `--log-max-files`: rotated log files kept per stream.
    pub executor_log_max_files: Option<u32>,
    /// The most the artifact cache (`<data_dir>/artifacts/`) keeps, e.g. `10GiB`.
    pub artifact_cache_size: Option<String>,
    /// The largest artifact fetched, e.g. `1GiB`.
    pub artifact_max_size: Option<String>,
    /// The most all of one task's artifacts may add up to, e.g. `4GiB`.
    pub artifact_task_max_size: Option<String>,
    /// Fork executors from one resident `drover-executor zygote` instead of exec'ing
    /// the binary per task (default true).
    pub executor_fork_server: Option<bool>,
    /// Exclusive tasks are killed after this long without a successful heartbeat,
    /// unless the master sends its own `exclusive_lease` (which wins).
    pub lease: Option<String>,
    /// Sandboxes of terminal tasks no longer assigned are removed after this long.
    pub sandbox_retention: Option<String>,
    /// Long-poll wait sent to the master, e.g. `30s`.
    pub poll_wait: Option<String>,
    /// When the host shuts down, how long the agent waits for the master to drain
    /// its tasks before it exits, e.g. `2m`; `0s` turns self-drain off.
    pub shutdown_drain_timeout: Option<String>,
    /// A file whose existence at SIGTERM means the host is shutting down (for hosts
    /// without systemd).
    pub shutdown_marker: Option<PathBuf>,
    /// Upper bound of the retry backoff towards the master, e.g. `5s`.
    pub max_backoff: Option<String>,
    /// A file holding the bearer token Prometheus sends to read `GET /metrics`
    /// (any secret of 16-256 printable characters); absent: only the master's key
    /// reads it.
    pub metrics_token_file: Option<PathBuf>,
}

/// A resolved, validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub master: String,
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    pub data_dir: PathBuf,
    /// The agent token's file (read at start; missing: requests carry no token).
    pub token_file: PathBuf,
    /// The cluster CA for an https master.
    pub tls_ca: Option<PathBuf>,
    /// The agent's client certificate and key for an https master.
    pub tls_identity: Option<(PathBuf, PathBuf)>,
    pub sandbox_root: PathBuf,
    pub executor: PathBuf,
    pub cpu: f64,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
    pub port_range: (u16, u16),
    pub attributes: BTreeMap<String, String>,
    pub hostname: String,
    pub no_isolation: bool,
    pub allow_root: bool,
    /// The users tasks may run as (`task_users`).
    pub task_users: TaskUsers,
    pub executor_recovery_timeout: Option<Duration>,
    pub cgroup_parent: Option<String>,
    /// Where task cgroups go (`cgroup_delegate`).
    pub cgroup_delegate: crate::cgroup::Delegate,
    /// The largest pids limit a task may ask for.
    pub max_task_pids: u64,
    /// Executor `--log-max-size` in bytes, when set.
    pub executor_log_max_bytes: Option<u64>,
    /// Executor `--log-max-files`, when set.
    pub executor_log_max_files: Option<u32>,
    /// Artifact cache bound and fetch limits, in bytes.
    pub artifacts: ArtifactLimits,
    /// Fork executors from a resident fork server (else exec each).
    pub executor_fork_server: bool,
    /// Fallback exclusive lease for a master that does not send its own.
    pub lease: Duration,
    pub sandbox_retention: Duration,
    pub poll_wait: Duration,
    pub max_backoff: Duration,
    /// Zero: no self-drain on host shutdown.
    pub shutdown_drain_timeout: Duration,
    pub shutdown_marker: Option<PathBuf>,
    /// The file of the token that reads `GET /metrics`.
    pub metrics_token_file: Option<PathBuf>,
    /// What a kill is waited for beyond the escalation's waits
    /// ([`crate::converge::KILL_SLACK`]; not a config key: tests shorten it).
    pub kill_slack: Duration,
}

/// `artifact_cache_size`, `artifact_max_size`, `artifact_task_max_size`, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArtifactLimits {
    pub cache_size: u64,
    pub max_size: u64,
    pub task_max_size: u64,
}

/// A configuration problem, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid `{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

impl From<SettingError> for ConfigError {
    fn from(e: SettingError) -> ConfigError {
        ConfigError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

impl ConfigError {
    /// The field at fault, when one is.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Default master URL when neither the file nor a flag names one.
pub const DEFAULT_MASTER: &str = "http://127.0.0.1:7070";
/// Default log server address.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:7071";
/// Default data dir.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/drover/agent";
/// The agent token's file name inside the data dir (the default `token_file`).
pub const TOKEN_FILE: &str = "agent.token";
/// Default sandbox root.
pub const DEFAULT_SANDBOX_ROOT: &str = "/var/lib/drover/sandboxes";
/// Default of `max_task_pids`.
pub const DEFAULT_MAX_TASK_PIDS: u64 = 4096;

/// Default port range offered to tasks.
pub const DEFAULT_PORTS: (u16, u16) = (31000, 32000);
/// Memory kept back for the host and the agent itself.
pub const RAM_RESERVE: u64 = 512 * 1024 * 1024;
/// CPU kept back for the host and the agent itself.
pub const CPU_RESERVE: f64 = 0.5;
/// Disk offered when the file and flags say nothing.
pub const DEFAULT_DISK: u64 = 10 * 1024 * 1024 * 1024;

impl ConfigFile {
    /// Reads a TOML config file.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Lays `over` on top of `self`: every key set in `over` wins; attributes merge.
    pub fn overlay(mut self, over: ConfigFile) -> ConfigFile {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() { self.$f = over.$f; } )* };
        }
        take!(
            master,
            masters,
            listen,
            advertise,
            data_dir,
            token_file,
            tls_ca,
            tls_cert,
            tls_key,
            sandbox_root,
            executor,
            cpu,
            ram,
            disk,
            ports,
            hostname,
            no_isolation,
            allow_root,
            task_users,
            executor_recovery_timeout,
            cgroup_parent,
            cgroup_delegate,
            max_task_pids,
            executor_log_max_size,
            executor_log_max_files,
            artifact_cache_size,
            artifact_max_size,
            artifact_task_max_size,
            executor_fork_server,
            lease,
            sandbox_retention,
            poll_wait,
            max_backoff,
            shutdown_drain_timeout,
            shutdown_marker,
            metrics_token_file
        );
        if let Some(attrs) = over.attributes {
            self.attributes
                .get_or_insert_with(BTreeMap::new)
                .extend(attrs);
        }
        self
    }

    /// Validates and fills defaults from the host.
    pub fn resolve(self, host: &HostFacts) -> Result<Config, ConfigError> {
        let invalid =
            |field: &'static str, message: String| ConfigError::Invalid { field, message };
        let field = if self.master.is_none() && self.masters.is_some() {
            "masters"
        } else {
            "master"
        };
        let master = self
            .master
            .or(self.masters.map(|m| m.join(",")))
            .unwrap_or_else(|| DEFAULT_MASTER.to_string());
        let urls: Vec<&str> = master
            .split(',')
            .map(|m| m.trim().trim_end_matches('/'))
            .filter(|m| !m.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(invalid(
                field,
                "names no master; write e.g. http://10.0.0.1:7070".to_string(),
            ));
        }
        for url in &urls {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    field,
                    format!("`{url}` is not a URL; write e.g. http://10.0.0.1:7070"),
                ));
            }
        }
        let master = urls.join(",");
        let listen_text = self.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            invalid(
                "listen",
                format!("`{listen_text}` is not an address; write e.g. 0.0.0.0:7071"),
            )
        })?;
        let data_dir = self.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        let token_file = self.token_file.unwrap_or_else(|| data_dir.join(TOKEN_FILE));
        let tls_identity = match (self.tls_cert, self.tls_key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, Some(_)) => {
                return Err(invalid(
                    "tls_cert",
                    "is missing: tls_key needs tls_cert".into(),
                ))
            }
            (Some(_), None) => {
                return Err(invalid(
                    "tls_key",
                    "is missing: tls_cert needs tls_key".into(),
                ))
            }
        };
        let sandbox_root = self
            .sandbox_root
            .unwrap_or_else(|| DEFAULT_SANDBOX_ROOT.into());
        for (field, dir) in [("data_dir", &data_dir), ("sandbox_root", &sandbox_root)] {
            if dir.as_os_str().is_empty() {
                return Err(invalid(field, "must not be empty".into()));
            }
        }
        let executor = match self.executor {
            Some(path) if path.as_os_str().is_empty() => {
                return Err(invalid("executor", "must not be empty".into()))
            }
            Some(path) => path,
            None => host.default_executor.clone(),
        };
        let cpu = self
            .cpu
            .unwrap_or_else(|| (host.cpus as f64 - CPU_RESERVE).max(0.5));
        if !(cpu.is_finite() && cpu > 0.0) {
            return Err(invalid("cpu", format!("{cpu} must be a positive number")));
        }
        let size = |field, text: Option<String>, default| {
            setting(field, text.as_deref(), ByteSize(default)).map(ByteSize::bytes)
        };
        let ram_bytes = size(
            "ram",
            self.ram,
            host.mem_bytes.saturating_sub(RAM_RESERVE).max(64 << 20),
        )?;
        let disk_bytes = size("disk", self.disk, DEFAULT_DISK)?;
        let port_range = match self.ports {
            None => DEFAULT_PORTS,
            Some(t) => parse_port_range(&t).map_err(|m| invalid("ports", m))?,
        };
        let hostname = match self.hostname {
            Some(h) if !drover_common::spec::is_valid_name(&h) => {
                return Err(invalid(
                    "hostname",
                    format!("`{h}` must be 1-64 of A-Z a-z 0-9 _ . -, e.g. web-7"),
                ))
            }
            Some(h) => h,
            None => host.hostname.clone(),
        };
        let mut attributes = self.attributes.unwrap_or_default();
        for (k, v) in &attributes {
            if k.is_empty() || k.contains('=') {
                return Err(invalid(
                    "attributes",
                    format!("`{k}={v}`: attribute names must be non-empty and contain no `=`"),
                ));
            }
        }
        attributes
            .entry("host".to_string())
            .or_insert_with(|| hostname.clone());
        let dur = |field, text: Option<String>, default| {
            setting(field, text.as_deref(), SpecDuration(default)).map(SpecDuration::get)
        };
        let executor_recovery_timeout = match self.executor_recovery_timeout {
            None => None,
            Some(t) => Some(dur("executor_recovery_timeout", Some(t), Duration::ZERO)?),
        };
        if let Some(parent) = &self.cgroup_parent {
            if !drover_common::spec::is_valid_name(parent) {
                return Err(invalid(
                    "cgroup_parent",
                    format!("`{parent}` must be a name of [A-Za-z0-9_.-], 1-64 chars"),
                ));
            }
        }
        let cgroup_delegate = match &self.cgroup_delegate {
            None => crate::cgroup::Delegate::default(),
            Some(text) => text.parse().map_err(|e| invalid("cgroup_delegate", e))?,
        };
        let max_task_pids = self.max_task_pids.unwrap_or(DEFAULT_MAX_TASK_PIDS);
        if !(1..=drover_common::spec::MAX_PIDS).contains(&max_task_pids) {
            return Err(invalid(
                "max_task_pids",
                format!(
                    "{max_task_pids} must be between 1 and {}, e.g. 4096",
                    drover_common::spec::MAX_PIDS
                ),
            ));
        }
        let task_users = match &self.task_users {
            None => TaskUsers::default(),
            Some(entries) => TaskUsers::parse(entries).map_err(|m| invalid("task_users", m))?,
        };
        let executor_log_max_bytes = match self.executor_log_max_size {
            None => None,
            Some(t) => Some(size("executor_log_max_size", Some(t), 0)?),
        };
        if executor_log_max_bytes == Some(0) {
            return Err(invalid(
                "executor_log_max_size",
                "must be above 0B, e.g. 100MiB".into(),
            ));
        }
        let artifacts = ArtifactLimits {
            cache_size: size("artifact_cache_size", self.artifact_cache_size, 10 << 30)?,
            max_size: size("artifact_max_size", self.artifact_max_size, 1 << 30)?,
            task_max_size: size(
                "artifact_task_max_size",
                self.artifact_task_max_size,
                4 << 30,
            )?,
        };
        for (field, v) in [
            ("artifact_max_size", artifacts.max_size),
            ("artifact_task_max_size", artifacts.task_max_size),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be above 0B, e.g. 1GiB".into()));
            }
        }
        let lease = dur("lease", self.lease, Duration::from_secs(10))?;
        let sandbox_retention = dur(
            "sandbox_retention",
            self.sandbox_retention,
            Duration::from_secs(3600),
        )?;
        let poll_wait = dur("poll_wait", self.poll_wait, Duration::from_secs(30))?;
        let max_backoff = dur("max_backoff", self.max_backoff, Duration::from_secs(5))?;
        let shutdown_drain_timeout = dur(
            "shutdown_drain_timeout",
            self.shutdown_drain_timeout,
            Duration::from_secs(120),
        )?;
        if lease.is_zero() {
            return Err(invalid("lease", "must be longer than 0s, e.g. 10s".into()));
        }
        if max_backoff < Duration::from_millis(10) {
            return Err(invalid(
                "max_backoff",
                "must be at least 10ms, e.g. 5s".into(),
            ));
        }
        if tls_identity.is_some() && self.tls_ca.is_none() {
            return Err(invalid(
                "tls_ca",
                "is missing: tls_cert needs the cluster CA (ca.pem of `drover tls init`)".into(),
            ));
        }
        if let Some(a) = &self.advertise {
            if !(a.starts_with("http://") || a.starts_with("https://")) {
                return Err(invalid(
                    "advertise",
                    format!("`{a}` is not a URL; write e.g. http://10.0.0.2:7071"),
                ));
            }
            // With a certificate the log server serves TLS only.
            if tls_identity.is_some() && !a.starts_with("https://") {
                return Err(invalid(
                    "advertise",
                    format!("`{a}` must be https://: with tls_cert the log server serves TLS only"),
                ));
            }
        }
        Ok(Config {
            master,
            listen,
            advertise: self.advertise.map(|a| a.trim_end_matches('/').to_string()),
            data_dir,
            token_file,
            tls_ca: self.tls_ca,
            tls_identity,
            sandbox_root,
            executor,
            cpu,
            ram_bytes,
            disk_bytes,
            port_range,
            attributes,
            hostname,
            no_isolation: self.no_isolation.unwrap_or(false),
            allow_root: self.allow_root.unwrap_or(false),
            task_users,
            executor_recovery_timeout,
            cgroup_parent: self.cgroup_parent,
            cgroup_delegate,
            max_task_pids,
            executor_log_max_bytes,
            artifacts,
            executor_log_max_files: self.executor_log_max_files,
            executor_fork_server: self.executor_fork_server.unwrap_or(true),
            lease,
            sandbox_retention,
            poll_wait,
            max_backoff,
            shutdown_drain_timeout,
            shutdown_marker: self.shutdown_marker,
            metrics_token_file: self.metrics_token_file,
            kill_slack: crate::converge::KILL_SLACK,
        })
    }
}

/// The Unix users an agent runs tasks as (`task_users`): names, and uid ranges.
/// Root is not among them unless `allow_root` (see `host::user_refusal`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskUsers {
    /// Users allowed by name.
    pub names: Vec<String>,
    /// Users allowed by uid, inclusive ranges.
    pub uids: Vec<(u32, u32)>,
}

/// The lowest uid of the default `task_users` range (Debian's first regular user).
pub const FIRST_REGULAR_UID: u32 = 1000;

impl Default for TaskUsers {
    /// `nobody`, `www-data` and every uid from 1000 (but -1).
    fn default() -> TaskUsers {
        TaskUsers {
            names: vec!["nobody".to_string(), "www-data".to_string()],
            uids: vec![(FIRST_REGULAR_UID, u32::MAX - 1)],
        }
    }
}

impl TaskUsers {
    /// Reads `task_users` entries: a user name, a uid (`1234`) or a uid range
    /// (`1000-60000`).
    pub fn parse(entries: &[String]) -> Result<TaskUsers, String> {
        let mut users = TaskUsers {
            names: Vec::new(),
            uids: Vec::new(),
        };
        for entry in entries {
            let e = entry.trim();
            let uid = |t: &str| t.trim().parse::<u32>().ok();
            if let Some((lo, hi)) = e
                .split_once('-')
                .and_then(|(l, h)| Some((uid(l)?, uid(h)?)))
            {
                if lo > hi {
                    return Err(format!(
                        "`{e}`: the range ends below its start; write LOW-HIGH, e.g. 1000-60000"
                    ));
                }
                users.uids.push((lo, hi));
            } else if let Some(n) = uid(e) {
                users.uids.push((n, n));
            } else if drover_common::spec::is_valid_name(e) {
                users.names.push(e.to_string());
            } else {
                return Err(format!(
                    "`{e}` is neither a user name nor a uid range; write e.g. [\"www-data\", \"1000-60000\"]"
                ));
            }
        }
        Ok(users)
    }

    /// For people: `nobody, www-data, uids 1000-4294967294`.
    pub fn describe(&self) -> String {
        let names = self.names.iter().cloned();
        let uids = self.uids.iter().map(|(lo, hi)| {
            if lo == hi {
                format!("uid {lo}")
            } else {
                format!("uids {lo}-{hi}")
            }
        });
        let all: Vec<String> = names.chain(uids).collect();
        if all.is_empty() {
            "none".to_string()
        } else {
            all.join(", ")
        }
    }
}

/// Parses `LO-HI` into an inclusive port range.
pub fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let bad = || format!("`{text}` is not a port range; write e.g. 31000-32000");
    let (lo, hi) = text.split_once('-').ok_or_else(bad)?;
    let lo: u16 = lo.trim().parse().map_err(|_| bad())?;
    let hi: u16 = hi.trim().parse().map_err(|_| bad())?;
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// Parses one `k=v` attribute flag.
pub fn parse_attribute(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!(
            "`{text}` is not an attribute; write key=value, e.g. rack=r1"
        )),
    }
}

/// What the host offers by default, read once at start.
#[derive(Clone, Debug, PartialEq)]
pub struct HostFacts {
    pub cpus: usize,
    pub mem_bytes: u64,
    pub hostname: String,
    pub default_executor: PathBuf,
}

impl HostFacts {
    /// Reads cpu count, MemTotal, the hostname and where `drover-executor` is.
    pub fn detect() -> HostFacts {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let mem_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_mem_total(&t))
            .unwrap_or(1 << 30);
        let hostname = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".to_string());
        HostFacts {
            cpus,
            mem_bytes,
            hostname,
            default_executor: default_executor_path(),
        }
    }
}

/// `MemTotal:  16303412 kB` -> bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `drover-executor` beside the agent's own binary if it is there, else on PATH.
fn default_executor_path() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let candidate = dir.join("drover-executor");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from("drover-executor")
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
