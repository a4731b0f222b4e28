//! Rolling restart of a whole job (`POST .../restart` without instances): the
//! job's live instances are replaced batch by batch, each on the config it runs,
//! as an update to the same configs. The update engine (`rollout.rs`) drives it:
//! a batch's tasks are withdrawn from service discovery, killed after the job's
//! `announce.drain_delay` (`withdraw_before_kill`), replaced at once, and the
//! next batch starts only when every replacement of this one has been RUNNING
//! (healthy) for the update's `watch`; batches have the job's `update.batch_size`.
//! It shows, pauses, resumes and aborts as an update (`GET .../update`); it has no
//! rollback (a failed instance fails it: nothing changed to go back from).
//!
//! The decisions are pure functions here (which restart rolls, which instances
//! it takes, whether the engine replaces a task that already runs its target
//! config); `Core::start_restart` applies them.

use std::sync::Arc;

use drover_common::configs::format_ranges;
use drover_common::wire::{ActionResponse, InstanceProgress, InstanceUpdateState};

use super::update::{UpdateRecord, UpdateStart};
use super::{Core, CoreError, Now, Reply};

/// Whether a restart rolls: a whole job (`instances` None) unless asked
/// `all_at_once`; named instances restart at once, as they always did.
pub fn rolls(instances: Option<&[u32]>, all_at_once: bool) -> bool {
    instances.is_none() && !all_at_once
}

/// The instances a rolling restart takes, in order, each on the config it runs:
/// those whose current task has not ended (`current`: per instance, its task's
/// config and whether that task is live). An ended instance (a batch task that
/// finished or gave up, a killed instance) stays as it is.
pub fn plan(current: &[(u32, String, bool)]) -> Vec<InstanceProgress> {
    current
        .iter()
        .filter(|(_, _, live)| *live)
        .map(|(instance, config, _)| InstanceProgress {
            instance: *instance,
            from: Some(config.clone()),
            to: Some(config.clone()),
            state: InstanceUpdateState::Pending,
            failures: 0,
        })
        .collect()
}

/// Whether the engine, starting an instance of its batch, replaces the live task
/// there: always for a restart (it runs the target config already: that is the
/// point), only when its config differs for an update.
pub fn replaces(restart: bool, same_config: bool) -> bool {
    restart || !same_config
}

impl Core {
    /// A rolling restart of the whole `job`, started by `user`: an update record
    /// the engine drives from this event on. Refused while an update runs.
    pub(super) fn start_restart(
        &mut self,
        job: &str,
        user: &str,
        now: Now,
    ) -> Result<Reply, CoreError> {
        let Some(j) = self.jobs.get(job) else {
            return Err(CoreError::NoJob(job.to_string()));
        };
        self.refuse_if_updating(job)?;
        let current: Vec<(u32, String, bool)> = j
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let t = self.tasks.get(s.current.as_ref()?)?;
                Some((i as u32, t.config.clone(), !t.status.state.is_terminal()))
            })
            .collect();
        let progress = plan(&current);
        let reply = |update: Option<String>| {
            Ok(Reply::Action(ActionResponse {
                job: job.to_string(),
                tasks: Vec::new(),
                update,
            }))
        };
        if progress.is_empty() {
            return reply(None);
        }
        // Each replacement runs its instance's config: its user must be granted.
        self.check_configs_user(job, progress.iter().filter_map(|p| p.to.as_ref()))?;
        let mut settings = j.spec.update.clone();
        settings.rollback_on_failure = false;
        let count = j.slots.len() as u32;
        let list: Vec<u32> = progress.iter().map(|p| p.instance).collect();
        let id = format!("{}-restart-{}", job.replace('/', "-"), now.wall);
        let mut u = UpdateRecord::started(
            UpdateStart {
                id: id.clone(),
                job: job.to_string(),
                user: user.to_string(),
                settings,
                to_config: j.config.clone(),
                old_config: j.config.clone(),
                instances_before: count,
                instances_after: count,
                instances: progress,
                restart: true,
            },
            now,
        );
        u.event(
            now,
            format!(
                "rolling restart started by {user}: instances [{}] each on its own config; \
                 batch size {}, watch {}; no rollback",
                format_ranges(&list),
                u.view.settings.batch_size,
                u.view.settings.watch
            ),
        );
        self.updates.insert(job.to_string(), Arc::new(u));
        self.dirty_updates.insert(job.to_string());
        reply(Some(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_job_rolls_and_only_unless_asked_all_at_once() {
        assert!(rolls(None, false));
        assert!(!rolls(None, true));
        assert!(!rolls(Some(&[0, 1, 2]), false));
        assert!(!rolls(Some(&[0]), true));
    }

    #[test]
    fn the_plan_takes_live_instances_in_order_on_their_own_configs() {
        let current = vec![
            (0, "a".to_string(), true),
            (1, "b".to_string(), false),
            (2, "b".to_string(), true),
        ];
        let p = plan(&current);
        let got: Vec<(u32, Option<&str>, Option<&str>)> = p
            .iter()
            .map(|p| (p.instance, p.from.as_deref(), p.to.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![(0, Some("a"), Some("a")), (2, Some("b"), Some("b"))]
        );
        assert!(p.iter().all(|p| p.state == InstanceUpdateState::Pending));
        assert!(plan(&[(0, "a".to_string(), false)]).is_empty());
    }

    #[test]
    fn a_restart_replaces_a_task_on_its_target_config_an_update_does_not() {
        assert!(replaces(true, true));
        assert!(replaces(true, false));
        assert!(!replaces(false, true));
        assert!(replaces(false, false));
    }
}
