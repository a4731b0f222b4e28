//! The stored state and the core rebuilt from it at start ([`Core::load`]).

use std::sync::Arc;

use drover_common::state::{TaskState, UnixMillis};

use drover_common::spec::JobSpec;

use super::cron::catch_up;
use super::maintenance::Drains;
use super::model::CronState;
use super::model::{constraints_of, Agent, Job, JobConfig, Slot};
use super::quota::Usage;
use super::timers::Timer;
use super::{AgentRecord, Core, CoreConfig, JobRecord, Now, Task, UpdateRecord};

/// Everything the store holds, as loaded at start.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub jobs: Vec<JobRecord>,
    pub tasks: Vec<Task>,
    pub agents: Vec<AgentRecord>,
    /// Production quotas by role.
    pub quotas: Vec<(String, Usage)>,
    /// The users granted to each role (beside its own).
    pub user_grants: Vec<(String, std::collections::BTreeSet<String>)>,
    /// Each cron job's last scheduled firing handled (wall clock).
    pub cron_fired: Vec<(String, UnixMillis)>,
    /// The last batch number committed (`Change::Index`); 0 for a new store.
    pub index: u64,
    /// Task configs.
    pub configs: Vec<ConfigRecord>,
    /// Update records, any order.
    pub updates: Vec<UpdateRecord>,
}

/// One stored task config of a job.
#[derive(Clone, Debug)]
pub struct ConfigRecord {
    /// The job's key.
    pub job: String,
    /// The config's content hash (`drover_common::configs::config_hash`).
    pub hash: String,
    pub spec: JobSpec,
    /// When it last became the job's newest config (wall clock; 0 when stored by
    /// a master that did not record it).
    pub used_ms: UnixMillis,
}

impl Core {
    /// A master restarted at `now` with the stored state. Agents count as alive from
    /// `now` on; nothing is replaced because of them before the restart grace.
    ///
    /// Monotonic readings do not survive a restart, so the deadlines are re-derived
    /// from what is stored: a THROTTLED penalty keeps what was left of it by the
    /// wall clock (at most `throttle_max`), an ASSIGNED or STARTING task keeps what
    /// was left of its transient timeout (at most the whole timeout, and never
    /// before the restart grace), a RUNNING task's age counts up to the flapping
    /// threshold (or its job's SLA `min_time`, if longer), a drain's deadline keeps
    /// what was left of it (at most the whole drain's time), and so do a host's
    /// failures counting towards quarantine (at most the window); a wall clock step while the master was down moves none of them
    /// past those bounds. Agent timeouts, missing grace and reconciliation start
    /// afresh.
    pub fn load(cfg: CoreConfig, snapshot: Snapshot, now: Now, seed: u64) -> Core {
        let mut core = Core::new(cfg, now, seed);
        // Batch numbers go on from the last one stored: the change stream's index
        // stays valid across restarts.
        core.seq = snapshot
            .tasks
            .iter()
            .map(|t| t.rev)
            .chain(snapshot.agents.iter().map(|a| a.rev))
            .chain([snapshot.index])
            .max()
            .unwrap_or(0);
        core.services_gone = core.seq;
        for mut rec in snapshot.agents {
            rec.maintenance.loaded(now, core.cfg.quarantine_window_ms);
            let idx = core.agents.len() as u32;
            core.agent_idx.insert(rec.id.clone(), idx);
            core.agents.push(Agent::new(rec, now.mono));
        }
        // Every agent may have been told the interval of a cell this size (no
        // larger one held them, unless `max_heartbeat_rate` went down): none is
        // lost, and no exclusive copy replaced, before that interval's timeouts.
        core.live_agents = core.agents.len();
        let told = core.told_now();
        for a in &mut core.agents {
            a.told(now.mono, told);
        }
        core.quotas = snapshot.quotas.into_iter().collect();
        core.user_grants = snapshot
            .user_grants
            .into_iter()
            .filter(|(_, users)| !users.is_empty())
            .collect();
        let fired: std::collections::HashMap<String, UnixMillis> =
            snapshot.cron_fired.into_iter().collect();
        core.drains = Drains::rebuild(&core.agents, now);
        for at in core.drains.deadlines() {
            core.push_timer(at, Timer::Drain);
        }
        for job in snapshot.jobs {
            let constraints = constraints_of(&job.spec).unwrap_or_default();
            // A stored schedule that no longer parses (e.g. the seconds switch was
            // turned off) leaves the job without firings, loudly in its view.
            let cron = match core.schedule_of(&job.spec) {
                Ok(Some(schedule)) => Some(CronState {
                    schedule,
                    next: None,
                    last_fired: fired.get(&job.key).copied(),
                }),
                _ => None,
            };
            let mut j = Job::new(job.key.clone(), Arc::new(job.spec), job.created_ms);
            j.constraints = constraints;
            j.cron = cron;
            core.jobs.insert(job.key, j);
        }
        for c in snapshot.configs {
            if let Some(job) = core.jobs.get_mut(&c.job) {
                job.configs
                    .entry(c.hash)
                    .or_insert_with(|| JobConfig::new(Arc::new(c.spec), c.used_ms))
                    .used_ms = c.used_ms;
            }
        }
        // Instances an update is removing keep their slots until their tasks end.
        for task in &snapshot.tasks {
            if let Some(job) = core.jobs.get_mut(&task.job) {
                let want = task.instance as usize + 1;
                if job.slots.len() < want && !task.status.state.is_terminal() {
                    job.slots.resize(want, Slot::default());
                }
            }
        }
        let mut tasks = snapshot.tasks;
        tasks.sort_by(|a, b| (&a.job, a.instance, a.gen).cmp(&(&b.job, b.instance, b.gen)));
        let grace_until = now.mono + core.cfg.restart_grace_ms;
        for task in tasks {
            let Some(job) = core.jobs.get_mut(&task.job) else {
                continue;
            };
            let mut task = task;
            if task.config.is_empty() {
                task.config = job.config.clone();
            }
            let need = job.need_for(&task.config);
            let Some(slot) = job.slots.get_mut(task.instance as usize) else {
                continue;
            };
            if let Some(prev) = slot.current.take() {
                slot.history.push_back(prev);
            }
            slot.current = Some(task.id.clone());
            let state = task.status.state;
            // The age counts up to what a decision needs: the flapping threshold,
            // the job's SLA `min_time` (a drain's healthy instances) or its update
            // `watch` (an update's watched instances).
            let min_time = job
                .spec
                .sla_policy
                .as_ref()
                .map_or(0, |p| p.min_time.get().as_millis() as u64);
            let watch = job.spec.update.watch.0.as_millis() as u64;
            let cap = core.cfg.flapping_threshold_ms.max(min_time).max(watch);
            task.running_mono = task.running_since.map(|s| now.mono_of(s, cap));
            if state.is_on_agent() {
                if let Some(&idx) = task.agent.as_ref().and_then(|a| core.agent_idx.get(a)) {
                    let agent = &mut core.agents[idx as usize];
                    agent.used_cpu_milli += need.cpu_milli;
                    agent.used_ram += need.ram;
                    agent.used_disk += need.disk;
                    for (_, p) in &task.ports {
                        agent.used_ports.insert(*p);
                    }
                    agent.tasks.insert(task.id.clone());
                }
            }
            match state {
                TaskState::Pending => core.queue.push_back(task.id.clone()),
                TaskState::Throttled => {
                    let at = now.mono_of(
                        task.throttle_until.unwrap_or(now.wall).max(now.wall),
                        core.cfg.throttle_max_ms,
                    );
                    core.push_timer(
                        at,
                        Timer::Throttle {
                            task: task.id.clone(),
                        },
                    );
                }
                TaskState::Assigned | TaskState::Starting => {
                    let timeout = core.cfg.transient_timeout_ms;
                    let since = now.mono_of(task.status.since(), timeout);
                    let at = (since + timeout).max(grace_until);
                    core.push_timer(
                        at,
                        Timer::Transient {
                            task: task.id.clone(),
                            state,
                        },
                    );
                }
                _ => {}
            }
            if let (Some(at_wall), true) = (task.withdrawn_ms, state.is_stopping()) {
                // A held kill goes when its drain delay is over, as before the restart.
                let delay = core.drain_delay_ms(&task);
                core.push_timer(
                    now.mono_of(at_wall, delay) + delay,
                    Timer::Withdrawn {
                        task: task.id.clone(),
                    },
                );
            }
            core.tasks.insert(task.id.clone(), Box::new(task));
        }
        for job in core.jobs.values_mut() {
            for slot in &mut job.slots {
                slot.seen = slot
                    .current
                    .as_ref()
                    .and_then(|id| core.tasks.get(id))
                    .map(|t| (t.status.state, t.running_mono));
            }
        }
        core.load_updates(snapshot.updates);
        core.rebuild_usage();
        if !core.agents.is_empty() {
            core.start_reconciliation(now);
        }
        core.resume_cron(now);
        core
    }
}

impl Core {
    /// Cron jobs after a restart: the latest firing missed while the master was
    /// down runs now if within `cron_grace`, then the timers are armed.
    fn resume_cron(&mut self, now: Now) {
        let keys: Vec<String> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.cron.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(job) = self.jobs.get(&key) else {
                continue;
            };
            let Some(cron) = job.cron.as_ref() else {
                continue;
            };
            let since = cron.last_fired.unwrap_or(job.created_ms);
            if let Some(missed) = catch_up(&cron.schedule, since, now.wall, self.cfg.cron_grace_ms)
            {
                self.cron_fire(&key, Some(missed), now);
            }
            self.arm_cron(&key, now.wall, now);
        }
    }
}
