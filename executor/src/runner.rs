//! The I/O around the pure parts: builds the sandbox and cgroup, starts the processes
//! the [`Machine`] asks for, pumps their output into rotated logs, runs health
//! checks, performs the kill escalation's steps, emits every status (stdout, the
//! checkpoint, the socket) and waits for an agent to read the terminal one.

use std::cell::Cell;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use drover_common::spec::HealthCheckType;
use drover_common::state::{now_ms, ExitReason, TaskState};
use drover_common::wire::{ExecutorStatus, ExecutorTask};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::Signal as SignalStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cgroup::{FsCgroup, TaskCgroup};
use crate::health;
use crate::hub::{self, ClientEvent, Hub};
use crate::machine::{Machine, Millis, Step};
use crate::ns::TaskNamespaces;
use crate::plan::{self, HealthProbe, Plan};
use crate::resident;
use crate::sandbox::{self, Checkpoint, Layout, RotatingLog, TaskUser};
use crate::spawn::{self, Isolation};
use crate::supervisor::{self, Command, Supervisor};

/// A mistake on the executor's command line: the message says which argument and
/// what to do (for `run`'s, also the zygote's answer to a bad request).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// The executor's settings (its command line).
#[derive(Clone, Debug)]
pub struct Options {
    /// The `wire::ExecutorTask` JSON file.
    pub task_file: PathBuf,
    /// The sandbox directory.
    pub sandbox: PathBuf,
    /// Run without cgroups and without switching users.
    pub no_isolation: bool,
    /// Allow a task to run as root when its spec allows it too.
    pub allow_root: bool,
    /// Kill the task when no client was connected for this long.
    pub recovery_timeout: Duration,
    /// The parent cgroup under which `<task_id>` is created.
    pub cgroup_parent: String,
    /// Where the cgroup filesystem is mounted.
    pub cgroup_root: PathBuf,
    /// The host's maximum pids limit per task: a task asking for more
    /// (`task.resources.pids`) fails setup; the default limit is cut to it.
    pub pids_max: u64,
    /// Log rotation: bytes per file.
    pub log_max_bytes: u64,
    /// Log rotation: how many rotated files to keep.
    pub log_keep: u32,
    /// Debugging without an agent: no recovery timeout, exit as soon as the task
    /// ended, stay in the caller's session.
    pub standalone: bool,
    /// An inherited pipe's write end: one byte is written to it and it is closed as
    /// soon as the socket listens, so the agent connects without polling.
    pub ready_fd: Option<i32>,
    /// Another task joined its cgroup moments ago (the fork server forked an executor
    /// < [`crate::zygote::WARM`] before this one), so the kernel's migration lock is
    /// warm and the prewarm thread ([`crate::cgroup::prewarm_migration`]) is skipped.
    pub migration_warm: bool,
    /// How often at most `sandbox/` and `tmp/` are scanned for `resources.disk`
    /// (a scan of a big tree is spaced further, [`crate::disk::next_interval`]).
    pub disk_scan_interval: Duration,
    /// A connected stream socket to the agent (the fork server passes it): served as a
    /// client at once, and the socket is bound only once it closes
    /// ([`hub::Clients::Agent`]), which saves the socket's inode per task.
    pub agent_fd: Option<i32>,
}

/// Why the executor could not start the task at all (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read the task file {path}: {source}")]
    ReadTask {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the task file {path} is not a valid task: {source}")]
    ParseTask {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    /// Boxed, as the plan's: they are the largest, and every setup result carries one.
    #[error(transparent)]
    Namespaces(Box<crate::ns::NsError>),
    #[error(transparent)]
    Plan(Box<crate::plan::PlanError>),
    #[error("cannot open cgroup {path}: {source}")]
    CgroupDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Forward(crate::portfwd::ForwardError),
    #[error("{0}")]
    Other(String),
}

impl From<crate::ns::NsError> for SetupError {
    fn from(e: crate::ns::NsError) -> SetupError {
        SetupError::Namespaces(Box::new(e))
    }
}

impl From<crate::plan::PlanError> for SetupError {
    fn from(e: crate::plan::PlanError) -> SetupError {
        SetupError::Plan(Box::new(e))
    }
}

enum Event {
    Exited {
        idx: usize,
        status: std::io::Result<std::process::ExitStatus>,
    },
    Health(Result<(), health::HealthError>),
    Client(ClientEvent),
    Posted(String),
}

/// The executor: the pure [`Supervisor`] and the I/O that carries out its commands.
struct Runner {
    sup: Supervisor,
    io: RunnerIo,
}

/// Processes, signals, the cgroup, health checks and statuses: the [`supervisor::Io`]
/// of a real task.
struct RunnerIo {
    opts: Options,
    task: ExecutorTask,
    layout: Layout,
    /// `status.json`, appended to by [`RunnerIo::flush`].
    checkpoint: Checkpoint,
    cgroup: Option<FsCgroup>,
    iso: Isolation,
    env: Vec<(String, String)>,
    cmdlines: Vec<String>,
    /// The process names, by index (the machine's).
    names: Vec<String>,
    started_at: Instant,
    seq: u64,
    hub: Hub,
    tx: mpsc::UnboundedSender<Event>,
    health: Option<HealthProbe>,
    oom_seen: u64,
    /// Processes (task processes and shell health checks) spawned into the cgroup so far.
    spawned: usize,
    /// `spawned` when the cgroup was last seen empty: it stays empty until the executor
    /// spawns another process (nothing else moves processes into it), so it need not be
    /// read again (one `cgroup.procs` per controller) on every tick of the escalation.
    empty_at: Cell<Option<usize>>,
    /// The process groups of started processes, tracked only without a cgroup.
    pgids: Vec<i32>,
    /// When `sandbox/` and `tmp/` are next scanned for `resources.disk` (never when
    /// the task has no disk limit).
    disk_due: Option<Instant>,
    /// What the disk scan walks: `sandbox/` and `tmp/data/`.
    disk_dirs: [std::ffi::CString; 2],
    /// The disk scan's hard-linked files (kept across scans: see `disk::usage`).
    disk_seen: Vec<(u64, u64)>,
    /// `resources.disk` as a project quota, where the filesystem keeps them (the scan
    /// runs as well); read every [`crate::quota::POLL`].
    quota: Option<crate::quota::ProjectQuota>,
    /// When the quota's usage is next read.
    quota_due: Option<Instant>,
    /// The named ports of an isolated task, forwarded into its namespace until it ends.
    forwarding: Option<crate::portfwd::Forwarding>,
    /// How `resources.disk` is enforced, in words (the first status says it).
    disk_enforcement: String,
    /// Statuses emitted in this step of the loop and not yet reported: [`RunnerIo::flush`]
    /// checkpoints the latest once, then reports each.
    pending: Vec<ExecutorStatus>,
}

/// Statuses as JSON lines, each serialized once for both the checkpoint and stdout:
/// all of them, and where the last one starts.
fn status_lines(statuses: &[ExecutorStatus]) -> (Vec<u8>, usize) {
    let mut lines = Vec::new();
    let mut last = 0;
    for status in statuses {
        last = lines.len();
        if serde_json::to_writer(&mut lines, status).is_ok() {
            lines.push(b'\n');
        }
    }
    (lines, last)
}

/// Writes JSON lines to stdout, in one write.
fn write_stdout(lines: &[u8]) {
    // The agent may have gone away: a failed write must not stop the task.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(lines);
    let _ = out.flush();
}

/// Takes ownership of a descriptor the caller handed over (`--ready-fd`, the fork
/// server's agent connection) and marks it close-on-exec so that no task process
/// inherits it. None if it is not open.
fn take_inherited_fd(fd: i32) -> Option<std::os::fd::OwnedFd> {
    crate::sys::adopt_fd(fd).ok()
}

/// Loads the task file.
pub fn load_task(path: &std::path::Path) -> Result<ExecutorTask, SetupError> {
    let text = std::fs::read(path).map_err(|source| SetupError::ReadTask {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| SetupError::ParseTask {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs the task to its end. Returns the process exit code: 0 FINISHED, 1 otherwise,
/// 2 when the task could not be set up.
pub fn run(opts: Options) -> i32 {
    resident::single_malloc_arena();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // One executor waits on a handful of descriptors: the default buffer is
        // for 1024 events per wakeup (12 KiB).
        .max_io_events_per_tick(64)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::diag!("drover-executor: cannot build the runtime: {e}");
            return 2;
        }
    };
    let code = rt.block_on(run_async(opts));
    // Not dropped: the process ends right after, and dropping the runtime would first
    // free every task, buffer and registration (the kernel closes the descriptors).
    std::mem::forget(rt);
    code
}

async fn run_async(opts: Options) -> i32 {
    // Before anything else, so that an early SIGTERM starts the escalation instead of
    // killing the executor outright.
    let signals = (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok(),
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok(),
    );
    let task = match load_task(&opts.task_file) {
        Ok(t) => t,
        Err(e) => {
            crate::diag!("drover-executor: {e}");
            return 2;
        }
    };
    if !opts.standalone {
        // Our own session: the agent's death or its terminal's hangup must not reach us.
        let _ = nix::unistd::setsid();
    }
    let mut opts = opts;
    // Processes see the sandbox path (cwd, DROVER_SANDBOX, {{sandbox}}): make it absolute.
    if let Ok(abs) = std::path::absolute(&opts.sandbox) {
        opts.sandbox = abs;
    }
    let layout = Layout::new(&opts.sandbox);
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Taken before setup so that every way out of setup closes it (the agent then
    // sees EOF instead of waiting).
    let ready = opts
        .ready_fd
        .and_then(take_inherited_fd)
        .map(std::fs::File::from);
    let seq_base = task.status_seq_base;
    let mut runner = match Runner::setup(opts, task, layout, tx, ready) {
        // Setup's garbage (the task file, its parse, the sandbox paths) is freed by now,
        // but the heap is trimmed only once the task settles
        // (`resident::release_startup_pages`): a task that ends within seconds, as
        // most batch tasks do, never pays for it.
        Ok(r) => r,
        Err((e, layout, task_id)) => {
            crate::diag!("drover-executor: {e}");
            // Leave a status behind if the sandbox exists, so the agent can tell why.
            let status = ExecutorStatus {
                seq: seq_base + 1,
                task_id,
                state: TaskState::Failed,
                exit_reason: Some(ExitReason::SandboxSetupFailed {
                    error: e.to_string(),
                }),
                message: e.to_string(),
                timestamp_ms: now_ms(),
                executor_pid: std::process::id(),
                processes: Vec::new(),
                escalation: None,
            };
            // Checkpoint first, as for every status (`Runner::flush`), synced: no agent
            // has taken it (`Runner::sync_untaken_terminal`).
            let (line, _) = status_lines(std::slice::from_ref(&status));
            if layout.area().is_dir() {
                let mut checkpoint = Checkpoint::new(layout.status_file());
                let _ = checkpoint
                    .append_line(&line)
                    .and_then(|()| checkpoint.sync());
            }
            write_stdout(&line);
            return 2;
        }
    };
    runner.main_loop(&mut rx, signals).await
}

impl Runner {
    fn setup(
        opts: Options,
        task: ExecutorTask,
        layout: Layout,
        tx: mpsc::UnboundedSender<Event>,
        ready: Option<std::fs::File>,
    ) -> Result<Runner, (SetupError, Layout, String)> {
        let task_id = task.task_id.clone();
        let fail = |e: SetupError, layout: &Layout| (e, layout.clone(), task_id.clone());
        if !drover_common::spec::is_valid_name(&task.task_id) {
            return Err(fail(
                SetupError::Other(format!(
                    "task_id `{}` must be 1-64 of [A-Za-z0-9_.-]",
                    task.task_id
                )),
                &layout,
            ));
        }
        let machine = Machine::new(&task.task)
            .map_err(|e| fail(SetupError::Other(e.to_string()), &layout))?;
        let is_root = nix::unistd::Uid::effective().is_root();
        let cgroup = if opts.no_isolation {
            None
        } else if !is_root {
            return Err(fail(SetupError::Other(
                "the executor is not root, so it can neither create the task's cgroup nor switch to the task user; run it as root, or pass --no-isolation to run without a cgroup as the current user".into()), &layout));
        } else {
            match FsCgroup::detect(&opts.cgroup_root) {
                Some(v) => Some(FsCgroup::new(
                    v,
                    &opts.cgroup_root,
                    &opts.cgroup_parent,
                    &task.task_id,
                )),
                None => {
                    return Err(fail(SetupError::Other(format!(
                        "no usable cgroup filesystem at {} (neither v2 nor v1 with memory and pids); mount it, point --cgroup-root at it, or pass --no-isolation",
                        opts.cgroup_root.display()
                    )), &layout))
                }
            }
        };
        if let Some(cg) = cgroup.as_ref().filter(|_| !opts.migration_warm) {
            crate::cgroup::prewarm_migration(&opts.cgroup_root, cg.version());
        }
        let user: TaskUser = sandbox::resolve_user(&task, task.task.allow_root, opts.allow_root)
            .map_err(|e| {
                use std::os::unix::fs::DirBuilderExt;
                let _ = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(drover_common::layout::ROOT_DIR_MODE)
                    .create(layout.area());
                fail(e.into(), &layout)
            })?;
        layout.create(&user).map_err(|e| fail(e.into(), &layout))?;
        // The agent hands over the task directory's `task.json` itself: no copy needed (one file
        // less to create per task). Compared as absolute paths, like the sandbox's.
        let task_file = std::path::absolute(&opts.task_file).unwrap_or(opts.task_file.clone());
        if task_file != layout.task_file() {
            layout
                .write_task(&task)
                .map_err(|e| fail(e.into(), &layout))?;
        }
        // Started before the cgroup is made, so that the init's mounts overlap it.
        let mut pending_ns = match &cgroup {
            Some(_) => {
                Some(start_namespaces(&layout, &user, &task).map_err(|e| fail(e.into(), &layout))?)
            }
            None => None,
        };
        let Plan {
            limits,
            env,
            cmdlines,
            health,
        } = plan::plan(&task, &layout.work, &user.name, opts.pids_max)
            .map_err(|e| fail(e.into(), &layout))?;
        // A new cgroup's OOM counter starts at 0; a leftover's is read below.
        let mut cgroup_is_new = true;
        if let Some(cg) = &cgroup {
            // A cgroup left over from an earlier executor of this task is emptied and
            // removed first.
            cgroup_is_new = cg
                .create(&limits)
                .map_err(|e| fail(SetupError::Other(e.to_string()), &layout))?;
        }
        let procs_files = cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default();
        let mut iso = Isolation::new(&procs_files, &user);
        if let Some(cg) = &cgroup {
            let ns = pending_ns.take().ok_or_else(|| {
                fail(
                    SetupError::Other("the task's namespaces were not started".into()),
                    &layout,
                )
            })?;
            iso = task_isolation(iso, cg, ns, limits.pids).map_err(|e| fail(e, &layout))?;
        }
        let forwarding = match iso.ns.as_ref().filter(|_| {
            task.task.network == drover_common::spec::Network::Isolated && !task.ports.is_empty()
        }) {
            Some(ns) => {
                let ports: Vec<u16> = task.ports.values().copied().collect();
                Some(
                    crate::portfwd::start(&ports, ns.clone())
                        .map_err(|e| fail(SetupError::Forward(e), &layout))?,
                )
            }
            None => None,
        };
        let oom_seen = match &cgroup {
            Some(c) if !cgroup_is_new => c.oom_kills().unwrap_or(0),
            _ => 0,
        };
        let hub = Hub::default();
        let clients = match opts
            .agent_fd
            .and_then(take_inherited_fd)
            .and_then(hub::adopt_stream)
        {
            Some(agent) => hub::Clients::Agent(agent),
            None => hub::Clients::Listening(bind_socket(&layout.socket()).map_err(|e| {
                fail(
                    SetupError::Other(format!(
                        "cannot listen on {}: {e}",
                        layout.socket().display()
                    )),
                    &layout,
                )
            })?),
        };
        if let Some(mut ready) = ready {
            // The socket accepts from here on (the hub serves it once setup returns).
            let _ = ready.write_all(b"\n");
        }
        let (ctx_tx, mut ctx_rx) = mpsc::unbounded_channel();
        let path = layout.socket();
        let bind = move || bind_socket(&path);
        tokio::spawn(hub::serve_clients(clients, bind, hub.clone(), ctx_tx));
        let fwd = tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = ctx_rx.recv().await {
                if fwd.send(Event::Client(ev)).is_err() {
                    break;
                }
            }
        });
        let names = (0..machine.len())
            .map(|i| machine.name(i).to_string())
            .collect();
        let disk_limit = task.task.resources.disk.bytes();
        let c_path = |p: PathBuf| {
            std::ffi::CString::new(std::os::unix::ffi::OsStringExt::into_vec(
                p.into_os_string(),
            ))
            .unwrap_or_default()
        };
        let disk_dirs = [c_path(layout.work.clone()), c_path(layout.dir.tmp())];
        let disk_interval = opts.disk_scan_interval;
        let (quota, disk_enforcement) = disk_enforcement(&layout, disk_limit, &cgroup, &opts);
        let config = supervisor::Config {
            health_check: task.health_check.clone(),
            http: task.lifecycle.as_ref().and_then(|l| l.http.clone()),
            finalization_wait: task.task.finalization_wait.get(),
            recovery_timeout: opts.recovery_timeout,
            standalone: opts.standalone,
            drain_delay: Duration::from_millis(task.drain_delay_ms.unwrap_or(0)),
        };
        // Numbered after the agent's own STARTING statuses (artifacts being fetched).
        let seq_base = task.status_seq_base;
        Ok(Runner {
            sup: Supervisor::new(machine, config),
            io: RunnerIo {
                opts,
                task,
                checkpoint: Checkpoint::new(layout.status_file()),
                layout,
                cgroup,
                iso,
                env,
                cmdlines,
                names,
                started_at: Instant::now(),
                seq: seq_base,
                hub,
                tx,
                health,
                oom_seen,
                spawned: 0,
                empty_at: Cell::new(None),
                pgids: Vec::new(),
                disk_due: (disk_limit > 0).then(|| Instant::now() + disk_interval),
                disk_dirs,
                disk_seen: Vec::new(),
                quota_due: quota.as_ref().map(|_| Instant::now() + crate::quota::POLL),
                quota,
                disk_enforcement,
                forwarding,
                pending: Vec::new(),
            },
        })
    }

    fn now(&self) -> Millis {
        self.io.now()
    }

    /// Reports what is pending ([`RunnerIo::flush`]), syncing a terminal status no
    /// agent has taken.
    fn flush(&mut self) {
        let sync = self.sup.terminal_untaken();
        self.io.flush(sync);
    }

    async fn main_loop(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: (Option<SignalStream>, Option<SignalStream>),
    ) -> i32 {
        let (mut term, mut int) = signals;
        // Start the first processes before anything else: that is what the task waits
        // for; the STARTING checkpoint follows.
        let isolation = match &self.io.cgroup {
            Some(cg) if self.io.iso.ns.is_some() => {
                if self.io.task.task.network == drover_common::spec::Network::Isolated {
                    format!(
                        "{}, own pid, mount and network namespaces (ports forwarded: {})",
                        cg.describe(),
                        self.io.task.ports.len()
                    )
                } else {
                    format!("{}, own pid and mount namespaces", cg.describe())
                }
            }
            Some(cg) => cg.describe(),
            None => "no isolation (--no-isolation)".into(),
        };
        let ready = format!(
            "sandbox {} ready, {isolation}{}",
            self.io.layout.work.display(),
            self.io.disk_enforcement
        );
        let now = self.now();
        self.sup.begin(now, ready, &mut self.io);
        loop {
            // What the events emitted goes out before `tick` acts (its kill step may
            // wait for the cgroup to empty).
            self.flush();
            let now = self.now();
            self.sup.tick(now, &mut self.io);
            self.flush();
            if self.sup.state().is_terminal() {
                break;
            }
            let deadline = self.sup.next_deadline(self.now());
            let sleep_until = self.io.started_at + Duration::from_millis(deadline);
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ev) => self.handle(ev),
                    None => break,
                },
                _ = tokio::time::sleep_until(sleep_until) => {}
                Some(()) = async { tokio::time::sleep_until(self.io.disk_due?).await; Some(()) } => self.scan_disk(),
                Some(()) = async { tokio::time::sleep_until(self.io.quota_due?).await; Some(()) } => self.poll_quota(),
                Some(_) = async { term.as_mut()?.recv().await } => self.kill_requested("SIGTERM"),
                Some(_) = async { int.as_mut()?.recv().await } => self.kill_requested("SIGINT"),
            }
            // Handle everything already queued before deciding.
            while let Ok(ev) = rx.try_recv() {
                self.handle(ev);
            }
        }
        self.flush();
        self.io.cleanup_cgroup();
        if !self.io.opts.standalone {
            // Keep serving until an agent has read the terminal status.
            while !self.sup.terminal_delivered() {
                self.flush();
                self.io.sync_terminal(self.sup.terminal_untaken());
                let deadline = self.sup.recovery_deadline(self.now());
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Some(ev) => self.handle(ev),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(self.io.started_at + Duration::from_millis(deadline)) => {
                        let now = self.now();
                        if !self.sup.has_clients() && now >= self.sup.recovery_deadline(now) {
                            break;
                        }
                    }
                    // Told to stop again: the status stays in status.json for the agent.
                    Some(_) = async { term.as_mut()?.recv().await } => break,
                    Some(_) = async { int.as_mut()?.recv().await } => break,
                }
            }
        }
        // The socket file stays: closing the listener is enough (a connect is then
        // refused), and an unlink would free an inode per task, which a journal-less
        // ext4 makes every later file creation on the host pay for (see
        // `Checkpoint`). The sandbox GC removes it with the sandbox.
        if self.sup.state() == TaskState::Finished {
            0
        } else {
            1
        }
    }

    /// Scans what the task can write for `resources.disk`; over it, the task is
    /// stopped and ends FAILED with `disk_limit_exceeded`.
    fn scan_disk(&mut self) {
        let began = Instant::now();
        let limit = self.io.task.task.resources.disk.bytes();
        let usage = crate::disk::usage(
            &[&self.io.disk_dirs[0], &self.io.disk_dirs[1]],
            &mut self.io.disk_seen,
        );
        let took = began.elapsed();
        self.io.disk_due = Some(
            Instant::now() + crate::disk::next_interval(took).max(self.io.opts.disk_scan_interval),
        );
        if let Some((used, message)) = crate::disk::over_limit(usage, limit) {
            let now = self.now();
            let reason = ExitReason::DiskLimitExceeded {
                used_bytes: used,
                limit_bytes: limit,
            };
            self.io.disk_due = None;
            self.sup.limit_exceeded(now, reason, message, &mut self.io);
        }
    }

    /// Reads the project quota's usage; over the limit (the kernel refuses the task's
    /// writes by now), and confirmed by a scan of the task's own directories, the task
    /// is stopped and ends FAILED with `disk_limit_exceeded` and the quota's usage.
    fn poll_quota(&mut self) {
        let Some(quota) = &self.io.quota else {
            return;
        };
        self.io.quota_due = Some(Instant::now() + crate::quota::POLL);
        let limit = self.io.task.task.resources.disk.bytes();
        let used = match quota.usage() {
            Ok(n) if n > limit => n,
            _ => return,
        };
        let id = quota.id();
        let scanned = crate::disk::usage(
            &[&self.io.disk_dirs[0], &self.io.disk_dirs[1]],
            &mut self.io.disk_seen,
        );
        if crate::disk::over_limit(scanned, limit).is_none() {
            // Files elsewhere carry this task's id (a task may relabel its own files):
            // not this task's doing; read again at the scan's pace.
            self.io.quota_due = Some(Instant::now() + self.io.opts.disk_scan_interval);
            return;
        }
        let message = format!(
            "disk usage {used} bytes (project quota {id}) is over resources.disk {limit} bytes"
        );
        let reason = ExitReason::DiskLimitExceeded {
            used_bytes: used,
            limit_bytes: limit,
        };
        self.io.disk_due = None;
        self.io.quota_due = None;
        let now = self.now();
        self.sup.limit_exceeded(now, reason, message, &mut self.io);
    }

    /// A signal asked for the kill escalation.
    fn kill_requested(&mut self, from: &str) {
        let now = self.now();
        self.sup
            .kill_requested(now, ExitReason::KilledByRequest, from, &mut self.io);
    }

    fn handle(&mut self, ev: Event) {
        let now = self.now();
        match ev {
            Event::Exited { idx, status } => {
                let reason = self.io.exit_reason(idx, status);
                if reason != (ExitReason::ExitCode { code: 0 }) && self.io.quota_due.is_some() {
                    // A write refused by the quota (`EDQUOT`) may be why it failed: the
                    // task then ends `disk_limit_exceeded`, not with this exit.
                    self.poll_quota();
                }
                self.sup.process_exited(idx, reason);
                // Forget process groups that are gone, so that a recycled id is never
                // signalled (they matter only without a cgroup).
                self.io
                    .pgids
                    .retain(|&g| killpg(Pid::from_raw(g), None).is_ok());
            }
            Event::Health(result) => self.sup.health_result(now, result, &mut self.io),
            Event::Client(ClientEvent::Connected) => self.sup.client_connected(now),
            Event::Client(ClientEvent::Gone) => self.sup.client_gone(now),
            Event::Client(ClientEvent::Kill(reason)) => {
                self.sup
                    .kill_requested(now, reason, "a socket client", &mut self.io)
            }
            Event::Client(ClientEvent::TerminalDelivered) => self.sup.delivered_terminal(),
            Event::Posted(what) => self.sup.posted(now, what, &mut self.io),
        }
    }
}

impl RunnerIo {
    fn now(&self) -> Millis {
        self.started_at.elapsed().as_millis() as Millis
    }

    /// Records a new status (next `seq`). It is reported by the next
    /// [`RunnerIo::flush`], which the loop calls before it waits for anything.
    fn emit(
        &mut self,
        state: TaskState,
        exit_reason: Option<ExitReason>,
        message: String,
        processes: Vec<drover_common::wire::ProcessStatus>,
        escalation: Option<drover_common::wire::EscalationSteps>,
    ) {
        self.seq += 1;
        let status = ExecutorStatus {
            seq: self.seq,
            task_id: self.task.task_id.clone(),
            state,
            exit_reason,
            message,
            timestamp_ms: now_ms(),
            executor_pid: std::process::id(),
            processes,
            escalation: escalation.map(Box::new),
        };
        self.pending.push(status);
    }

    /// Checkpoints the latest pending status (one appended line however many changes
    /// this step made: e.g. STARTING and RUNNING), and only then reports every pending
    /// status, each with its own `seq`, on stdout and the socket. So no change is ever
    /// reported before a checkpoint holding it or a later one. A terminal status no
    /// agent has taken (`sync`, [`Supervisor::terminal_untaken`]) is synced to the disk
    /// first ([`RunnerIo::sync_terminal`]).
    fn flush(&mut self, sync: bool) {
        if self.pending.is_empty() {
            return;
        }
        let (lines, last) = status_lines(&self.pending);
        if let Err(e) = self.checkpoint.append_line(&lines[last..]) {
            crate::diag!(
                "drover-executor: cannot checkpoint {}: {e}",
                self.layout.status_file().display()
            );
        }
        self.sync_terminal(sync);
        write_stdout(&lines);
        for status in self.pending.drain(..) {
            self.hub.publish(status);
        }
    }

    /// Syncs the checkpoint (`fdatasync`) when `untaken`: it holds a terminal status
    /// and no agent is connected to take it. The executor may then wait for one for the
    /// recovery timeout, and the status must outlive a power loss in that time, or a
    /// finished task would be reported LOST and rerun. Called again when the last agent
    /// goes before it read the status. Other checkpoints are not synced: after a host
    /// crash every task that had not ended is LOST whatever its checkpoint says, and a
    /// status an agent takes is in the agent's outbox, fsync'd before it is relayed,
    /// within about a millisecond (so a power loss in that window reports the task
    /// LOST, as for one still running).
    fn sync_terminal(&mut self, untaken: bool) {
        if untaken {
            if let Err(e) = self.checkpoint.sync() {
                crate::diag!(
                    "drover-executor: cannot sync {}: {e}",
                    self.layout.status_file().display()
                );
            }
        }
    }

    /// The process's exit reason ([`crate::exit`]), with the cgroup's OOM counter read
    /// for any end but a success.
    fn exit_reason(
        &mut self,
        idx: usize,
        status: std::io::Result<std::process::ExitStatus>,
    ) -> ExitReason {
        let reason = crate::exit::exit_reason(
            &self.names[idx],
            &self.cmdlines[idx],
            crate::exit::Ended::from_wait(&status),
        );
        if !crate::exit::needs_oom_check(&reason) {
            return reason;
        }
        let now = self.cgroup.as_ref().and_then(|c| c.oom_kills().ok());
        let (reason, seen) = crate::exit::with_oom(reason, self.oom_seen, now);
        self.oom_seen = seen;
        reason
    }

    /// POSTs the lifecycle endpoint of an escalation step; the answer comes back as
    /// [`Event::Posted`].
    fn post(&self, step: Step) {
        let Some(http) = self.task.lifecycle.as_ref().and_then(|l| l.http.as_ref()) else {
            return;
        };
        let endpoint = if step == Step::PostGraceful {
            http.graceful_shutdown_endpoint.clone()
        } else {
            http.shutdown_endpoint.clone()
        };
        let port = self.task.ports.get(&http.port).copied().unwrap_or(0);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let r = health::http_request(port, "POST", &endpoint, Duration::from_secs(1)).await;
            let what = match r {
                Ok(resp) => format!("POST {endpoint} answered {}", resp.code),
                Err(e) => format!("POST {endpoint} failed: {e}"),
            };
            let _ = tx.send(Event::Posted(what));
        });
    }

    /// SIGTERMs the process group and the process of each pid, then what the
    /// processes left behind (the cgroup's pids, or the started process groups).
    fn terminate(&self, pids: &[u32]) {
        for &pid in pids {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        // What the processes left behind gets the same chance to stop.
        if self.cgroup.is_some() {
            for pid in self.cgroup_pids().unwrap_or_default() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        } else {
            for &g in &self.pgids {
                let _ = killpg(Pid::from_raw(g), Signal::SIGTERM);
            }
        }
    }
    /// Whether the task's cgroup holds no process (true without one): known since the
    /// last spawn, else one read (`TaskCgroup::is_empty`: one `cgroup.procs` on v1,
    /// not one per hierarchy). Unreadable counts as empty: it cannot be waited for, and
    /// the kill step and the removal still run.
    fn cgroup_empty(&self) -> bool {
        let Some(cg) = &self.cgroup else {
            return true;
        };
        if self.known_empty() {
            return true;
        }
        match cg.is_empty() {
            Ok(true) => {
                self.mark_empty();
                true
            }
            Ok(false) => false,
            Err(_) => true,
        }
    }

    /// The pids in the task's cgroup (none without one), read only when it is not
    /// empty ([`Runner::cgroup_empty`]).
    fn cgroup_pids(&self) -> Result<Vec<i32>, crate::cgroup::CgroupError> {
        let Some(cg) = &self.cgroup else {
            return Ok(Vec::new());
        };
        if self.cgroup_empty() {
            return Ok(Vec::new());
        }
        let pids = cg.pids()?;
        if pids.is_empty() {
            self.mark_empty();
        }
        Ok(pids)
    }

    /// Records that the cgroup was seen empty ([`Runner::known_empty`]).
    fn mark_empty(&self) {
        self.empty_at.set(Some(self.spawned));
    }

    /// Whether the cgroup was seen empty since the last process was spawned into it.
    fn known_empty(&self) -> bool {
        self.empty_at.get() == Some(self.spawned)
    }

    /// SIGKILLs everything of the task; what could not be killed, in words.
    fn kill_everything(&self) -> Option<String> {
        match &self.cgroup {
            Some(_) if self.known_empty() => {}
            Some(cg) => {
                if let Err(e) = cg.kill_all() {
                    crate::diag!("drover-executor: {e}");
                    return Some(match e {
                        crate::cgroup::CgroupError::NotEmpty { secs, pids, .. } => format!(
                            "{} processes of the task survived {secs}s of SIGKILL (in uninterruptible sleep?), e.g. pids {:?}",
                            pids.len(),
                            &pids[..pids.len().min(5)]
                        ),
                        e => e.to_string(),
                    });
                }
            }
            None => {
                for &g in &self.pgids {
                    let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
                }
            }
        }
        None
    }

    fn cleanup_cgroup(&mut self) {
        if let Some(mut forwarding) = self.forwarding.take() {
            forwarding.stop();
        }
        let _ = self.kill_everything();
        if let Some(ns) = &self.iso.ns {
            ns.end();
        }
        if let Some(quota) = &self.quota {
            quota.remove();
        }
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.remove() {
                crate::diag!("drover-executor: {e}");
            }
        }
    }

    /// Starts process `idx` (its output pumped into its logs, its exit reported as
    /// [`Event::Exited`]): its pid, or why it did not start.
    fn start_process(&mut self, idx: usize) -> Result<u32, ExitReason> {
        let name = self.names[idx].clone();
        let cmdline = self.cmdlines[idx].clone();
        self.spawned += 1;
        let mut cmd = spawn::task_command(&cmdline, &self.layout.work, &self.env, &self.iso)
            .map_err(|e| ExitReason::FailedToStart {
                process: name.clone(),
                error: e.to_string(),
            })?;
        match cmd.spawn() {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                if self.cgroup.is_none() {
                    // Signalled and probed (one kill(2) per exit) only without a cgroup.
                    self.pgids.push(pid as i32);
                }
                let logs = self.layout.logs();
                let (max, keep) = (self.opts.log_max_bytes, self.opts.log_keep);
                if let Some(out) = child.stdout.take() {
                    tokio::spawn(pump(out, logs.join(format!("{name}.stdout")), max, keep));
                }
                if let Some(err) = child.stderr.take() {
                    tokio::spawn(pump(err, logs.join(format!("{name}.stderr")), max, keep));
                }
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let status = child.wait().await;
                    let _ = tx.send(Event::Exited { idx, status });
                });
                Ok(pid)
            }
            Err(e) => Err(ExitReason::FailedToStart {
                process: name,
                error: spawn::spawn_error(&cmdline, &self.layout.work, &e),
            }),
        }
    }

    /// Starts one health check; its result comes back as [`Event::Health`].
    fn check_health(&mut self) {
        let Some(h) = self.health.as_ref() else {
            return;
        };
        let tx = self.tx.clone();
        let timeout = h.timeout;
        match h.kind {
            HealthCheckType::Http => {
                let (port, endpoint, code, body) = (
                    h.port,
                    h.endpoint.clone(),
                    h.expected_code,
                    h.expected_body.clone(),
                );
                tokio::spawn(async move {
                    let r = health::check_http(port, &endpoint, code, &body, timeout).await;
                    let _ = tx.send(Event::Health(r));
                });
            }
            HealthCheckType::Tcp => {
                let port = h.port;
                let prober = self.forwarding.as_ref().map(|f| f.prober());
                tokio::spawn(async move {
                    let r = match prober {
                        Some(p) => health::check_tcp_inside(p, port, timeout).await,
                        None => health::check_tcp(port, timeout).await,
                    };
                    let _ = tx.send(Event::Health(r));
                });
            }
            HealthCheckType::Shell => {
                let shown = h.command.clone().unwrap_or_default();
                self.spawned += 1;
                let cmd = spawn::check_command(&shown, &self.layout.work, &self.env, &self.iso);
                tokio::spawn(async move {
                    let r = health::check_shell(cmd, &shown, timeout).await;
                    let _ = tx.send(Event::Health(r));
                });
            }
        }
    }
}

impl supervisor::Io for RunnerIo {
    fn start(&mut self, idx: usize) -> Result<u32, ExitReason> {
        self.start_process(idx)
    }

    fn residue_alive(&mut self) -> bool {
        match &self.cgroup {
            Some(_) => !self.cgroup_empty(),
            None => self
                .pgids
                .iter()
                .any(|&g| killpg(Pid::from_raw(g), None).is_ok()),
        }
    }

    fn snoozed(&mut self) -> bool {
        self.layout.snoozed()
    }

    fn kill_all(&mut self) -> (Millis, Option<String>) {
        let began = Instant::now();
        let left = self.kill_everything();
        (began.elapsed().as_millis() as Millis, left)
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Emit {
                state,
                exit_reason,
                message,
                processes,
                escalation,
            } => self.emit(state, exit_reason, message, processes, escalation),
            Command::CheckHealth => self.check_health(),
            Command::Post(step) => self.post(step),
            Command::Terminate { pids } => self.terminate(&pids),
            Command::ReleaseStartupPages => {
                resident::release_startup_pages();
            }
        }
    }
}

/// `resources.disk` as a project quota on `sandbox/` and `tmp/data/` where the
/// filesystem keeps them (as root, with a limit); the scan runs either way. What is
/// used, in words for the task's first status.
fn disk_enforcement(
    layout: &Layout,
    limit: u64,
    cgroup: &Option<FsCgroup>,
    opts: &Options,
) -> (Option<crate::quota::ProjectQuota>, String) {
    let scan = format!("a scan every {}s", opts.disk_scan_interval.as_secs_f64());
    if limit == 0 {
        return (None, String::new());
    }
    if cgroup.is_none() {
        return (None, format!(", resources.disk by {scan}"));
    }
    let tmp = layout.dir.tmp();
    match crate::quota::ProjectQuota::enable(layout.area(), &[&layout.work, &tmp], limit) {
        Ok(q) => {
            let text = format!(", resources.disk by project quota {} and {scan}", q.id());
            (Some(q), text)
        }
        Err(why) => (None, format!(", resources.disk by {scan} ({why})")),
    }
}

/// How the task's processes are started under a cgroup: born in it (v2:
/// `CLONE_INTO_CGROUP`) or joining it and checking `pids.current` against `pids`
/// (v1, and v2's fallback), in the task's own namespaces (`ns`, once ready).
fn task_isolation(
    iso: Isolation,
    cg: &FsCgroup,
    ns: crate::ns::PendingNamespaces,
    pids: u64,
) -> Result<Isolation, SetupError> {
    let iso = match cg.version() {
        crate::cgroup::Version::V2 => iso
            .into_cgroup_dir(&cg.dir(""))
            .map_err(|source| SetupError::CgroupDir {
                path: cg.dir(""),
                source,
            })?
            .checking_pids(&cg.dir("").join("pids.current"), pids),
        crate::cgroup::Version::V1 => iso.checking_pids(&cg.dir("pids").join("pids.current"), pids),
    };
    let ns = ns.wait_ready()?;
    Ok(iso.in_namespaces(std::sync::Arc::new(ns)))
}

/// Starts the task's namespaces: their init makes `tmp/` and `tmp/data/` and sets
/// them up while the cgroup is made; [`task_isolation`] waits for it.
fn start_namespaces(
    layout: &Layout,
    user: &TaskUser,
    task: &ExecutorTask,
) -> Result<crate::ns::PendingNamespaces, crate::ns::NsError> {
    let isolated = task.task.network == drover_common::spec::Network::Isolated;
    let data = layout.dir.tmp();
    let outer = data.parent().unwrap_or(layout.area());
    TaskNamespaces::create(layout.area(), outer, (user.uid, user.gid), isolated)
}

/// Copies a process's output into its rotated log file, which (and `logs/` with it)
/// is created on the first byte: a process that prints nothing leaves no file, and
/// readers treat a missing log as an empty one.
async fn pump<R: tokio::io::AsyncRead + Unpin>(mut from: R, path: PathBuf, max: u64, keep: u32) {
    let mut log: Option<RotatingLog> = None;
    let mut broken = false;
    // Read into spare capacity: nothing is zeroed (or touched) before output comes.
    let mut buf = Vec::with_capacity(8192);
    loop {
        buf.clear();
        let n = match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // After a failure the output is still drained, so the process never blocks.
        if broken {
            continue;
        }
        if log.is_none() {
            match RotatingLog::open(path.clone(), max, keep) {
                Ok(l) => log = Some(l),
                Err(e) => {
                    crate::diag!("drover-executor: cannot open log {}: {e}", path.display());
                    broken = true;
                    continue;
                }
            }
        }
        if let Some(l) = log.as_mut() {
            if let Err(e) = l.write(&buf[..n]) {
                crate::diag!("drover-executor: writing log {}: {e}", path.display());
                log = None;
                broken = true;
            }
        }
    }
}

/// Binds the executor's socket, through the task directory when the path is too long
/// for a Unix socket address (see `wire::socket_address`), and makes it root's alone
/// (mode 0600). A socket file left by an earlier executor of this task (bind says
/// `EADDRINUSE`) is replaced.
fn bind_socket(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let (address, _dir) =
        drover_common::wire::socket_address(path, |dir| std::fs::File::open(dir))?;
    let listener = match tokio::net::UnixListener::bind(&address) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            std::fs::remove_file(path)?;
            tokio::net::UnixListener::bind(&address)
        }
        other => other,
    }?;
    std::fs::set_permissions(
        &address,
        std::fs::Permissions::from_mode(drover_common::layout::PRIVATE_FILE_MODE),
    )?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_binds_where_it_belongs_even_past_sun_path_max() {
        let dir = tempfile::tempdir().unwrap();
        let area = dir.path().join("d".repeat(120)).join("t");
        std::fs::create_dir_all(&area).unwrap();
        let socket = area.join("executor.sock");
        assert!(socket.as_os_str().len() > drover_common::wire::SUN_PATH_MAX);
        let _listener = bind_socket(&socket).unwrap();
        assert!(socket.exists(), "the socket file is in the sandbox");
        let short = dir.path().join("executor.sock");
        let _short_listener = bind_socket(&short).unwrap();
        assert!(short.exists());
    }

    #[tokio::test]
    async fn a_socket_file_left_by_an_earlier_executor_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("executor.sock");
        drop(bind_socket(&socket).unwrap());
        assert!(
            socket.exists(),
            "closing leaves the file, as an exited executor does"
        );
        let _again = bind_socket(&socket).unwrap();
        std::os::unix::net::UnixStream::connect(&socket).unwrap();
    }
}
