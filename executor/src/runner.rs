//! The I/O around the pure parts: builds the sandbox and cgroup, starts the processes
//! the [`Machine`] asks for, pumps their output into rotated logs, runs health
//! checks, performs the kill escalation's steps, emits every status (stdout, the
//! checkpoint, the socket) and waits for an agent to read the terminal one.

use std::cell::Cell;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use drover_common::spec::{HealthCheck, HealthCheckType};
use drover_common::state::{ExitReason, TaskState};
use drover_common::template::TemplateContext;
use drover_common::wire::{ExecutorStatus, ExecutorTask};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::Signal as SignalStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cgroup::{FsCgroup, Limits, TaskCgroup};
use crate::health::{self, HealthTracker, Verdict};
use crate::hub::{self, ClientEvent, Hub};
use crate::machine::{Escalation, Machine, Millis, Phase, Step};
use crate::resident;
use crate::sandbox::{self, Checkpoint, Layout, RotatingLog, TaskUser};
use crate::spawn::{self, Isolation};

/// How often the runner looks for processes that outlived their parent while it
/// waits for everything to exit.
const RESIDUAL_POLL: Millis = 10;

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
    #[error("{0}")]
    Other(String),
}

enum Event {
    Exited {
        idx: usize,
        status: std::io::Result<std::process::ExitStatus>,
    },
    Health(Result<(), String>),
    Client(ClientEvent),
    Posted(String),
}

struct HealthState {
    spec: HealthCheck,
    tracker: HealthTracker,
    next_at: Millis,
    in_flight: bool,
    port: u16,
    command: Option<String>,
}

struct Runner {
    opts: Options,
    task: ExecutorTask,
    layout: Layout,
    /// `status.json`, appended to by [`Runner::flush`].
    checkpoint: Checkpoint,
    machine: Machine,
    cgroup: Option<FsCgroup>,
    iso: Isolation,
    env: Vec<(String, String)>,
    cmdlines: Vec<String>,
    started_at: Instant,
    state: TaskState,
    seq: u64,
    hub: Hub,
    tx: mpsc::UnboundedSender<Event>,
    health: Option<HealthState>,
    escalation: Option<Escalation>,
    kill_reason: Option<ExitReason>,
    health_failure: Option<ExitReason>,
    oom_seen: u64,
    /// Processes (task processes and shell health checks) spawned into the cgroup so far.
    spawned: usize,
    /// `spawned` when the cgroup was last seen empty: it stays empty until the executor
    /// spawns another process (nothing else moves processes into it), so it need not be
    /// read again (one `cgroup.procs` per controller) on every tick of the escalation.
    empty_at: Cell<Option<usize>>,
    /// The process groups of started processes, tracked only without a cgroup.
    pgids: Vec<i32>,
    clients: usize,
    clients_changed: Millis,
    terminal_delivered: bool,
    message: String,
    process_changed: bool,
    /// Statuses emitted in this step of the loop and not yet reported: [`Runner::flush`]
    /// checkpoints the latest once, then reports each.
    pending: Vec<ExecutorStatus>,
    /// When the task has been RUNNING for [`SETTLE`]: then the pages only starting
    /// needed are released ([`resident::release_startup_pages`]).
    release_at: Option<Millis>,
}

/// How long a task stays RUNNING before its executor counts as settled.
const SETTLE: Millis = 2_000;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
#[allow(unsafe_code)]
fn take_inherited_fd(fd: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd < 3 {
        return None;
    }
    // SAFETY: fcntl only inspects and sets the descriptor flags of `fd`; it fails
    // with EBADF when `fd` is not open, and touches no memory.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return None;
    }
    // SAFETY: the caller handed this descriptor to us for this purpose; it is open
    // (checked above) and nothing else in this process owns it, because each is taken
    // once, before anything else opens files.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
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
                seq: 1,
                task_id,
                state: TaskState::Failed,
                exit_reason: Some(ExitReason::SandboxSetupFailed {
                    error: e.to_string(),
                }),
                message: e.to_string(),
                timestamp_ms: unix_ms(),
                executor_pid: std::process::id(),
                processes: Vec::new(),
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
        let pids = task_pids_limit(task.task.resources.pids, opts.pids_max)
            .map_err(|e| fail(SetupError::Other(e), &layout))?;
        // A new cgroup's OOM counter starts at 0; a leftover's is read below.
        let mut cgroup_is_new = true;
        if let Some(cg) = &cgroup {
            let limits = Limits {
                cpu: task.task.resources.cpu,
                memory_bytes: task.task.resources.ram.bytes(),
                pids,
            };
            // A cgroup left over from an earlier executor of this task is emptied and
            // removed first.
            cgroup_is_new = cg
                .create(&limits)
                .map_err(|e| fail(SetupError::Other(e.to_string()), &layout))?;
        }
        let ctx = TemplateContext {
            role: task.role.clone(),
            environment: task.environment.clone(),
            name: task.name.clone(),
            instance: task.instance,
            task_id: task.task_id.clone(),
            sandbox: layout.work.display().to_string(),
            ports: task.ports.clone(),
        };
        let render = |text: &str, what: String| {
            ctx.render(text)
                .map_err(|e| fail(SetupError::Other(format!("{what}: {e}")), &layout))
        };
        let mut env = ctx.environment();
        env.push(("HOME".into(), layout.work.display().to_string()));
        env.push(("USER".into(), user.name.clone()));
        for (k, v) in &task.task.env {
            env.push((k.clone(), render(v, format!("task.env.{k}"))?));
        }
        let cmdlines = task
            .task
            .processes
            .iter()
            .map(|p| render(&p.cmdline, format!("process `{}` cmdline", p.name)))
            .collect::<Result<Vec<_>, _>>()?;
        let health = match &task.health_check {
            None => None,
            Some(hc) => {
                let port = match hc.kind {
                    HealthCheckType::Shell => 0,
                    _ => *task.ports.get(&hc.port).ok_or_else(|| {
                        fail(SetupError::Other(format!(
                            "health_check.port `{}` has no assigned port number; add it to task.resources.ports and the task's ports",
                            hc.port
                        )), &layout)
                    })?,
                };
                let command =
                    match (&hc.kind, &hc.command) {
                        (HealthCheckType::Shell, Some(c)) => {
                            Some(render(c, "health_check.command".into())?)
                        }
                        (HealthCheckType::Shell, None) => return Err(fail(
                            SetupError::Other(
                                "health_check.type is shell but health_check.command is missing"
                                    .into(),
                            ),
                            &layout,
                        )),
                        _ => None,
                    };
                Some(HealthState {
                    spec: hc.clone(),
                    tracker: HealthTracker::new(
                        0,
                        hc.initial_interval.get(),
                        hc.max_consecutive_failures,
                        hc.min_consecutive_successes,
                    ),
                    next_at: 0,
                    in_flight: false,
                    port,
                    command,
                })
            }
        };
        if let Some(http) = task.lifecycle.as_ref().and_then(|l| l.http.as_ref()) {
            if !task.ports.contains_key(&http.port) {
                return Err(fail(
                    SetupError::Other(format!(
                        "lifecycle.http.port `{}` has no assigned port number",
                        http.port
                    )),
                    &layout,
                ));
            }
        }
        let procs_files = cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default();
        let iso = Isolation::new(&procs_files, &user);
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
        Ok(Runner {
            opts,
            task,
            checkpoint: Checkpoint::new(layout.status_file()),
            layout,
            machine,
            cgroup,
            iso,
            env,
            cmdlines,
            started_at: Instant::now(),
            state: TaskState::Starting,
            seq: 0,
            hub,
            tx,
            health,
            escalation: None,
            kill_reason: None,
            health_failure: None,
            oom_seen,
            spawned: 0,
            empty_at: Cell::new(None),
            pgids: Vec::new(),
            clients: 0,
            clients_changed: 0,
            terminal_delivered: false,
            message: String::new(),
            process_changed: false,
            pending: Vec::new(),
            release_at: None,
        })
    }

    fn now(&self) -> Millis {
        self.started_at.elapsed().as_millis() as Millis
    }

    /// Records a new status (next `seq`). It is reported by the next
    /// [`Runner::flush`], which the loop calls before it waits for anything.
    fn emit(&mut self, state: TaskState, exit_reason: Option<ExitReason>, message: String) {
        self.seq += 1;
        if state != self.state {
            self.release_at = (state == TaskState::Running).then(|| self.now() + SETTLE);
        }
        self.state = state;
        self.message = message.clone();
        let status = ExecutorStatus {
            seq: self.seq,
            task_id: self.task.task_id.clone(),
            state,
            exit_reason,
            message,
            timestamp_ms: unix_ms(),
            executor_pid: std::process::id(),
            processes: self.machine.statuses(),
        };
        self.pending.push(status);
    }

    /// Checkpoints the latest pending status (one appended line however many changes
    /// this step made: e.g. STARTING and RUNNING), and only then reports every pending
    /// status, each with its own `seq`, on stdout and the socket. So no change is ever
    /// reported before a checkpoint holding it or a later one. A terminal status no
    /// agent has taken is synced to the disk first ([`Runner::sync_untaken_terminal`]).
    fn flush(&mut self) {
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
        self.sync_untaken_terminal();
        write_stdout(&lines);
        for status in self.pending.drain(..) {
            self.hub.publish(status);
        }
    }

    /// Syncs the checkpoint (`fdatasync`) when it holds a terminal status and no agent
    /// is connected to take it: the executor may then wait for one for the recovery
    /// timeout, and the status must outlive a power loss in that time, or a finished
    /// task would be reported LOST and rerun. Called again when the last agent goes
    /// before it read the status. Other checkpoints are not synced: after a host crash
    /// every task that had not ended is LOST whatever its checkpoint says, and a status
    /// an agent takes is in the agent's outbox, fsync'd before it is relayed, within
    /// about a millisecond (so a power loss in that window reports the task LOST, as
    /// for one still running).
    fn sync_untaken_terminal(&mut self) {
        if self.state.is_terminal() && self.clients == 0 && !self.terminal_delivered {
            if let Err(e) = self.checkpoint.sync() {
                crate::diag!(
                    "drover-executor: cannot sync {}: {e}",
                    self.layout.status_file().display()
                );
            }
        }
    }

    /// Emits the current state again with the current process list.
    fn emit_same(&mut self, message: String) {
        self.emit(self.state, None, message);
    }

    async fn main_loop(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Event>,
        signals: (Option<SignalStream>, Option<SignalStream>),
    ) -> i32 {
        let (mut term, mut int) = signals;
        // Start the first processes before anything else: that is what the task waits
        // for; the STARTING checkpoint follows.
        let now = self.now();
        for idx in self.machine.to_start(now) {
            self.start_process(idx, now);
        }
        let isolation = match &self.cgroup {
            Some(cg) => cg.describe(),
            None => "no isolation (--no-isolation)".into(),
        };
        self.emit(
            TaskState::Starting,
            None,
            format!("sandbox {} ready, {isolation}", self.layout.work.display()),
        );
        if self.health.is_none() && self.machine.any_running() {
            self.emit(TaskState::Running, None, "processes started".into());
        }
        loop {
            // What the events emitted goes out before `tick` acts (its kill step may
            // wait for the cgroup to empty).
            self.flush();
            if self.tick() {
                self.emit_same("processes changed".into());
            }
            self.flush();
            if self.state.is_terminal() {
                break;
            }
            let deadline = self.next_deadline();
            let sleep_until = self.started_at + Duration::from_millis(deadline);
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ev) => self.handle(ev),
                    None => break,
                },
                _ = tokio::time::sleep_until(sleep_until) => {}
                Some(_) = async { term.as_mut()?.recv().await } => self.request_kill(ExitReason::KilledByRequest, "SIGTERM"),
                Some(_) = async { int.as_mut()?.recv().await } => self.request_kill(ExitReason::KilledByRequest, "SIGINT"),
            }
            // Handle everything already queued before deciding.
            while let Ok(ev) = rx.try_recv() {
                self.handle(ev);
            }
        }
        self.flush();
        self.cleanup_cgroup();
        if !self.opts.standalone {
            // Keep serving until an agent has read the terminal status.
            while !self.terminal_delivered {
                self.flush();
                self.sync_untaken_terminal();
                let deadline = self.recovery_deadline();
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Some(ev) => self.handle(ev),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(self.started_at + Duration::from_millis(deadline)) => {
                        if self.clients == 0 && self.now() >= self.recovery_deadline() {
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
        if self.state == TaskState::Finished {
            0
        } else {
            1
        }
    }

    fn recovery_deadline(&self) -> Millis {
        if self.clients > 0 || self.opts.standalone {
            return self.now() + 3_600_000;
        }
        self.clients_changed + self.opts.recovery_timeout.as_millis() as Millis
    }

    fn next_deadline(&self) -> Millis {
        let now = self.now();
        let mut next = now + 3_600_000;
        if self.escalation.is_none() {
            if let Some(t) = self.machine.next_wakeup(now) {
                next = next.min(t);
            }
            if let Some(h) = &self.health {
                next = next.min(h.next_at);
            }
        } else if self.machine.phase() == Phase::Finalizing {
            if let Some(t) = self.machine.next_wakeup(now) {
                next = next.min(t);
            }
        }
        if let Some(e) = &self.escalation {
            if let Some(d) = e.deadline() {
                next = next.min(d);
            }
            if self.waiting_on_residue() {
                next = next.min(now + RESIDUAL_POLL);
            }
        }
        if !self.opts.standalone {
            next = next.min(self.recovery_deadline());
        }
        if let Some(at) = self.release_at {
            next = next.min(at);
        }
        next
    }

    /// In the escalation, every tracked process exited but something it left behind
    /// (a shell's child, a daemon) may still run.
    fn waiting_on_residue(&self) -> bool {
        match &self.escalation {
            Some(e) if e.deadline().is_some() => match e.step() {
                Step::PostGraceful | Step::PostShutdown => !self.machine.any_regular_running(),
                _ => !self.machine.any_running(),
            },
            _ => false,
        }
    }

    fn residue_alive(&self) -> bool {
        match &self.cgroup {
            Some(_) => !self.cgroup_empty(),
            None => self
                .pgids
                .iter()
                .any(|&g| killpg(Pid::from_raw(g), None).is_ok()),
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Exited { idx, status } => {
                let reason = self.exit_reason(idx, status);
                self.machine.exited(idx, reason);
                self.process_changed = true;
                // Forget process groups that are gone, so that a recycled id is never
                // signalled (they matter only without a cgroup).
                self.pgids
                    .retain(|&g| killpg(Pid::from_raw(g), None).is_ok());
            }
            Event::Health(result) => self.health_result(result),
            Event::Client(ClientEvent::Connected) => {
                self.clients += 1;
                self.clients_changed = self.now();
            }
            Event::Client(ClientEvent::Gone) => {
                self.clients = self.clients.saturating_sub(1);
                self.clients_changed = self.now();
            }
            Event::Client(ClientEvent::Kill(reason)) => {
                self.request_kill(reason, "a socket client")
            }
            Event::Client(ClientEvent::TerminalDelivered) => self.terminal_delivered = true,
            Event::Posted(what) => {
                if !self.state.is_terminal() {
                    self.emit_same(what);
                }
            }
        }
    }

    fn exit_reason(
        &mut self,
        idx: usize,
        status: std::io::Result<std::process::ExitStatus>,
    ) -> ExitReason {
        use std::os::unix::process::ExitStatusExt;
        let reason = match status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(code), _) => match spawn::shell_start_error(code, &self.cmdlines[idx]) {
                    Some(error) => ExitReason::FailedToStart {
                        process: self.machine.name(idx).to_string(),
                        error,
                    },
                    None => ExitReason::ExitCode { code },
                },
                (None, Some(signal)) => ExitReason::Signal { signal },
                (None, None) => ExitReason::ExitCode { code: -1 },
            },
            Err(e) => ExitReason::FailedToStart {
                process: self.machine.name(idx).to_string(),
                error: format!("waiting for the process failed: {e}"),
            },
        };
        // OOM comes from the cgroup's counter, never guessed from SIGKILL.
        if reason != (ExitReason::ExitCode { code: 0 }) {
            if let Some(n) = self.cgroup.as_ref().and_then(|c| c.oom_kills().ok()) {
                if n > self.oom_seen {
                    self.oom_seen = n;
                    return ExitReason::OomKilled;
                }
            }
        }
        reason
    }

    fn health_result(&mut self, result: Result<(), String>) {
        let now = self.now();
        let Some(h) = self.health.as_mut() else {
            return;
        };
        h.in_flight = false;
        if self.escalation.is_some() || self.state.is_terminal() {
            return;
        }
        match h.tracker.record(now, result) {
            Verdict::Unchanged => {}
            Verdict::BecameHealthy => {
                if self.state == TaskState::Starting {
                    self.emit(TaskState::Running, None, "health check passed".into());
                }
            }
            Verdict::Unhealthy { last_error } => {
                self.health_failure = Some(ExitReason::HealthCheckFailed {
                    last_error: last_error.clone(),
                });
                self.emit_same(format!(
                    "health check failed: {last_error}; stopping the task"
                ));
                self.start_escalation(true);
            }
        }
    }

    fn request_kill(&mut self, reason: ExitReason, from: &str) {
        if self.state.is_terminal() || self.kill_reason.is_some() {
            return;
        }
        let message = format!("kill requested by {from}: {reason}");
        self.kill_reason = Some(reason);
        self.emit(TaskState::Killing, None, message);
        if self.escalation.is_none() {
            self.start_escalation(true);
        }
    }

    fn start_escalation(&mut self, use_http: bool) {
        let now = self.now();
        let http = self.task.lifecycle.as_ref().and_then(|l| l.http.clone());
        let (esc, step) = Escalation::start(
            now,
            http.as_ref(),
            use_http,
            self.task.task.finalization_wait.get(),
        );
        self.escalation = Some(esc);
        self.perform(step);
    }

    fn perform(&mut self, step: Step) {
        match step {
            Step::PostGraceful | Step::PostShutdown => {
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
                    let r =
                        health::http_request(port, "POST", &endpoint, Duration::from_secs(1)).await;
                    let what = match r {
                        Ok(resp) => format!("POST {endpoint} answered {}", resp.code),
                        Err(e) => format!("POST {endpoint} failed: {e}"),
                    };
                    let _ = tx.send(Event::Posted(what));
                });
            }
            Step::Terminate => {
                let mut targets = self.machine.finalize();
                for i in self.machine.stop_all() {
                    if !targets.contains(&i) {
                        targets.push(i);
                    }
                }
                let pids = self.machine.running_pids();
                for (idx, pid) in pids {
                    if targets.contains(&idx) {
                        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
                        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                    }
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
            Step::KillAll => {
                self.machine.stop_all();
                self.machine.abandon_waiting();
                self.kill_everything();
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

    fn kill_everything(&self) {
        match &self.cgroup {
            Some(_) if self.known_empty() => {}
            Some(cg) => {
                if let Err(e) = cg.kill_all() {
                    crate::diag!("drover-executor: {e}");
                }
            }
            None => {
                for &g in &self.pgids {
                    let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
                }
            }
        }
    }

    fn cleanup_cgroup(&self) {
        self.kill_everything();
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.remove() {
                crate::diag!("drover-executor: {e}");
            }
        }
    }

    /// Decides and acts on everything due now. Returns whether processes changed
    /// (and a status should go out).
    fn tick(&mut self) -> bool {
        let mut changed = std::mem::take(&mut self.process_changed);
        if self.state.is_terminal() {
            return false;
        }
        let now = self.now();
        if self.release_at.is_some_and(|at| now >= at) {
            self.release_at = None;
            resident::release_startup_pages();
        }
        if !self.opts.standalone && self.clients == 0 && now >= self.recovery_deadline() {
            let after = self.opts.recovery_timeout;
            self.request_kill(
                ExitReason::AgentLost,
                &format!("the recovery timeout: no agent connected for {after:?}"),
            );
        }
        // Start what the machine allows (regular processes only when no escalation
        // runs; final processes during finalization).
        if self.escalation.is_none() || self.machine.phase() == Phase::Finalizing {
            for _ in 0..4 {
                let starts = self.machine.to_start(now);
                if starts.is_empty() {
                    break;
                }
                for idx in starts {
                    self.start_process(idx, now);
                    changed = true;
                }
            }
        }
        if self.escalation.is_none() && self.machine.regular_done() {
            // Regular work is over: stop ephemeral processes, run final ones.
            self.start_escalation(false);
            for idx in self.machine.to_start(now) {
                self.start_process(idx, now);
            }
            changed = true;
        }
        // Health checks.
        if self.escalation.is_none() {
            self.maybe_check_health(now);
        }
        // Escalation steps.
        let residue_wait = self.waiting_on_residue();
        if let Some(mut esc) = self.escalation.take() {
            let mut step = None;
            if residue_wait {
                let all_gone = !self.residue_alive();
                if all_gone {
                    step = esc.on_all_exited(now);
                }
            }
            if step.is_none() {
                step = esc.on_time(now);
            }
            self.escalation = Some(esc);
            if let Some(step) = step {
                self.perform(step);
                changed = true;
                if step == Step::Terminate {
                    for idx in self.machine.to_start(now) {
                        self.start_process(idx, now);
                    }
                }
            }
            let done = self.machine.phase() == Phase::Finalizing
                && self.machine.finals_done()
                && (self
                    .escalation
                    .as_ref()
                    .is_some_and(|e| e.deadline().is_none())
                    || !self.residue_alive());
            if done {
                self.finish();
                return false;
            }
        }
        changed
    }

    fn finish(&mut self) {
        self.machine.abandon_waiting();
        let (state, reason) = if let Some(r) = self.kill_reason.clone() {
            (TaskState::Killed, r)
        } else if let Some(r) = self.health_failure.clone() {
            (TaskState::Failed, r)
        } else {
            self.machine.outcome()
        };
        let message = match state {
            TaskState::Finished => "all processes succeeded".to_string(),
            _ => reason.to_string(),
        };
        self.emit(state, Some(reason), message);
    }

    fn start_process(&mut self, idx: usize, now: Millis) {
        let name = self.machine.name(idx).to_string();
        let cmdline = self.cmdlines[idx].clone();
        self.spawned += 1;
        let mut cmd = match spawn::task_command(&cmdline, &self.layout.work, &self.env, &self.iso) {
            Ok(cmd) => cmd,
            Err(error) => {
                self.machine.failed_to_start(
                    idx,
                    ExitReason::FailedToStart {
                        process: name,
                        error,
                    },
                    now,
                );
                return;
            }
        };
        match cmd.spawn() {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                self.machine.started(idx, pid, now);
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
            }
            Err(e) => self.machine.failed_to_start(
                idx,
                ExitReason::FailedToStart {
                    process: name,
                    error: spawn::spawn_error(&cmdline, &self.layout.work, &e),
                },
                now,
            ),
        }
    }

    fn maybe_check_health(&mut self, now: Millis) {
        if self.health.as_ref().is_none_or(|h| now < h.next_at) {
            return;
        }
        // Looked at only when a check is due (a stat per tick otherwise).
        let snoozed = self.layout.snoozed();
        let Some(h) = self.health.as_mut() else {
            return;
        };
        let interval = (h.spec.interval.get().as_millis() as Millis).max(1);
        // Drift-free: the next check is due one interval after this one was due.
        while h.next_at <= now {
            h.next_at += interval;
        }
        if h.in_flight || snoozed {
            return;
        }
        h.in_flight = true;
        let tx = self.tx.clone();
        let timeout = h.spec.timeout.get();
        match h.spec.kind {
            HealthCheckType::Http => {
                let (port, endpoint, code, body) = (
                    h.port,
                    h.spec.endpoint.clone(),
                    h.spec.expected_response_code,
                    h.spec.expected_response.clone(),
                );
                tokio::spawn(async move {
                    let r = health::check_http(port, &endpoint, code, &body, timeout).await;
                    let _ = tx.send(Event::Health(r));
                });
            }
            HealthCheckType::Tcp => {
                let port = h.port;
                tokio::spawn(async move {
                    let _ = tx.send(Event::Health(health::check_tcp(port, timeout).await));
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

/// The task cgroup's pids limit (pure): what the spec asks for, refused above the
/// host's maximum `host_max`; without a request [`DEFAULT_PIDS`], cut to `host_max`.
///
/// [`DEFAULT_PIDS`]: drover_common::spec::DEFAULT_PIDS
fn task_pids_limit(requested: Option<u64>, host_max: u64) -> Result<u64, String> {
    match requested {
        Some(n) if n > host_max => Err(format!(
            "task.resources.pids is {n} but this host allows at most {host_max} per task (agent max_task_pids); ask for fewer"
        )),
        Some(n) => Ok(n),
        None => Ok(drover_common::spec::DEFAULT_PIDS.min(host_max)),
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

    #[test]
    fn the_pids_limit_comes_from_the_spec_within_the_host_maximum() {
        assert_eq!(task_pids_limit(Some(64), 4096), Ok(64));
        assert_eq!(task_pids_limit(Some(4096), 4096), Ok(4096));
        assert!(task_pids_limit(Some(4097), 4096)
            .unwrap_err()
            .contains("task.resources.pids is 4097"));
        assert_eq!(
            task_pids_limit(None, 4096),
            Ok(drover_common::spec::DEFAULT_PIDS)
        );
        assert_eq!(task_pids_limit(None, 100), Ok(100));
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
