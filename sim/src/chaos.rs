//! What happens at random between the messages: operators (create, kill, restart,
//! updates and their steering, cordon/drain/activate, cron start and deschedule,
//! the eviction guard's release) and faults (partitions, loss and reordering,
//! crashes of the master, agents and hosts, full and slow disks, clock steps).

use drover_master::core::{Event, MaintenanceOp, UpdateAction};

use crate::world::World;

/// One random act.
pub fn act(w: &mut World) -> Result<(), String> {
    let roll = w.rng.below(1000);
    let n_jobs = w.jobs.len();
    let n_agents = w.agents.len();
    match roll {
        // Operators.
        // Keep the cluster busy but not buried: at most 25 jobs.
        0..=119 if n_jobs < 25 => w.create_job()?,
        120..=169 if n_jobs > 0 => {
            let j = w.rng.pick(n_jobs);
            let job = w.jobs[j].key.clone();
            let instances = w
                .rng
                .chance(400)
                .then(|| vec![w.rng.below(u64::from(w.jobs[j].spec.instances)) as u32]);
            w.operator(
                Event::Kill {
                    job: job.clone(),
                    instances: instances.clone(),
                },
                format!("kill {job} {instances:?}"),
            )?;
        }
        170..=209 if n_jobs > 0 => {
            let j = w.rng.pick(n_jobs);
            let job = w.jobs[j].key.clone();
            let instances = w
                .rng
                .chance(500)
                .then(|| vec![w.rng.below(u64::from(w.jobs[j].spec.instances)) as u32]);
            // A whole job restarts rolling half the time (`drover job restart KEY`),
            // else all at once (`--all-at-once`, or named instances).
            if instances.is_none() && w.rng.chance(500) {
                w.operator(
                    Event::RollingRestart {
                        job: job.clone(),
                        user: "sim".to_string(),
                    },
                    format!("rolling restart {job}"),
                )?;
            } else {
                w.operator(
                    Event::Restart {
                        job: job.clone(),
                        instances: instances.clone(),
                    },
                    format!("restart {job} {instances:?}"),
                )?;
            }
        }
        210..=279 if n_jobs > 0 => {
            let j = w.rng.pick(n_jobs);
            if !w.jobs[j].cron {
                w.update_job(j)?;
            }
        }
        280..=319 if n_jobs > 0 => {
            let j = w.rng.pick(n_jobs);
            let action = [
                UpdateAction::Pause,
                UpdateAction::Resume,
                UpdateAction::Abort,
                UpdateAction::Rollback,
                UpdateAction::Rollback,
            ][w.rng.pick(5)];
            w.update_action(j, action)?;
        }
        320..=339 => {
            let a = w.rng.pick(n_agents);
            w.maintenance(MaintenanceOp::Cordon, a)?;
        }
        340..=369 => {
            // Operators drain hosts that act up: often one cut off right now.
            let cut: Vec<usize> = (0..n_agents).filter(|&a| w.cut_off(a)).collect();
            let a = if !cut.is_empty() && w.rng.chance(500) {
                cut[w.rng.pick(cut.len())]
            } else {
                w.rng.pick(n_agents)
            };
            let deadline_ms = w.rng.chance(500).then(|| w.rng.range(1_000, 20_000));
            w.maintenance(MaintenanceOp::Drain { deadline_ms }, a)?;
        }
        370..=419 => {
            let a = w.rng.pick(n_agents);
            w.maintenance(MaintenanceOp::Activate, a)?;
        }
        420..=434 if n_jobs > 0 => {
            let j = w.rng.pick(n_jobs);
            if w.jobs[j].cron {
                let job = w.jobs[j].key.clone();
                let (event, what) = if w.rng.chance(800) {
                    (Event::CronStart { job: job.clone() }, "start")
                } else {
                    (Event::CronDeschedule { job: job.clone() }, "deschedule")
                };
                w.operator(event, format!("cron {what} {job}"))?;
            }
        }
        435..=439 => {
            w.operator(Event::ReleaseEvictionGuard, "release eviction guard".into())?;
        }
        // Faults.
        440..=489 => {
            let a = w.rng.pick(n_agents);
            let ms = if w.rng.chance(300) {
                w.rng.range(3_000, 30_000)
            } else {
                w.rng.range(100, 2_500)
            };
            w.partition(a, ms);
        }
        490..=509 => {
            let (loss, reorder) = match w.rng.below(4) {
                0 => (0, 0),
                1 => (10, 50),
                2 => (100, 200),
                _ => (300, 500),
            };
            w.set_network(loss, reorder);
        }
        510..=519 if w.master.core.is_some() => w.master_crash(),
        520..=539 => {
            let a = w.rng.pick(n_agents);
            if w.agents[a].up {
                let reboot = w.rng.chance(300);
                let wipe = w.rng.chance(200);
                w.agent_crash(a, reboot, wipe);
            }
        }
        540..=549 => {
            let ms = w.rng.range(500, 8_000);
            w.disk_full(ms);
        }
        550..=564 => {
            let ms = w.rng.range(500, 10_000);
            w.disk_slow(ms);
        }
        565..=574 => {
            let ms = w.rng.range(0, 7_200_000) as i64 - 3_600_000;
            w.master_wall_step(ms);
        }
        575..=584 => {
            let a = w.rng.pick(n_agents);
            let ms = w.rng.range(0, 600_000) as i64 - 300_000;
            w.agent_wall_step(a, ms);
        }
        // Most of the time, nothing: the cluster runs.
        _ => {}
    }
    Ok(())
}
