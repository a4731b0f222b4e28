//! The stored form of a `Change`, described once for both stores: which table
//! (SQLite's table, etcd's key segment) a change writes or deletes, under which
//! key, and the record's JSON. `store/sqlite.rs` and `etcd_store.rs` each turn a
//! [`Write`] into their own statements mechanically; a new change kind is its
//! arm in [`write_of`] (and, for a new kind of row, a [`Row`] variant the two
//! stores' matches then ask for). Pure.

use std::collections::BTreeSet;

use drover_common::spec::JobSpec;
use drover_common::state::UnixMillis;
use serde::Serialize;

use super::StoreError;
use crate::core::{AgentRecord, Change, Task, UpdateRecord, Usage};

/// A table of the stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    Jobs,
    Tasks,
    Agents,
    Quotas,
    UserGrants,
    CronFired,
    Updates,
    Configs,
    Meta,
}

impl Table {
    /// Its key segment in etcd (`<prefix><segment>/<key>`).
    pub fn segment(self) -> &'static str {
        match self {
            Table::Configs => "configs",
            other => other.sqlite(),
        }
    }

    /// Its SQLite table.
    pub fn sqlite(self) -> &'static str {
        match self {
            Table::Jobs => "jobs",
            Table::Tasks => "tasks",
            Table::Agents => "agents",
            Table::Quotas => "quotas",
            Table::UserGrants => "user_grants",
            Table::CronFired => "cron_fired",
            Table::Updates => "updates",
            Table::Configs => "job_configs",
            Table::Meta => "meta",
        }
    }

    /// The SQLite column holding a row's key.
    pub fn key_column(self) -> &'static str {
        match self {
            Table::Jobs | Table::Meta => "key",
            Table::Tasks | Table::Agents => "id",
            Table::Quotas | Table::UserGrants => "role",
            Table::CronFired | Table::Updates | Table::Configs => "job",
        }
    }
}

/// One row as written.
#[derive(Clone, Copy, Debug)]
pub enum Row<'a> {
    Job {
        key: &'a str,
        spec: &'a JobSpec,
        created_ms: UnixMillis,
    },
    Task(&'a Task),
    Agent(&'a AgentRecord),
    Quota(&'a str, &'a Usage),
    UserGrants(&'a str, &'a BTreeSet<String>),
    CronFired(&'a str, UnixMillis),
    /// The number of the last batch stored (`meta/index`).
    Index(u64),
    Config {
        job: &'a str,
        hash: &'a str,
        spec: &'a JobSpec,
        used_ms: UnixMillis,
    },
    Update(&'a UpdateRecord),
}

impl Row<'_> {
    /// The table it is written to.
    pub fn table(&self) -> Table {
        match self {
            Row::Job { .. } => Table::Jobs,
            Row::Task(_) => Table::Tasks,
            Row::Agent(_) => Table::Agents,
            Row::Quota(..) => Table::Quotas,
            Row::UserGrants(..) => Table::UserGrants,
            Row::CronFired(..) => Table::CronFired,
            Row::Index(_) => Table::Meta,
            Row::Config { .. } => Table::Configs,
            Row::Update(_) => Table::Updates,
        }
    }

    /// Its key in its table (a config's: the job's; the hash tells it apart).
    pub fn key(&self) -> &str {
        match self {
            Row::Job { key, .. } => key,
            Row::Task(t) => &t.id,
            Row::Agent(a) => &a.id,
            Row::Quota(role, _) | Row::UserGrants(role, _) => role,
            Row::CronFired(job, _) => job,
            Row::Index(_) => "index",
            Row::Config { job, .. } => job,
            Row::Update(u) => &u.view.job,
        }
    }

    /// What it is, for errors.
    pub fn what(&self) -> &'static str {
        match self {
            Row::Job { .. } => "job",
            Row::Task(_) => "task",
            Row::Agent(_) => "agent",
            Row::Quota(..) => "quota",
            Row::UserGrants(..) => "user grants",
            Row::CronFired(..) => "cron firing",
            Row::Index(_) => "index",
            Row::Config { .. } => "config",
            Row::Update(_) => "update",
        }
    }

    /// The record's JSON as both stores keep it (a job's and a config's: the spec;
    /// each store adds what it keeps beside it). None for the plain numbers (a
    /// cron firing, the index).
    pub fn json(&self) -> Result<Option<String>, StoreError> {
        match self {
            Row::Job { key, spec, .. } => encode("job", key, spec).map(Some),
            Row::Task(t) => encode("task", &t.id, t).map(Some),
            Row::Agent(a) => encode("agent", &a.id, a).map(Some),
            Row::Quota(role, q) => encode("quota", role, q).map(Some),
            Row::UserGrants(role, users) => encode("user grants", role, users).map(Some),
            Row::Config {
                job, hash, spec, ..
            } => encode("config", &format!("{job} {hash}"), spec).map(Some),
            Row::Update(u) => encode("update", &u.view.job, u).map(Some),
            Row::CronFired(..) | Row::Index(_) => Ok(None),
        }
    }
}

/// The JSON of `value`, or the error naming what it is and its key.
pub fn encode<T: Serialize + ?Sized>(
    what: &'static str,
    key: &str,
    value: &T,
) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|source| StoreError::Encode {
        what,
        key: key.to_string(),
        source,
    })
}

/// One change as a write of the stored state.
#[derive(Clone, Copy, Debug)]
pub enum Write<'a> {
    /// The row put in place of the stored one.
    Put(Row<'a>),
    /// The row of `table` with this key deleted.
    Delete(Table, &'a str),
    /// One config of a job deleted.
    DeleteConfig { job: &'a str, hash: &'a str },
    /// A job's row deleted with everything stored under it: its cron firing, its
    /// update and its configs.
    DeleteJob(&'a str),
}

/// How `change` is stored.
pub fn write_of(change: &Change) -> Write<'_> {
    match change {
        Change::PutJob(spec, key, created) => Write::Put(Row::Job {
            key,
            spec,
            created_ms: *created,
        }),
        Change::DeleteJob(key) => Write::DeleteJob(key),
        Change::PutTask(t) => Write::Put(Row::Task(t)),
        Change::DeleteTask(id) => Write::Delete(Table::Tasks, id),
        Change::PutAgent(a) => Write::Put(Row::Agent(a)),
        Change::PutQuota(role, Some(q)) => Write::Put(Row::Quota(role, q)),
        Change::PutQuota(role, None) => Write::Delete(Table::Quotas, role),
        Change::PutUserGrants(role, users) if users.is_empty() => {
            Write::Delete(Table::UserGrants, role)
        }
        Change::PutUserGrants(role, users) => Write::Put(Row::UserGrants(role, users)),
        Change::PutCronFired(job, at) => Write::Put(Row::CronFired(job, *at)),
        Change::Index(index) => Write::Put(Row::Index(*index)),
        Change::PutConfig {
            job,
            hash,
            spec,
            used_ms,
        } => Write::Put(Row::Config {
            job,
            hash,
            spec,
            used_ms: *used_ms,
        }),
        Change::DeleteConfig { job, hash } => Write::DeleteConfig { job, hash },
        Change::PutUpdate(u) => Write::Put(Row::Update(u)),
    }
}

/// The tables a job's delete also clears of the job's rows (its configs aside:
/// several per job, deleted by the job's prefix or column).
pub const UNDER_A_JOB: [Table; 2] = [Table::CronFired, Table::Updates];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_one_name_per_store_and_a_key_column() {
        let all = [
            Table::Jobs,
            Table::Tasks,
            Table::Agents,
            Table::Quotas,
            Table::UserGrants,
            Table::CronFired,
            Table::Updates,
            Table::Configs,
            Table::Meta,
        ];
        let segments: std::collections::HashSet<_> = all.iter().map(|t| t.segment()).collect();
        let tables: std::collections::HashSet<_> = all.iter().map(|t| t.sqlite()).collect();
        assert_eq!(segments.len(), all.len());
        assert_eq!(tables.len(), all.len());
        assert_eq!(Table::Configs.segment(), "configs");
        assert_eq!(Table::Configs.sqlite(), "job_configs");
    }

    #[test]
    fn removals_are_deletes_and_the_rest_puts() {
        let quota = Change::PutQuota("www".into(), None);
        assert!(matches!(
            write_of(&quota),
            Write::Delete(Table::Quotas, "www")
        ));
        let grants = Change::PutUserGrants("www".into(), BTreeSet::new());
        assert!(matches!(
            write_of(&grants),
            Write::Delete(Table::UserGrants, "www")
        ));
        let fired = Change::PutCronFired("r/e/n".into(), 7);
        match write_of(&fired) {
            Write::Put(row) => {
                assert_eq!((row.table(), row.key()), (Table::CronFired, "r/e/n"));
                assert!(row.json().unwrap().is_none());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            write_of(&Change::DeleteJob("r/e/n".into())),
            Write::DeleteJob("r/e/n")
        ));
    }
}
