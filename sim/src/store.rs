//! The simulated disk under the master: the store's tables as maps, written one
//! group commit at a time with the semantics of the SQLite store
//! (`master/src/store.rs`, `commit_to`): changes applied in order, later ones win,
//! a deleted job takes its cron firing, configs and update record with it. Records
//! go through their stored (JSON) form, so what a restarted master loads is what
//! the real store would give it (fields the store does not keep are gone).

use std::collections::{BTreeMap, BTreeSet};

use drover_master::core::Usage;
use drover_master::core::{
    AgentRecord, Change, ConfigRecord, JobRecord, Snapshot, Task, UpdateRecord,
};

/// What is on the master's disk.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    jobs: BTreeMap<String, JobRecord>,
    tasks: BTreeMap<String, Task>,
    agents: BTreeMap<String, AgentRecord>,
    quotas: BTreeMap<String, Usage>,
    user_grants: BTreeMap<String, BTreeSet<String>>,
    fired: BTreeMap<String, u64>,
    configs: BTreeMap<(String, String), ConfigRecord>,
    updates: BTreeMap<String, UpdateRecord>,
    index: u64,
}

/// A record through its stored form (the SQLite store keeps JSON).
/// A record the store cannot encode would fail the commit for good: the
/// simulator reports it as a violation.
fn stored<T: serde::Serialize + serde::de::DeserializeOwned>(v: &T) -> Result<T, String> {
    serde_json::to_value(v)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("a record does not survive its stored form: {e}"))
}

impl MemStore {
    /// Applies one commit (several batches' changes, in order).
    pub fn commit(&mut self, changes: &[Change]) -> Result<(), String> {
        for c in changes {
            match c {
                Change::PutJob(spec, key, created) => {
                    self.jobs.insert(
                        key.clone(),
                        JobRecord {
                            key: key.clone(),
                            spec: stored(spec.as_ref())?,
                            created_ms: *created,
                        },
                    );
                }
                Change::DeleteJob(key) => {
                    self.jobs.remove(key);
                    self.fired.remove(key);
                    self.configs.retain(|(job, _), _| job != key);
                    self.updates.remove(key);
                }
                Change::PutConfig {
                    job,
                    hash,
                    spec,
                    used_ms,
                } => {
                    self.configs.insert(
                        (job.clone(), hash.clone()),
                        ConfigRecord {
                            job: job.clone(),
                            hash: hash.clone(),
                            spec: stored(spec.as_ref())?,
                            used_ms: *used_ms,
                        },
                    );
                }
                Change::DeleteConfig { job, hash } => {
                    self.configs.remove(&(job.clone(), hash.clone()));
                }
                Change::PutUpdate(u) => {
                    self.updates.insert(u.view.job.clone(), stored(u.as_ref())?);
                }
                Change::PutTask(t) => {
                    self.tasks.insert(t.id.clone(), stored(t.as_ref())?);
                }
                Change::DeleteTask(id) => {
                    self.tasks.remove(id);
                }
                Change::PutAgent(a) => {
                    self.agents.insert(a.id.clone(), stored(a.as_ref())?);
                }
                Change::PutQuota(role, Some(q)) => {
                    self.quotas.insert(role.clone(), *q);
                }
                Change::PutQuota(role, None) => {
                    self.quotas.remove(role);
                }
                Change::PutUserGrants(role, users) if users.is_empty() => {
                    self.user_grants.remove(role);
                }
                Change::PutUserGrants(role, users) => {
                    self.user_grants.insert(role.clone(), users.clone());
                }
                Change::PutCronFired(job, at) => {
                    self.fired.insert(job.clone(), *at);
                }
                Change::Index(i) => self.index = *i,
            }
        }
        Ok(())
    }

    /// Everything stored, as `Core::load` takes it.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            jobs: self.jobs.values().cloned().collect(),
            tasks: self.tasks.values().cloned().collect(),
            agents: self.agents.values().cloned().collect(),
            quotas: self.quotas.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            user_grants: self
                .user_grants
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cron_fired: self.fired.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            index: self.index,
            configs: self.configs.values().cloned().collect(),
            updates: self.updates.values().cloned().collect(),
        }
    }

    /// A stored task.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.get(id)
    }
}
