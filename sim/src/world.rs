//! The simulated cluster: one master (the real `Core` behind a model of the
//! runtime: group commit on a simulated disk, answers only after the commit,
//! read-only mode on a full disk, crashes and restarts through `Core::load`),
//! agents (the real `Host` and `converge` behind a model of the agent's session:
//! registration, heartbeats with the lease, the assignment long poll with its
//! late-answer check, the durable outbox and its relay), simulated executors, and
//! the network between them. One queue of timed events, one random source.

use std::collections::BTreeMap;

use drover_agent::converge::{discard_stale, max_answer_flight, KillCause};
use drover_agent::host::{next_seq, Host, HostAction, Verdict};
use drover_common::state::{ExitReason, TaskState};
use drover_common::wire::{
    self, AgentResources, AgentTaskReport, AssignmentSet, HeartbeatRequest, HeartbeatResponse,
    RegisterRequest, RegisterResponse, StatusAck, StatusUpdate,
};
use drover_master::core::{
    Change, Core, CoreConfig, CoreError, Effect, Event, MaintenanceOp, Now, Reply, UpdateAction,
};

use crate::jobs::{self, Behaviour, SimJob};
use crate::memory::{fingerprint, Acked, Checker, Ledger};
use crate::rng::Rng;
use crate::store::MemStore;
use crate::trace::Trace;

/// The start of simulated time (true time, ms).
const T0: u64 = 1_000_000;
/// The wall clock at the start (late 2023), so steps back never reach 1970.
const WALL0: i64 = 1_700_000_000_000;
/// How long the master holds an assignment poll (the agent's `poll_wait`).
const POLL_WAIT_MS: u64 = 5_000;

/// The master's thresholds in the simulation: short, like the core tests'.
pub fn sim_config() -> CoreConfig {
    CoreConfig {
        flapping_threshold_ms: 10_000,
        throttle_initial_ms: 1_000,
        throttle_max_ms: 4_000,
        transient_timeout_ms: 20_000,
        agent_timeout_ms: 3_000,
        heartbeat_interval_ms: 500,
        max_heartbeat_rate: 4,
        task_history_limit: 3,
        reconcile_interval_ms: 60_000,
        reconcile_backoff_initial_ms: 1_000,
        reconcile_backoff_max_ms: 8_000,
        restart_grace_ms: 6_000,
        exclusive_lease_ms: 2_000,
        missing_grace_ms: 1_000,
        eviction_guard_share_permille: 500,
        eviction_guard_window_ms: 10_000,
        agent_loss_rate: 1_000,
        preemption_reservation_ms: 30_000,
        cron_grace_ms: 60_000,
        cron_seconds: true,
        drain_round_interval_ms: 100,
        drain_round_max_tasks: 1_000,
        quarantine_failures: 3,
        quarantine_window_ms: 60_000,
        quarantine_jobs: 2,
        config_history: 3,
    }
}

/// A request from an agent to the master.
#[derive(Clone, Debug)]
enum Up {
    Register(Box<RegisterRequest>),
    Heartbeat {
        req: HeartbeatRequest,
        sent_local: u64,
    },
    Reports(Vec<StatusUpdate>),
    Poll {
        id: u64,
        after: u64,
        sent_local: u64,
    },
}

/// An answer from the master to an agent.
#[derive(Clone, Debug)]
enum Down {
    Registered(RegisterResponse),
    /// The answer, when the heartbeat was sent (agent clock), whether it was full.
    Heartbeat(HeartbeatResponse, u64, bool),
    Ack(StatusAck),
    Set {
        id: u64,
        set: AssignmentSet,
        held_ms: u64,
        sent_local: u64,
    },
    UnknownAgent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgentTimer {
    Register,
    Heartbeat,
    Relay,
    Gc,
    PollTimeout(u64),
}

#[derive(Clone, Debug)]
enum ExecStep {
    Running,
    Exit(TaskState, ExitReason),
    KillDone(ExitReason),
}

#[derive(Clone, Debug)]
enum Ev {
    Chaos,
    MasterTick(u64),
    MasterUp,
    DiskDone(u64),
    DiskRetry(u64),
    ToMaster {
        agent: usize,
        proc_: u64,
        msg: Up,
    },
    ToAgent {
        agent: usize,
        proc_: u64,
        msg: Down,
    },
    AgentTimer {
        agent: usize,
        proc_: u64,
        kind: AgentTimer,
    },
    AgentUp(usize),
    Exec {
        agent: usize,
        boot: u64,
        task: String,
        step: ExecStep,
    },
}

/// A simulated executor and its task's process.
#[derive(Clone, Debug)]
pub struct Exec {
    pub job: String,
    pub instance: u32,
    pub exclusive: bool,
    pub cpu_milli: u64,
    pub ram: u64,
    pub seq: u64,
    pub state: TaskState,
    /// Its processes run (until its terminal status).
    pub alive: bool,
    pub killing: bool,
    /// Killed because the master set it to SHUTDOWN (a requested stop: kill,
    /// restart, update, drain, preemption), not as errant or for the lease.
    pub stop_requested: bool,
    behaviour: Behaviour,
    finalization_ms: u64,
}

/// A simulated host with its agent.
pub struct SimAgent {
    pub id: String,
    pub cpu_milli: u64,
    pub ram: u64,
    cpu: f64,
    rack: String,
    /// The agent process's incarnation: messages and timers of an older one are dropped.
    proc_: u64,
    pub up: bool,
    /// The host's boot: executors of an older boot are dead.
    boot: u64,
    drift_ppm: i64,
    wall_skew: i64,
    registered: bool,
    host: Host<()>,
    outbox: Vec<StatusUpdate>,
    last_seq: BTreeMap<String, u64>,
    applied_version: u64,
    poll: Option<u64>,
    poll_ids: u64,
    discarded: Option<u64>,
    relay_until: u64,
    last_contact: Option<u64>,
    /// When the registration in flight was sent (the contact it makes if answered).
    pending_contact: Option<u64>,
    lease_ms: u64,
    hb_ms: u64,
    full: bool,
    pub execs: BTreeMap<String, Exec>,
}

impl SimAgent {
    /// The agent's monotonic clock at true time `t` (it drifts).
    fn local(&self, t: u64) -> u64 {
        let d = (t - T0) as i128 * self.drift_ppm as i128 / 1_000_000;
        (t as i128 + d) as u64
    }

    /// True time that `ms` of the agent's clock take.
    fn true_ms(&self, ms: u64) -> u64 {
        (ms as i128 * 1_000_000 / (1_000_000 + self.drift_ppm as i128)) as u64
    }

    fn wall(&self, t: u64) -> u64 {
        (t as i64 + self.wall_skew).max(0) as u64
    }
}

/// A batch the master's core emitted, queued for the disk.
struct Batch {
    seq: u64,
    changes: Vec<Change>,
}

/// What an answer waiting for a commit goes to.
enum ReplyTo {
    Agent {
        agent: usize,
        proc_: u64,
        msg: Down,
    },
    /// An operator's request: recorded as acknowledged once committed.
    Operator(Acked),
}

/// What a reply becomes once committed (None: nothing to send).
type AckOf = Box<dyn FnOnce(&Reply) -> Option<ReplyTo>>;

struct Waiter {
    seq: u64,
    epoch: u64,
    to: ReplyTo,
}

struct Poll {
    id: u64,
    agent: usize,
    proc_: u64,
    after: u64,
    recv: u64,
    sent_local: u64,
}

/// The master process and its disk.
pub struct Master {
    pub core: Option<Core>,
    inc: u64,
    mono_off: i64,
    wall_skew: i64,
    queue: Vec<Batch>,
    /// Batches in the commit the disk is doing now.
    committing: usize,
    epoch: u64,
    pub read_only: bool,
    committed: u64,
    waiters: Vec<Waiter>,
    polls: Vec<Poll>,
    tick_gen: u64,
    pub store: MemStore,
    full_until: u64,
    slow_until: u64,
}

/// Counts of what a run did.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub steps: u64,
    pub sim_ms: u64,
    pub jobs: u64,
    pub tasks_started: u64,
    pub commits: u64,
    pub master_restarts: u64,
    pub disk_full: u64,
    pub partitions: u64,
    pub agent_restarts: u64,
    pub updates: u64,
    pub drains: u64,
    /// Steps at which two copies of an exclusive instance ran while the older
    /// was being stopped on the master's request (restart, update, drain,
    /// preemption): the replacement does not wait for the kill. Not a failure
    /// (see docs/testing.md, "Findings"); the first one is kept.
    pub exclusive_overlap_steps: u64,
    pub exclusive_overlap_first: Option<String>,
}

/// Which faults a run may inject (all by default; the bug demonstrations in
/// docs/testing.md need the host wipe).
#[derive(Clone, Debug)]
pub struct Faults {
    /// A host loses its sandboxes and outbox (disk replaced) and its agent comes
    /// back under the same id.
    pub host_wipe: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults { host_wipe: true }
    }
}

/// What acts on the world and what watches it, from inside its steps: the random
/// acts (`chaos::act`) and the invariants (`check::watch`), given by the run
/// (lib.rs), so that the world knows neither.
#[derive(Clone, Copy)]
pub struct Hooks {
    /// Called at every chaos event (then the next is scheduled).
    pub act: fn(&mut World) -> Result<(), String>,
    /// Told each [`Seen`] as it happens; an error is a broken invariant.
    pub watch: fn(&mut World, Seen<'_>) -> Result<(), String>,
}

/// A moment the invariants are checked at.
#[derive(Clone, Copy)]
pub enum Seen<'a> {
    /// The end of a step.
    Step,
    /// A batch the master's core emitted, before it is committed.
    Batch(&'a [Change]),
    /// Batches committed to the store (all their changes).
    Commit(&'a [Change]),
    /// A core just loaded from the store, before it serves.
    Load(&'a Core),
    /// An executor of agent `.0` starts task `.1`.
    Start(usize, &'a str),
}

/// The whole simulated cluster.
pub struct World {
    pub t: u64,
    pub rng: Rng,
    queue: BTreeMap<(u64, u64), Ev>,
    ev_seq: u64,
    pub master: Master,
    pub agents: Vec<SimAgent>,
    pub jobs: Vec<SimJob>,
    next_job: u64,
    /// Agents cut off from the master until this true time.
    partitioned: Vec<u64>,
    loss_permille: u64,
    reorder_permille: u64,
    pub checker: Checker,
    pub ledger: Ledger,
    pub stats: Stats,
    pub trace: Trace,
    faults: Faults,
    hooks: Hooks,
}

impl World {
    /// A cluster of 4-7 hosts for `seed`, acted on and watched by `hooks`.
    pub fn new(seed: u64, faults: Faults, hooks: Hooks) -> World {
        let mut rng = Rng::new(seed);
        let n = rng.range(4, 7) as usize;
        let mut agents = Vec::new();
        for i in 0..n {
            let cpu = [2.0, 3.0, 4.0][rng.pick(3)];
            let ram_gib = rng.range(2, 6);
            agents.push(SimAgent {
                id: format!("a{i}"),
                cpu_milli: (cpu * 1000.0) as u64,
                ram: ram_gib << 30,
                cpu,
                rack: format!("r{}", i % 3),
                proc_: 0,
                up: false,
                boot: 0,
                drift_ppm: rng.range(0, 4_000) as i64 - 2_000,
                wall_skew: WALL0 - T0 as i64 + rng.range(0, 20_000) as i64 - 10_000,
                registered: false,
                host: Host::default(),
                outbox: Vec::new(),
                last_seq: BTreeMap::new(),
                applied_version: 0,
                poll: None,
                poll_ids: 0,
                discarded: None,
                relay_until: 0,
                last_contact: None,
                pending_contact: None,
                lease_ms: 2_000,
                hb_ms: 500,
                full: true,
                execs: BTreeMap::new(),
            });
        }
        let now = Now {
            mono: T0,
            wall: WALL0 as u64,
        };
        let master = Master {
            core: Some(Core::new(sim_config(), now, seed)),
            inc: 0,
            mono_off: 0,
            wall_skew: WALL0 - T0 as i64,
            queue: Vec::new(),
            committing: 0,
            epoch: 0,
            read_only: false,
            committed: 0,
            waiters: Vec::new(),
            polls: Vec::new(),
            tick_gen: 0,
            store: MemStore::default(),
            full_until: 0,
            slow_until: 0,
        };
        let mut w = World {
            t: T0,
            rng,
            queue: BTreeMap::new(),
            ev_seq: 0,
            master,
            agents,
            jobs: Vec::new(),
            next_job: 0,
            partitioned: vec![0; n],
            loss_permille: 10,
            reorder_permille: 50,
            checker: Checker::default(),
            ledger: Ledger::default(),
            stats: Stats::default(),
            trace: Trace::default(),
            faults,
            hooks,
        };
        w.master_wake();
        for i in 0..n {
            let at = w.t + w.rng.range(0, 300);
            w.at(at, Ev::AgentUp(i));
        }
        w.at(T0 + 200, Ev::Chaos);
        w
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.ev_seq += 1;
        self.queue.insert((t.max(self.t), self.ev_seq), ev);
    }

    /// Runs one event; false when nothing is left (never, in practice).
    pub fn step(&mut self) -> Result<bool, String> {
        let Some(((t, _), ev)) = self.queue.pop_first() else {
            return Ok(false);
        };
        self.t = t;
        self.stats.steps += 1;
        self.stats.sim_ms = t - T0;
        self.dispatch(ev)?;
        self.serve_polls();
        (self.hooks.watch)(self, Seen::Step)?;
        Ok(true)
    }

    fn dispatch(&mut self, ev: Ev) -> Result<(), String> {
        match ev {
            Ev::Chaos => {
                (self.hooks.act)(self)?;
                let next = self.t + self.rng.range(20, 400);
                self.at(next, Ev::Chaos);
            }
            Ev::MasterTick(gen) => {
                if gen == self.master.tick_gen && self.master.core.is_some() {
                    if self.master.read_only {
                        // Timers wait while the store takes no writes.
                        let at = self.t + 1_000;
                        self.at(at, Ev::MasterTick(gen));
                    } else {
                        self.trace.line(self.t, "master tick".into());
                        let _ = self.master_event(Event::Tick, None)?;
                    }
                }
            }
            Ev::MasterUp => self.master_up()?,
            Ev::DiskDone(inc) => {
                if inc == self.master.inc && self.master.core.is_some() {
                    self.disk_done()?;
                }
            }
            Ev::DiskRetry(inc) => {
                if inc == self.master.inc && self.master.core.is_some() && self.master.read_only {
                    if self.t >= self.master.full_until {
                        self.trace
                            .line(self.t, "store writable again: core reloaded".into());
                        self.master.read_only = false;
                        // The runtime's load goes through the writer after what is
                        // queued: those batches are committed first.
                        self.master.committing = self.master.queue.len();
                        self.disk_done()?;
                        self.reload_core()?;
                    } else {
                        let at = self.t + 1_000;
                        self.at(at, Ev::DiskRetry(inc));
                    }
                }
            }
            Ev::ToMaster { agent, proc_, msg } => self.master_recv(agent, proc_, msg)?,
            Ev::ToAgent { agent, proc_, msg } => {
                if self.agents[agent].up && self.agents[agent].proc_ == proc_ {
                    self.agent_recv(agent, msg)?;
                }
            }
            Ev::AgentTimer { agent, proc_, kind } => {
                if self.agents[agent].up && self.agents[agent].proc_ == proc_ {
                    self.agent_timer(agent, kind)?;
                }
            }
            Ev::AgentUp(agent) => self.agent_up(agent),
            Ev::Exec {
                agent,
                boot,
                task,
                step,
            } => {
                if self.agents[agent].boot == boot {
                    self.exec_step(agent, &task, step)?;
                }
            }
        }
        Ok(())
    }

    // ---- network ----

    /// Whether the agent is cut off from the master now.
    pub fn cut_off(&self, agent: usize) -> bool {
        self.partitioned[agent] > self.t
    }

    fn delay(&mut self) -> u64 {
        let mut d = self.rng.range(1, 20);
        if self.rng.chance(self.reorder_permille) {
            d += self.rng.range(100, 1_500);
        }
        d
    }

    fn send_up(&mut self, agent: usize, msg: Up) {
        if self.cut_off(agent) || self.rng.chance(self.loss_permille) {
            return;
        }
        let d = self.delay();
        let proc_ = self.agents[agent].proc_;
        let at = self.t + d;
        self.at(at, Ev::ToMaster { agent, proc_, msg });
    }

    fn send_down(&mut self, agent: usize, proc_: u64, msg: Down) {
        if self.cut_off(agent) || self.rng.chance(self.loss_permille) {
            return;
        }
        let d = self.delay();
        let at = self.t + d;
        self.at(at, Ev::ToAgent { agent, proc_, msg });
    }

    // ---- master ----

    pub fn master_now(&self) -> Now {
        Now {
            mono: (self.t as i64 + self.master.mono_off) as u64,
            wall: (self.t as i64 + self.master.wall_skew).max(0) as u64,
        }
    }

    /// Arms the master's timer from its core.
    fn master_wake(&mut self) {
        let Some(at) = self.master.core.as_ref().and_then(Core::next_wake) else {
            return;
        };
        self.master.tick_gen += 1;
        let t = (at as i64 - self.master.mono_off).max(self.t as i64) as u64;
        let gen = self.master.tick_gen;
        self.at(t, Ev::MasterTick(gen));
    }

    /// Handles one event in the core; the answer (if any) goes out once the
    /// store committed every batch up to this one. Returns the core's reply.
    fn master_event(
        &mut self,
        event: Event,
        reply: Option<AckOf>,
    ) -> Result<Result<Reply, CoreError>, String> {
        let now = self.master_now();
        let Some(core) = self.master.core.as_mut() else {
            return Err("event handled by a master that is down".into());
        };
        let out = core.handle(event, now);
        let seq = core.seq();
        for e in out.effects {
            match e {
                Effect::Persist { seq, changes } => {
                    (self.hooks.watch)(self, Seen::Batch(&changes))?;
                    self.master.queue.push(Batch { seq, changes });
                    self.start_commit();
                }
                Effect::WakeAt(_) => {}
                Effect::Notify { .. }
                | Effect::EvictionGuard { .. }
                | Effect::UpdateBatch { .. } => {}
            }
        }
        self.master_wake();
        if let (Ok(r), Some(f)) = (&out.reply, reply) {
            if let Some(to) = f(r) {
                let epoch = self.master.epoch;
                self.master.waiters.push(Waiter { seq, epoch, to });
                self.deliver();
            }
        }
        Ok(out.reply)
    }

    fn start_commit(&mut self) {
        if self.master.committing > 0 || self.master.queue.is_empty() {
            return;
        }
        self.master.committing = self.master.queue.len();
        let d = if self.t < self.master.slow_until {
            self.rng.range(100, 1_500)
        } else {
            self.rng.range(1, 8)
        };
        let at = self.t + d;
        let inc = self.master.inc;
        self.at(at, Ev::DiskDone(inc));
    }

    fn disk_done(&mut self) -> Result<(), String> {
        let n = self.master.committing.min(self.master.queue.len());
        self.master.committing = 0;
        if n == 0 {
            return Ok(());
        }
        if self.t < self.master.full_until {
            // No space: the batch and every one made on top of it are dropped,
            // the master turns read-only and its core is reloaded from the store.
            self.trace.line(
                self.t,
                format!(
                    "disk full: {} batches dropped, read-only",
                    self.master.queue.len()
                ),
            );
            self.master.queue.clear();
            self.master.epoch += 1;
            self.master.read_only = true;
            self.deliver();
            self.reload_core()?;
            let at = self.t + 1_000;
            let inc = self.master.inc;
            self.at(at, Ev::DiskRetry(inc));
            return Ok(());
        }
        let batches: Vec<Batch> = self.master.queue.drain(..n).collect();
        let mut changes = Vec::new();
        let mut last = 0;
        for b in batches {
            last = b.seq;
            changes.extend(b.changes);
        }
        changes.push(Change::Index(last));
        self.master.store.commit(&changes)?;
        self.stats.commits += 1;
        self.master.committed = last;
        self.trace
            .line(self.t, format!("commit up to batch {last}"));
        // Answers first: a job created and removed (cron deschedule) in one group
        // commit leaves the ledger with the removal.
        self.deliver();
        (self.hooks.watch)(self, Seen::Commit(&changes))?;
        self.start_commit();
        Ok(())
    }

    /// Sends every answer whose batch is committed; answers of a dropped epoch
    /// are errors (nothing acknowledged).
    fn deliver(&mut self) {
        let (committed, epoch) = (self.master.committed, self.master.epoch);
        let waiters = std::mem::take(&mut self.master.waiters);
        for w in waiters {
            if w.epoch != epoch {
                continue;
            }
            if w.seq > committed {
                self.master.waiters.push(w);
                continue;
            }
            match w.to {
                ReplyTo::Agent { agent, proc_, msg } => {
                    if let Down::Ack(ack) = &msg {
                        for (task, seq) in &ack.acked {
                            self.ledger.ack_status(task, *seq);
                        }
                    }
                    self.send_down(agent, proc_, msg);
                }
                ReplyTo::Operator(a) => self.ledger.ack(a),
            }
        }
    }

    fn reload_core(&mut self) -> Result<(), String> {
        let snapshot = self.master.store.snapshot();
        let now = self.master_now();
        // A fresh seed per load, as the runtime's: ids never repeat those of an
        // earlier load.
        let seed = self.rng.next_u64();
        let core = Core::load(sim_config(), snapshot, now, seed);
        (self.hooks.watch)(self, Seen::Load(&core))?;
        self.master.core = Some(core);
        self.master_wake();
        Ok(())
    }

    /// The master process dies: what is not committed is gone, and so are the
    /// answers it owed.
    pub fn master_crash(&mut self) {
        self.trace.line(
            self.t,
            format!(
                "master crash ({} batches uncommitted)",
                self.master.queue.len()
            ),
        );
        if self.master.queue.is_empty() {
            if let Some(core) = &self.master.core {
                // What the core holds as the store has it (a core just loaded may
                // hold changes of its own, e.g. a cron catch-up, that the next
                // event's batch carries: not committed, not acknowledged).
                let store = &self.master.store;
                let print = fingerprint(core, &self.jobs)
                    .into_iter()
                    .filter(|t| {
                        store.task(&t.0).is_some_and(|s| {
                            s.status.state == t.1 && s.desired == t.2 && s.last_seq == t.4
                        })
                    })
                    .collect();
                self.checker.before_crash = Some(print);
            }
        }
        self.master.core = None;
        self.master.inc += 1;
        self.master.queue.clear();
        self.master.committing = 0;
        self.master.waiters.clear();
        self.master.polls.clear();
        self.master.read_only = false;
        // The long polls in flight fail (connection reset): each agent polls
        // again after its backoff.
        for i in 0..self.agents.len() {
            if let Some(id) = self.agents[i].poll {
                let backoff = self.rng.range(200, 1_000);
                self.agent_timer_in(i, backoff, AgentTimer::PollTimeout(id));
            }
        }
        self.stats.master_restarts += 1;
        let at = self.t + self.rng.range(300, 4_000);
        self.at(at, Ev::MasterUp);
    }

    fn master_up(&mut self) -> Result<(), String> {
        // A new process: another monotonic origin.
        self.master.mono_off = self.rng.range(0, 1_000_000) as i64 - 500_000;
        self.master.epoch += 1;
        self.trace
            .line(self.t, "master restarted from the store".into());
        self.reload_core()?;
        self.checker.before_crash = None;
        Ok(())
    }

    fn master_recv(&mut self, agent: usize, proc_: u64, msg: Up) -> Result<(), String> {
        if self.master.core.is_none() {
            // Connection refused: a poll is tried again after the agent's backoff
            // (heartbeats, relays and registrations retry on their own timers).
            if let Up::Poll { id, .. } = msg {
                if self.agents[agent].proc_ == proc_ {
                    let backoff = self.rng.range(200, 1_000);
                    self.agent_timer_in(agent, backoff, AgentTimer::PollTimeout(id));
                }
            }
            return Ok(());
        }
        let id = self.agents[agent].id.clone();
        match msg {
            Up::Register(req) => {
                if self.master.read_only {
                    return Ok(());
                }
                self.trace.line(self.t, format!("{id} registers"));
                let _ = self.master_event(
                    Event::Register(req),
                    Some(Box::new(move |r| match r {
                        Reply::Registered(resp) => Some(ReplyTo::Agent {
                            agent,
                            proc_,
                            msg: Down::Registered(resp.clone()),
                        }),
                        _ => None,
                    })),
                )?;
            }
            Up::Heartbeat {
                mut req,
                sent_local,
            } => {
                let sent_full = req.tasks.is_some();
                if self.master.read_only {
                    req.tasks = None;
                }
                let full = req.tasks.is_some();
                self.trace.line(
                    self.t,
                    format!("{id} heartbeat v{} full={full}", req.assignments_version),
                );
                let out = self.master_event(
                    Event::Heartbeat {
                        agent: id,
                        request: req,
                    },
                    Some(Box::new(move |r| match r {
                        Reply::Heartbeat(resp) => Some(ReplyTo::Agent {
                            agent,
                            proc_,
                            msg: Down::Heartbeat(resp.clone(), sent_local, sent_full),
                        }),
                        _ => None,
                    })),
                )?;
                if let Err(CoreError::UnknownAgent(_)) = out {
                    self.send_down(agent, proc_, Down::UnknownAgent);
                }
            }
            Up::Reports(reports) => {
                if self.master.read_only {
                    return Ok(());
                }
                self.trace.line(
                    self.t,
                    format!(
                        "{id} reports {}",
                        reports
                            .iter()
                            .map(|u| format!("{}#{}={}", u.task_id, u.seq, u.state))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                );
                let out = self.master_event(
                    Event::StatusReports { agent: id, reports },
                    Some(Box::new(move |r| match r {
                        Reply::Ack(ack) => Some(ReplyTo::Agent {
                            agent,
                            proc_,
                            msg: Down::Ack(ack.clone()),
                        }),
                        _ => None,
                    })),
                )?;
                if let Err(CoreError::UnknownAgent(_)) = out {
                    self.send_down(agent, proc_, Down::UnknownAgent);
                }
            }
            Up::Poll {
                id: poll,
                after,
                sent_local,
            } => {
                self.master.polls.push(Poll {
                    id: poll,
                    agent,
                    proc_,
                    after,
                    recv: self.t,
                    sent_local,
                });
            }
        }
        Ok(())
    }

    /// Answers the long polls that may be answered (the runtime's `poll_step`:
    /// a change the agent has not seen, or the wait is over, and the change is
    /// committed).
    fn serve_polls(&mut self) {
        let Some(core) = self.master.core.as_ref() else {
            return;
        };
        let committed = self.master.committed;
        let polls = std::mem::take(&mut self.master.polls);
        let mut out = Vec::new();
        for p in polls {
            let id = &self.agents[p.agent].id;
            let Some((version, change_seq)) = core.agent_version(id) else {
                out.push((p.agent, p.proc_, Down::UnknownAgent));
                continue;
            };
            let notified = core.agent_notified_version(id).unwrap_or(version);
            let changed = p.after < notified || p.after > version;
            let timed_out = self.t >= p.recv + POLL_WAIT_MS;
            if (changed || timed_out) && change_seq <= committed {
                if let Some(set) = core.assignment_set(id) {
                    out.push((
                        p.agent,
                        p.proc_,
                        Down::Set {
                            id: p.id,
                            set,
                            held_ms: self.t - p.recv,
                            sent_local: p.sent_local,
                        },
                    ));
                }
            } else {
                self.master.polls.push(p);
            }
        }
        for (agent, proc_, msg) in out {
            self.send_down(agent, proc_, msg);
        }
    }

    // ---- operators ----

    /// An operator request; refused while the master is down or read-only.
    pub fn operator(&mut self, event: Event, what: String) -> Result<(), String> {
        if self.master.core.is_none() {
            self.trace.line(self.t, format!("op {what}: master down"));
            return Ok(());
        }
        if self.master.read_only {
            self.trace
                .line(self.t, format!("op {what}: refused, read-only"));
            return Ok(());
        }
        let ack_of: AckOf = match &event {
            Event::CreateJob(spec) => {
                let key = format!("{}/{}/{}", spec.role, spec.environment, spec.name);
                Box::new(move |r| {
                    matches!(r, Reply::JobCreated { .. })
                        .then_some(ReplyTo::Operator(Acked::Job(key)))
                })
            }
            Event::Kill { .. } => Box::new(|r| match r {
                Reply::Action(a) => Some(ReplyTo::Operator(Acked::Killed(a.tasks.clone()))),
                _ => None,
            }),
            Event::Maintenance { op, hosts } => {
                let out = !matches!(op, MaintenanceOp::Activate);
                let hosts = hosts.clone();
                Box::new(move |r| {
                    matches!(r, Reply::Hosts(_))
                        .then_some(ReplyTo::Operator(Acked::Maintenance(hosts, out)))
                })
            }
            Event::StartUpdate { job, .. } => {
                let job = job.clone();
                Box::new(move |r| {
                    matches!(r, Reply::Update(_)).then_some(ReplyTo::Operator(Acked::Update(job)))
                })
            }
            _ => Box::new(|_| None),
        };
        let r = self.master_event(event, Some(ack_of))?;
        let said = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("refused: {e}"),
        };
        self.trace.line(self.t, format!("op {what}: {said}"));
        Ok(())
    }

    pub fn create_job(&mut self) -> Result<(), String> {
        self.next_job += 1;
        let job = jobs::new_job(&mut self.rng, self.next_job)?;
        let what = format!(
            "create {} x{} service={} exclusive={} tier={} cron={} `{}`",
            job.key,
            job.spec.instances,
            job.spec.service,
            job.spec.partition_policy.exclusive,
            job.spec.tier,
            job.cron,
            job.spec
                .task
                .processes
                .first()
                .map_or("", |p| p.cmdline.as_str())
        );
        let spec = job.spec.clone();
        self.jobs.push(job);
        self.stats.jobs += 1;
        self.operator(Event::CreateJob(Box::new(spec)), what)
    }

    pub fn update_job(&mut self, j: usize) -> Result<(), String> {
        let spec = jobs::updated(&mut self.rng, &self.jobs[j]);
        let key = self.jobs[j].key.clone();
        let what = format!(
            "update {key} -> x{} `{}`",
            spec.instances,
            spec.task
                .processes
                .first()
                .map_or("", |p| p.cmdline.as_str())
        );
        self.jobs[j].spec = spec.clone();
        self.stats.updates += 1;
        self.operator(
            Event::StartUpdate {
                job: key,
                spec: Box::new(spec),
                instances: None,
                user: "sim".into(),
            },
            what,
        )
    }

    pub fn update_action(&mut self, j: usize, action: UpdateAction) -> Result<(), String> {
        let job = self.jobs[j].key.clone();
        self.operator(
            Event::UpdateAction {
                job: job.clone(),
                action,
            },
            format!("{action:?} update of {job}"),
        )
    }

    pub fn maintenance(&mut self, op: MaintenanceOp, agent: usize) -> Result<(), String> {
        let host = self.agents[agent].id.clone();
        if matches!(op, MaintenanceOp::Drain { .. }) {
            self.stats.drains += 1;
        }
        self.operator(
            Event::Maintenance {
                op,
                hosts: vec![host.clone()],
            },
            format!("{op:?} {host}"),
        )
    }

    // ---- faults ----

    pub fn partition(&mut self, agent: usize, ms: u64) {
        self.stats.partitions += 1;
        self.partitioned[agent] = self.t + ms;
        self.trace.line(
            self.t,
            format!("partition {} for {ms} ms", self.agents[agent].id),
        );
    }

    pub fn set_network(&mut self, loss: u64, reorder: u64) {
        self.loss_permille = loss;
        self.reorder_permille = reorder;
        self.trace
            .line(self.t, format!("network loss {loss}‰ reorder {reorder}‰"));
    }

    pub fn disk_full(&mut self, ms: u64) {
        self.stats.disk_full += 1;
        self.master.full_until = self.t + ms;
        self.trace
            .line(self.t, format!("master disk full for {ms} ms"));
    }

    pub fn disk_slow(&mut self, ms: u64) {
        self.master.slow_until = self.t + ms;
        self.trace
            .line(self.t, format!("master disk slow for {ms} ms"));
    }

    pub fn master_wall_step(&mut self, ms: i64) {
        self.master.wall_skew += ms;
        self.trace
            .line(self.t, format!("master wall clock steps {ms} ms"));
    }

    pub fn agent_wall_step(&mut self, agent: usize, ms: i64) {
        self.agents[agent].wall_skew += ms;
    }

    /// The agent process dies (`reboot`: with every executor of the host;
    /// `wipe`: and the host's sandboxes and outbox are gone too).
    pub fn agent_crash(&mut self, agent: usize, reboot: bool, wipe: bool) {
        if wipe && !self.faults.host_wipe {
            return;
        }
        self.stats.agent_restarts += 1;
        let a = &mut self.agents[agent];
        a.up = false;
        a.proc_ += 1;
        if reboot || wipe {
            a.boot += 1;
            for e in a.execs.values_mut() {
                e.alive = false;
            }
        }
        if wipe {
            a.execs.clear();
            a.outbox.clear();
            a.last_seq.clear();
        }
        let what = if wipe {
            "wiped"
        } else if reboot {
            "rebooted"
        } else {
            "agent restarted"
        };
        let line = format!("{} {what}", a.id);
        self.trace.line(self.t, line);
        let at = self.t + self.rng.range(100, 3_000);
        self.at(at, Ev::AgentUp(agent));
    }

    // ---- agents ----

    fn agent_up(&mut self, i: usize) {
        let t = self.t;
        let a = &mut self.agents[i];
        a.up = true;
        a.proc_ += 1;
        a.registered = false;
        a.poll = None;
        a.discarded = None;
        a.full = true;
        a.relay_until = 0;
        // Re-adoption: live executors are followed again, ended ones held ended;
        // an executor that died with its host (not ended) is reported LOST.
        let now = a.local(t);
        let wall = a.wall(t);
        let mut host = Host::default();
        let mut lost = Vec::new();
        for (id, e) in &a.execs {
            if e.alive {
                host.hold_live(id, Some(e.state), e.exclusive, ());
            } else if e.state.is_terminal() {
                host.hold_terminal(id, e.state, e.exclusive, now);
            } else {
                lost.push(id.clone());
                host.hold_terminal(id, TaskState::Lost, e.exclusive, now);
            }
        }
        a.host = host;
        for id in lost {
            let seq = next_seq([a.last_seq.get(&id).copied().unwrap_or(0)]);
            let u = Verdict::lost(&id, "executor lost".into()).into_update(seq, wall);
            if let Some(e) = a.execs.get_mut(&id) {
                e.state = TaskState::Lost;
                e.seq = seq;
            }
            a.last_seq.insert(id, seq);
            a.outbox.push(u);
        }
        self.agent_register(i);
        self.agent_timer_in(i, 250, AgentTimer::Gc);
        self.agent_timer_in(i, 200, AgentTimer::Relay);
    }

    fn agent_timer_in(&mut self, i: usize, local_ms: u64, kind: AgentTimer) {
        let a = &self.agents[i];
        let at = self.t + a.true_ms(local_ms).max(1);
        let proc_ = a.proc_;
        self.at(
            at,
            Ev::AgentTimer {
                agent: i,
                proc_,
                kind,
            },
        );
    }

    fn agent_register(&mut self, i: usize) {
        let a = &self.agents[i];
        let req = RegisterRequest {
            ip: None,
            protocol_version: wire::PROTOCOL_VERSION,
            agent_id: a.id.clone(),
            hostname: format!("{}.sim", a.id),
            address: format!("http://{}:1", a.id),
            resources: AgentResources {
                cpu: a.cpu,
                ram_bytes: a.ram,
                disk_bytes: 100 << 30,
                port_range: (31000, 31019),
            },
            attributes: [("rack".to_string(), a.rack.clone())].into_iter().collect(),
            versions: None,
        };
        let sent = a.local(self.t);
        self.agents[i].registered = false;
        self.agents[i].last_contact_pending(sent);
        self.send_up(i, Up::Register(Box::new(req)));
        self.agent_timer_in(i, 1_000, AgentTimer::Register);
    }

    fn agent_timer(&mut self, i: usize, kind: AgentTimer) -> Result<(), String> {
        let t = self.t;
        match kind {
            AgentTimer::Register => {
                if !self.agents[i].registered {
                    self.agent_register(i);
                }
            }
            AgentTimer::Heartbeat => {
                self.send_heartbeat(i);
                let hb = self.agents[i].hb_ms;
                self.agent_timer_in(i, hb, AgentTimer::Heartbeat);
            }
            AgentTimer::Relay => {
                let a = &self.agents[i];
                if a.registered && !a.outbox.is_empty() && t >= a.relay_until {
                    let batch: Vec<StatusUpdate> = a.outbox.iter().take(50).cloned().collect();
                    self.agents[i].relay_until = t + 2_000;
                    self.send_up(i, Up::Reports(batch));
                }
                self.agent_timer_in(i, 200, AgentTimer::Relay);
            }
            AgentTimer::Gc => {
                let a = &mut self.agents[i];
                if let Some(contact) = a.last_contact {
                    let since = a.local(t).saturating_sub(contact);
                    let actions = a.host.lease_kills(
                        std::time::Duration::from_millis(since),
                        std::time::Duration::from_millis(a.lease_ms),
                    );
                    self.agent_actions(i, actions)?;
                }
                self.agent_timer_in(i, 250, AgentTimer::Gc);
            }
            AgentTimer::PollTimeout(id) => {
                if self.agents[i].poll == Some(id) {
                    self.agent_poll(i);
                }
            }
        }
        Ok(())
    }

    fn send_heartbeat(&mut self, i: usize) {
        let t = self.t;
        let a = &mut self.agents[i];
        if !a.registered {
            return;
        }
        let full = std::mem::take(&mut a.full);
        let tasks = full.then(|| {
            a.host
                .held()
                .into_iter()
                .map(|(task_id, state)| AgentTaskReport {
                    seq: a.last_seq.get(&task_id).copied().unwrap_or(0),
                    task_id,
                    state,
                })
                .collect()
        });
        let req = HeartbeatRequest {
            task_digest: a.host.digest(),
            assignments_version: a.applied_version,
            tasks,
        };
        let sent_local = a.local(t);
        self.send_up(i, Up::Heartbeat { req, sent_local });
    }

    fn agent_poll(&mut self, i: usize) {
        let a = &mut self.agents[i];
        a.poll_ids += 1;
        let id = a.poll_ids;
        a.poll = Some(id);
        let sent_local = a.local(self.t);
        let after = a.applied_version;
        self.send_up(
            i,
            Up::Poll {
                id,
                after,
                sent_local,
            },
        );
        self.agent_timer_in(i, POLL_WAIT_MS + 3_000, AgentTimer::PollTimeout(id));
    }

    fn agent_recv(&mut self, i: usize, msg: Down) -> Result<(), String> {
        let t = self.t;
        match msg {
            Down::Registered(resp) => {
                if self.agents[i].registered {
                    return Ok(());
                }
                let a = &mut self.agents[i];
                a.registered = true;
                a.last_contact = a.pending_contact.take().or(a.last_contact);
                if let Some(l) = resp.exclusive_lease_ms {
                    a.lease_ms = l;
                }
                a.hb_ms = resp.heartbeat_interval_ms.max(10);
                a.full = true;
                a.applied_version = 0;
                self.trace
                    .line(t, format!("{} registered", self.agents[i].id));
                self.send_heartbeat(i);
                let hb = self.agents[i].hb_ms;
                self.agent_timer_in(i, hb, AgentTimer::Heartbeat);
                self.agent_poll(i);
            }
            Down::Heartbeat(resp, sent_local, sent_full) => {
                let a = &mut self.agents[i];
                a.last_contact = Some(a.last_contact.map_or(sent_local, |c| c.max(sent_local)));
                if let Some(l) = resp.exclusive_lease_ms {
                    a.lease_ms = l;
                }
                if let Some(hb) = resp.heartbeat_interval_ms {
                    a.hb_ms = hb.max(10);
                }
                if resp.reregister {
                    self.agent_register(i);
                } else if resp.send_full_task_set {
                    // As the agent's session: the full set goes with the next
                    // heartbeat, at once unless this one carried it already.
                    self.agents[i].full = true;
                    if !sent_full {
                        self.send_heartbeat(i);
                    }
                }
            }
            Down::Ack(ack) => {
                let a = &mut self.agents[i];
                a.outbox.retain(|u| {
                    !ack.acked
                        .iter()
                        .any(|(task, seq)| *task == u.task_id && u.seq <= *seq)
                });
                a.relay_until = 0;
            }
            Down::Set {
                id,
                set,
                held_ms,
                sent_local,
            } => {
                let a = &mut self.agents[i];
                if a.poll != Some(id) {
                    return Ok(());
                }
                let now = a.local(t);
                let in_flight = now.saturating_sub(sent_local).saturating_sub(held_ms);
                let limit = max_answer_flight(std::time::Duration::from_millis(a.lease_ms));
                if discard_stale(
                    std::time::Duration::from_millis(in_flight),
                    limit,
                    set.version,
                    a.discarded,
                ) {
                    a.discarded = Some(set.version);
                    self.trace
                        .line(t, format!("{} drops late set v{}", a.id, set.version));
                    self.agent_poll(i);
                    return Ok(());
                }
                a.discarded = None;
                a.applied_version = set.version;
                let actions = a.host.apply(&set, now);
                self.trace.line(
                    t,
                    format!(
                        "{} applies set v{} ({} tasks)",
                        self.agents[i].id,
                        set.version,
                        set.assignments.len()
                    ),
                );
                self.agent_actions(i, actions)?;
                self.agent_poll(i);
            }
            Down::UnknownAgent => {
                if self.agents[i].registered {
                    self.agent_register(i);
                }
            }
        }
        Ok(())
    }

    fn agent_actions(&mut self, i: usize, actions: Vec<HostAction>) -> Result<(), String> {
        for action in actions {
            match action {
                HostAction::Start(a) => {
                    let id = a.task.task_id.clone();
                    let job = format!("{}/{}/{}", a.task.role, a.task.environment, a.task.name);
                    (self.hooks.watch)(self, Seen::Start(i, &id))?;
                    self.stats.tasks_started += 1;
                    let r = &a.task.task.resources;
                    let behaviour = Behaviour::of(
                        a.task
                            .task
                            .processes
                            .first()
                            .map_or("", |p| p.cmdline.as_str()),
                    );
                    let exec = Exec {
                        job,
                        instance: a.task.instance,
                        exclusive: a.exclusive,
                        cpu_milli: (r.cpu * 1000.0).round() as u64,
                        ram: r.ram.bytes(),
                        seq: 0,
                        state: TaskState::Assigned,
                        alive: true,
                        killing: false,
                        stop_requested: false,
                        behaviour,
                        finalization_ms: a.task.task.finalization_wait.get().as_millis() as u64,
                    };
                    self.trace
                        .line(self.t, format!("{} starts {id}", self.agents[i].id));
                    self.agents[i].execs.insert(id.clone(), exec);
                    self.exec_status(i, &id, TaskState::Starting, None);
                    let d = self.rng.range(10, 400);
                    self.exec_at(i, &id, d, ExecStep::Running);
                }
                HostAction::Kill {
                    task_id,
                    reason,
                    cause,
                } => {
                    let Some(e) = self.agents[i].execs.get_mut(&task_id) else {
                        continue;
                    };
                    if !e.alive || e.killing {
                        continue;
                    }
                    e.killing = true;
                    e.stop_requested = cause == KillCause::Shutdown;
                    // Most kills are quick; some hang through the escalation, but
                    // within its worst case (finalization wait plus the master's slack).
                    let worst = e.finalization_ms + 4_000;
                    let d = if self.rng.chance(100) {
                        self.rng.range(1_000, worst)
                    } else {
                        self.rng.range(5, 600)
                    };
                    self.trace.line(
                        self.t,
                        format!("{} kills {task_id} ({reason}) in {d} ms", self.agents[i].id),
                    );
                    self.exec_at(i, &task_id, d, ExecStep::KillDone(reason));
                }
                HostAction::Refuse(v) | HostAction::ReportKilled(v) => {
                    let a = &mut self.agents[i];
                    let seq = next_seq([a.last_seq.get(&v.task_id).copied().unwrap_or(0)]);
                    let u = v.into_update(seq, a.wall(self.t));
                    a.last_seq.insert(u.task_id.clone(), seq);
                    let now = a.local(self.t);
                    a.host.recorded(std::slice::from_ref(&u), now);
                    a.outbox.push(u);
                }
            }
        }
        Ok(())
    }

    fn exec_at(&mut self, i: usize, task: &str, d: u64, step: ExecStep) {
        let boot = self.agents[i].boot;
        let at = self.t + d;
        self.at(
            at,
            Ev::Exec {
                agent: i,
                boot,
                task: task.to_string(),
                step,
            },
        );
    }

    /// The executor writes a status: the agent records it in its outbox.
    fn exec_status(&mut self, i: usize, task: &str, state: TaskState, reason: Option<ExitReason>) {
        let t = self.t;
        let a = &mut self.agents[i];
        let Some(e) = a.execs.get_mut(task) else {
            return;
        };
        let seq = next_seq([e.seq, a.last_seq.get(task).copied().unwrap_or(0)]);
        e.seq = seq;
        e.state = state;
        if state.is_terminal() {
            e.alive = false;
        }
        a.last_seq.insert(task.to_string(), seq);
        let u = StatusUpdate {
            task_id: task.to_string(),
            seq,
            state,
            exit_reason: reason,
            message: String::new(),
            timestamp_ms: a.wall(t),
            processes: Vec::new(),
            processes_omitted: None,
        };
        if a.up {
            let now = a.local(t);
            a.host.recorded(std::slice::from_ref(&u), now);
        }
        a.outbox.push(u);
    }

    fn exec_step(&mut self, i: usize, task: &str, step: ExecStep) -> Result<(), String> {
        let Some(e) = self.agents[i].execs.get(task) else {
            return Ok(());
        };
        if !e.alive {
            return Ok(());
        }
        let behaviour = e.behaviour;
        let killing = e.killing;
        match step {
            ExecStep::Running => {
                if killing {
                    return Ok(());
                }
                self.exec_status(i, task, TaskState::Running, None);
                let (d, end) = match behaviour {
                    Behaviour::Service => {
                        if !self.rng.chance(50) {
                            return Ok(());
                        }
                        (
                            self.rng.range(5_000, 60_000),
                            ExecStep::Exit(TaskState::Failed, ExitReason::ExitCode { code: 1 }),
                        )
                    }
                    Behaviour::Batch(ms) => (
                        ms,
                        ExecStep::Exit(TaskState::Finished, ExitReason::ExitCode { code: 0 }),
                    ),
                    Behaviour::Crash(ms) => (
                        ms,
                        ExecStep::Exit(TaskState::Failed, ExitReason::ExitCode { code: 2 }),
                    ),
                    Behaviour::Unhealthy(ms) => (
                        ms,
                        ExecStep::Exit(
                            TaskState::Failed,
                            ExitReason::HealthCheckFailed {
                                last_error: "simulated".into(),
                            },
                        ),
                    ),
                };
                self.exec_at(i, task, d, end);
            }
            ExecStep::Exit(state, reason) => {
                if killing {
                    return Ok(());
                }
                self.trace.line(self.t, format!("{task} exits {state}"));
                self.exec_status(i, task, state, Some(reason));
            }
            ExecStep::KillDone(reason) => {
                self.trace.line(self.t, format!("{task} killed"));
                self.exec_status(i, task, TaskState::Killed, Some(reason));
            }
        }
        Ok(())
    }
}

impl SimAgent {
    fn last_contact_pending(&mut self, sent: u64) {
        self.pending_contact = Some(sent);
    }
}
