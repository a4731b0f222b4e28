//! The `drover-agent` binary: flags and config file, tracing, then the agent runs
//! until SIGTERM or Ctrl-C. Exits 64 naming the field on bad configuration.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use drover_agent::config::{parse_attribute, ConfigFile, HostFacts};

/// Drover's per-host agent.
#[derive(Debug, Parser)]
#[command(name = "drover-agent", version, about)]
struct Args {
    /// TOML config file; its keys mirror these flags.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Master URL, e.g. http://10.0.0.1:7070 (masters on etcd: several, separated by commas).
    #[arg(long)]
    master: Option<String>,
    /// Address of the log server, e.g. 0.0.0.0:7071 or 127.0.0.1:0.
    #[arg(long)]
    listen: Option<String>,
    /// URL the master and CLI use to reach this agent (default from --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// Agent state: id, outbox, bound address.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// File with this agent's token for the master (default <data-dir>/agent.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The cluster CA (PEM) for an https master.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// This agent's certificate (PEM) for an https master.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// One sandbox per task below this directory.
    #[arg(long)]
    sandbox_root: Option<PathBuf>,
    /// Path of drover-executor (default: beside this binary, else PATH).
    #[arg(long)]
    executor: Option<PathBuf>,
    /// CPUs to offer.
    #[arg(long)]
    cpu: Option<f64>,
    /// RAM to offer, e.g. 16GiB.
    #[arg(long)]
    ram: Option<String>,
    /// Disk to offer, e.g. 100GiB.
    #[arg(long)]
    disk: Option<String>,
    /// Ports to offer, LO-HI.
    #[arg(long)]
    ports: Option<String>,
    /// An attribute k=v (repeatable), e.g. rack=r1.
    #[arg(long = "attribute", value_parser = parse_attribute)]
    attributes: Vec<(String, String)>,
    /// The host name reported to the master (default: the machine's).
    #[arg(long)]
    hostname: Option<String>,
    /// On host shutdown, wait this long for the master to drain this host, e.g. 2m;
    /// 0s: no self-drain.
    #[arg(long)]
    shutdown_drain_timeout: Option<String>,
    /// A file whose existence at SIGTERM means the host is shutting down.
    #[arg(long)]
    shutdown_marker: Option<PathBuf>,
    /// Run executors with --no-isolation (no cgroups or user switch).
    #[arg(long)]
    no_isolation: bool,
    /// Run executors with --allow-root.
    #[arg(long)]
    allow_root: bool,
    /// Kill exclusive tasks after this long without the master, e.g. 10s, unless
    /// the master sends its own exclusive lease.
    #[arg(long)]
    lease: Option<String>,
    /// Keep sandboxes of finished tasks this long, e.g. 1h.
    #[arg(long)]
    sandbox_retention: Option<String>,
    /// Task cgroups inside the agent's own (delegated) cgroup: auto (when systemd
    /// started the agent and its cgroup allows it), on or off.
    #[arg(long, value_name = "auto|on|off")]
    cgroup_delegate: Option<String>,
    /// Fork executors from a resident `drover-executor zygote` (true, the default)
    /// or exec each one (false).
    #[arg(long, value_name = "BOOL", env = "DROVER_EXECUTOR_FORK_SERVER")]
    executor_fork_server: Option<bool>,
}

impl Args {
    fn into_overrides(self) -> (Option<PathBuf>, ConfigFile) {
        let over = ConfigFile {
            master: self.master,
            masters: None,
            listen: self.listen,
            advertise: self.advertise,
            data_dir: self.data_dir,
            token_file: self.token_file,
            tls_ca: self.tls_ca,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            sandbox_root: self.sandbox_root,
            executor: self.executor,
            cpu: self.cpu,
            ram: self.ram,
            disk: self.disk,
            ports: self.ports,
            attributes: (!self.attributes.is_empty())
                .then(|| self.attributes.into_iter().collect()),
            hostname: self.hostname,
            shutdown_drain_timeout: self.shutdown_drain_timeout,
            shutdown_marker: self.shutdown_marker,
            no_isolation: self.no_isolation.then_some(true),
            allow_root: self.allow_root.then_some(true),
            lease: self.lease,
            sandbox_retention: self.sandbox_retention,
            executor_fork_server: self.executor_fork_server,
            cgroup_delegate: self.cgroup_delegate,
            ..ConfigFile::default()
        };
        (self.config, over)
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(drover_agent::unpack::SUBCOMMAND) {
        // The agent's helper that writes an artifact into a sandbox as the task user.
        return match drover_agent::unpack::main(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let (file, over) = Args::parse().into_overrides();
    let base = match file {
        Some(path) => match ConfigFile::load(&path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("drover-agent: {e}");
                return ExitCode::from(64);
            }
        },
        None => ConfigFile::default(),
    };
    let cfg = match base.overlay(over).resolve(&HostFacts::detect()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("drover-agent: {e}");
            return ExitCode::from(64);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drover-agent: cannot start the async runtime: {e}");
            return ExitCode::from(70);
        }
    };
    let shutdown = {
        let _runtime = rt.enter();
        shutdown_signal()
    };
    match rt.block_on(drover_agent::run(cfg, shutdown)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drover-agent: {e}");
            // A setting that cannot work on this host: restarting will not help.
            let bad_setting = matches!(
                e,
                drover_agent::AgentError::Cgroup(drover_agent::cgroup::PlaceError::Plan(_))
            );
            ExitCode::from(if bad_setting { 64 } else { 1 })
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed here, in the runtime's
/// context, not when the future is first polled: a signal that arrives while the agent
/// is still starting (its log server may already answer) stops it cleanly instead of
/// killing it.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = wait(term) => {}
            _ = wait(int) => {}
        }
    }
}
