//! Who a role's tasks may run as. A task runs as its job's `run_as_user`
//! (`task.user`, else the role's name); a role's token may run tasks as the role's
//! own user, and as any other user only once an admin granted it to the role
//! (`drover role grant-user ROLE USER`). The grants are stored like quotas (one
//! record per role) and checked on every path that starts tasks under a user an
//! operator asks for: create (cron templates too), update (the new config and the
//! configs its rollback would go back to), restart, a manual cron run, and an
//! update's resume and rollback. The rule itself ([`may_run_as`], [`check`]) is pure.
//!
//! A job whose user is revoked later is not killed: it runs on (replacements after
//! failures and agent loss, and scheduled cron firings, keep its config), is
//! flagged in its view and in `/metrics`, and the next of the operator paths above
//! is refused. Root needs more than a grant: `task.allow_root` in the spec and
//! `allow_root` on the agent, as before; and every agent checks the user against
//! its own `task_users` list whatever the master says.

use std::collections::{BTreeMap, BTreeSet};

use drover_common::spec::JobSpec;
use drover_common::wire::RoleView;

use super::{Change, Core, CoreError, Reply};

/// The users granted to each role (beside the role's own).
pub type UserGrants = BTreeMap<String, BTreeSet<String>>;

/// Whether tasks of `role` may run as `user`: the role's own user always, another
/// only when granted.
pub fn may_run_as(role: &str, user: &str, granted: Option<&BTreeSet<String>>) -> bool {
    user == role || granted.is_some_and(|g| g.contains(user))
}

/// The spec's tasks may run as its user under `grants`, or the refusal naming
/// `task.user`, the role and how to grant it.
pub fn check(spec: &JobSpec, grants: &UserGrants) -> Result<(), CoreError> {
    let user = spec.run_as_user();
    if may_run_as(&spec.role, user, grants.get(&spec.role)) {
        return Ok(());
    }
    Err(CoreError::UserNotGranted {
        role: spec.role.clone(),
        user: user.to_string(),
    })
}

impl Core {
    /// Refuses `spec` when its role may not run tasks as its user.
    pub(super) fn check_user(&self, spec: &JobSpec) -> Result<(), CoreError> {
        check(spec, &self.user_grants)
    }

    /// Refuses when any of the job's configs `hashes` runs as a user its role is
    /// not granted.
    pub(super) fn check_configs_user<'a>(
        &self,
        job: &str,
        hashes: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), CoreError> {
        let Some(j) = self.jobs.get(job) else {
            return Ok(());
        };
        for hash in hashes {
            self.check_user(j.spec_of(hash))?;
        }
        Ok(())
    }

    /// POST /v1/roles/{role}/grant-user (`granted`) or .../revoke-user.
    pub(super) fn set_user_grant(
        &mut self,
        role: String,
        user: String,
        granted: bool,
    ) -> Result<Reply, CoreError> {
        let users = self.user_grants.entry(role.clone()).or_default();
        let changed = if granted {
            users.insert(user)
        } else {
            users.remove(&user)
        };
        let users = users.clone();
        if users.is_empty() {
            self.user_grants.remove(&role);
        }
        if changed {
            self.job_changes
                .push(Change::PutUserGrants(role.clone(), users));
        }
        Ok(Reply::Role(self.role_view(&role)))
    }

    /// The user of a live task (or of the cron template) of job `key` that its role
    /// is not granted, if any: the job is flagged.
    pub fn ungranted_user(&self, key: &str) -> Option<String> {
        let job = self.jobs.get(key)?;
        let granted = self.user_grants.get(&job.spec.role);
        let refused = |spec: &JobSpec| {
            let user = spec.run_as_user();
            (!may_run_as(&spec.role, user, granted)).then(|| user.to_string())
        };
        if job.cron.is_some() {
            if let Some(user) = refused(&job.spec) {
                return Some(user);
            }
        }
        let mut seen = BTreeSet::new();
        for slot in &job.slots {
            let Some(task) = slot.current.as_ref().and_then(|id| self.tasks.get(id)) else {
                continue;
            };
            if task.status.state.is_terminal() || !seen.insert(task.config.as_str()) {
                continue;
            }
            if let Some(user) = refused(job.spec_of(&task.config)) {
                return Some(user);
            }
        }
        None
    }

    /// The keys of the flagged jobs (`ungranted_user`) of `role`, or of every role.
    pub(super) fn ungranted_jobs(&self, role: Option<&str>) -> Vec<String> {
        self.jobs
            .values()
            .filter(|j| role.is_none_or(|r| j.spec.role == r))
            .filter(|j| self.ungranted_user(&j.key).is_some())
            .map(|j| j.key.clone())
            .collect()
    }

    /// GET /v1/roles/{role}.
    pub fn role_view(&self, role: &str) -> RoleView {
        RoleView {
            role: role.to_string(),
            user: role.to_string(),
            granted_users: self
                .user_grants
                .get(role)
                .map(|u| u.iter().cloned().collect())
                .unwrap_or_default(),
            ungranted_jobs: self.ungranted_jobs(Some(role)),
        }
    }
}
