//! Role quotas (Aurora): an admin bounds the production resources (cpu, ram, disk)
//! each role may hold; creating a production job that would go past its role's
//! quota is refused, stating the quota, what is in use and what was asked, and so
//! is an update (StartUpdate) after which the job's instances would hold more than
//! the quota leaves it. Non-production (`preemptible`) jobs are not counted. A role without a quota is
//! not bounded.
//!
//! What a role uses: for every production job of the role that is active (has a
//! task that is not terminal, or is a cron template), each instance's resources by
//! the task config it runs (jobs being updated run several), counted where that
//! config is production, whatever state the tasks are in (a PENDING production
//! task is promised its room). The arithmetic ([`Usage`], [`check`]) is pure.

use serde::{Deserialize, Serialize};

use drover_common::spec::JobSpec;
use drover_common::wire::QuotaView;

use super::model::{cpu_to_milli, need_of, Need};
use super::{Change, Core, CoreError, Reply};

/// Production resources: cpu in thousandths of a core, ram and disk in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_milli: u64,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
}

impl Usage {
    /// `n` tasks of `need`.
    pub(super) fn of(need: &Need, n: u32) -> Usage {
        let n = u64::from(n);
        Usage {
            cpu_milli: need.cpu_milli.saturating_mul(n),
            ram_bytes: need.ram.saturating_mul(n),
            disk_bytes: need.disk.saturating_mul(n),
        }
    }

    /// The sum of both.
    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            cpu_milli: self.cpu_milli.saturating_add(o.cpu_milli),
            ram_bytes: self.ram_bytes.saturating_add(o.ram_bytes),
            disk_bytes: self.disk_bytes.saturating_add(o.disk_bytes),
        }
    }

    /// Every resource of `self` within `limit`'s.
    pub fn within(&self, limit: &Usage) -> bool {
        self.cpu_milli <= limit.cpu_milli
            && self.ram_bytes <= limit.ram_bytes
            && self.disk_bytes <= limit.disk_bytes
    }

    /// For people: "cpu 2.5, ram 512 MiB, disk 1024 MiB".
    pub fn describe(&self) -> String {
        format!(
            "cpu {}, ram {}, disk {}",
            self.cpu_milli as f64 / 1000.0,
            bytes(self.ram_bytes),
            bytes(self.disk_bytes)
        )
    }

    /// The wire form.
    pub fn to_wire(self) -> drover_common::wire::QuotaResources {
        drover_common::wire::QuotaResources {
            cpu: self.cpu_milli as f64 / 1000.0,
            ram_bytes: self.ram_bytes,
            disk_bytes: self.disk_bytes,
        }
    }

    /// From the wire form (cpu in cores).
    pub fn from_wire(r: &drover_common::wire::QuotaResources) -> Usage {
        Usage {
            cpu_milli: cpu_to_milli(r.cpu),
            ram_bytes: r.ram_bytes,
            disk_bytes: r.disk_bytes,
        }
    }
}

fn bytes(b: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if b.is_multiple_of(MIB) {
        format!("{} MiB", b / MIB)
    } else {
        format!("{b} bytes")
    }
}

/// `asked` on top of `in_use` within `quota`, or the refusal naming all three.
pub fn check(role: &str, quota: &Usage, in_use: &Usage, asked: &Usage) -> Result<(), CoreError> {
    if in_use.plus(*asked).within(quota) {
        return Ok(());
    }
    Err(CoreError::QuotaExceeded {
        role: role.to_string(),
        quota: quota.describe(),
        in_use: in_use.describe(),
        asked: asked.describe(),
    })
}

impl Core {
    /// The production resources the role's active jobs hold, leaving out `except`.
    pub(super) fn quota_usage(&self, role: &str, except: Option<&str>) -> Usage {
        let mut total = Usage::default();
        for job in self.jobs.values() {
            if job.spec.role != role || !job.spec.is_production() {
                continue;
            }
            if except == Some(job.key.as_str()) {
                continue;
            }
            if job.cron.is_some() {
                total = total.plus(Usage::of(&job.need, job.spec.instances));
            } else if self.job_active(&job.key) {
                for hash in self.instance_configs(&job.key) {
                    if job.spec_of(&hash).is_production() {
                        total = total.plus(Usage::of(&job.need_for(&hash), 1));
                    }
                }
            }
        }
        total
    }

    /// Refuses an update of job `key` to config `new` (hash, spec) after which its
    /// instances (`after`: the config hash each runs once the update is done)
    /// would hold more production resources than the role's quota leaves it. What
    /// is asked is the job's production resources after the update, as for a create.
    pub(super) fn check_update_quota(
        &self,
        key: &str,
        new: (&str, &JobSpec),
        after: &[String],
    ) -> Result<(), CoreError> {
        let Some(job) = self.jobs.get(key) else {
            return Ok(());
        };
        let role = job.spec.role.as_str();
        let Some(quota) = self.quotas.get(role) else {
            return Ok(());
        };
        let new_need = need_of(new.1);
        let mut asked = Usage::default();
        for hash in after {
            let (production, need) = if hash == new.0 {
                (new.1.is_production(), new_need)
            } else {
                (job.spec_of(hash).is_production(), job.need_for(hash))
            };
            if production {
                asked = asked.plus(Usage::of(&need, 1));
            }
        }
        if asked == Usage::default() {
            return Ok(());
        }
        check(role, quota, &self.quota_usage(role, Some(key)), &asked)
    }

    /// Refuses a production job `key` of `role` asking `need` x `instances` past the
    /// role's quota (the job's own earlier version is not counted).
    pub(super) fn check_quota(
        &self,
        role: &str,
        key: &str,
        need: &Need,
        instances: u32,
    ) -> Result<(), CoreError> {
        let Some(quota) = self.quotas.get(role) else {
            return Ok(());
        };
        let in_use = self.quota_usage(role, Some(key));
        check(role, quota, &in_use, &Usage::of(need, instances))
    }

    /// POST /v1/quotas/{role}: sets (or with None removes) the role's quota.
    pub(super) fn set_quota(
        &mut self,
        role: String,
        quota: Option<Usage>,
    ) -> Result<Reply, CoreError> {
        match quota {
            Some(q) => {
                self.quotas.insert(role.clone(), q);
            }
            None => {
                self.quotas.remove(&role);
            }
        }
        self.job_changes.push(Change::PutQuota(role.clone(), quota));
        Ok(Reply::Quota(self.quota_view(&role)))
    }

    /// One role's quota and use.
    pub fn quota_view(&self, role: &str) -> QuotaView {
        QuotaView {
            role: role.to_string(),
            quota: self.quotas.get(role).map(|q| q.to_wire()),
            in_use: self.quota_usage(role, None).to_wire(),
        }
    }

    /// Every role with a quota or production jobs, sorted by role.
    pub fn quota_views(&self) -> Vec<QuotaView> {
        let mut roles: std::collections::BTreeSet<&str> =
            self.quotas.keys().map(String::as_str).collect();
        for job in self.jobs.values() {
            if job.spec.is_production() {
                roles.insert(job.spec.role.as_str());
            }
        }
        roles.into_iter().map(|r| self.quota_view(r)).collect()
    }
}
