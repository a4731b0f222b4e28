//! Task configs of a job and what an update would change: the short content hash
//! that names a config, instance ranges written as `0-3,7`, the field-by-field
//! difference of two configs, and the plan of an update (which instances are
//! added, removed, replaced or left alone). Used by the master's update engine and
//! by `drover job diff`, so both always agree on what changes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{JobSpec, UpdateConfig};

/// The short content hash of a job's task config (12 hex digits of FNV-1a 64 over
/// its JSON). The instance count and the `update` settings are not part of a task's
/// config: changing only them replaces no instance.
pub fn config_hash(spec: &JobSpec) -> String {
    let json = serde_json::to_string(&config_value(spec)).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in json.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:012x}", hash & 0xffff_ffff_ffff)
}

/// The spec as JSON without what is not part of the task config.
fn config_value(spec: &JobSpec) -> Value {
    let mut spec = spec.clone();
    spec.instances = 0;
    spec.update = UpdateConfig::default();
    let mut value = serde_json::to_value(&spec).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.remove("instances");
        map.remove("update");
    }
    value
}

/// Sorted instances as ranges: `[0,1,2,3,7]` -> `0-3,7`.
pub fn format_ranges(instances: &[u32]) -> String {
    let mut sorted = instances.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// One field that differs between two configs; `None`: absent on that side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    /// Dotted path, e.g. `task.processes[0].cmdline`.
    pub field: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// The fields of the task config that differ, in path order.
pub fn field_diff(old: &JobSpec, new: &JobSpec) -> Vec<FieldChange> {
    let mut a = BTreeMap::new();
    let mut b = BTreeMap::new();
    flatten("", &config_value(old), &mut a);
    flatten("", &config_value(new), &mut b);
    let mut fields: Vec<&String> = a.keys().chain(b.keys()).collect();
    fields.sort();
    fields.dedup();
    fields
        .into_iter()
        .filter(|f| a.get(*f) != b.get(*f))
        .map(|f| FieldChange {
            field: f.clone(),
            old: a.get(f).cloned(),
            new: b.get(f).cloned(),
        })
        .collect()
}

fn flatten(path: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                flatten(&p, v, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{path}[{i}]"), v, out);
            }
        }
        Value::Null => {}
        other => {
            out.insert(path.to_string(), other.clone());
        }
    }
}

/// What an update does to each instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdatePlan {
    /// New instances (beyond the current count), started on the new config.
    pub add: Vec<u32>,
    /// Instances beyond the new count, killed.
    pub remove: Vec<u32>,
    /// Instances whose config changes: (instance, the config hash it runs now).
    pub replace: Vec<(u32, String)>,
    /// Instances in scope already on the new config.
    pub unchanged: Vec<u32>,
    /// The job's instance count once the update is done.
    pub instances_after: u32,
}

impl UpdatePlan {
    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty() && self.replace.is_empty()
    }

    /// Every instance the update touches, ascending: the order it rolls forward in.
    pub fn touched(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self
            .add
            .iter()
            .chain(self.remove.iter())
            .copied()
            .chain(self.replace.iter().map(|(i, _)| *i))
            .collect();
        all.sort_unstable();
        all
    }
}

/// Plans an update of a job whose instances run the configs `current` (one hash
/// per instance, in order) to a config hashed `new_hash` with `new_count`
/// instances. `only`: just these instances (`--instances`); instances outside it
/// keep their config. Removed instances must be the highest ones and added ones
/// must follow the current ones without gaps, so instances stay numbered 0..N.
pub fn plan_update(
    current: &[String],
    new_hash: &str,
    new_count: u32,
    only: Option<&[u32]>,
) -> Result<UpdatePlan, String> {
    let old_count = current.len() as u32;
    let top = old_count.max(new_count);
    if let Some(list) = only {
        let bad: Vec<u32> = list.iter().copied().filter(|i| *i >= top).collect();
        if !bad.is_empty() {
            return Err(format!(
                "instances {} do not exist before or after the update (it has 0-{}); \
                 pick instances below {top}",
                format_ranges(&bad),
                top.saturating_sub(1)
            ));
        }
    }
    let in_scope = |i: u32| only.is_none_or(|l| l.contains(&i));
    let mut plan = UpdatePlan::default();
    for (i, hash) in current.iter().enumerate() {
        let i = i as u32;
        if !in_scope(i) {
            continue;
        }
        if i >= new_count {
            plan.remove.push(i);
        } else if hash != new_hash {
            plan.replace.push((i, hash.clone()));
        } else {
            plan.unchanged.push(i);
        }
    }
    plan.add = (old_count..new_count).filter(|i| in_scope(*i)).collect();
    if let Some(&lowest) = plan.remove.first() {
        if plan.remove.len() as u32 != old_count - lowest {
            return Err(format!(
                "instances {} would be removed while higher ones stay; \
                 remove from the top (include {}-{} in --instances)",
                format_ranges(&plan.remove),
                lowest,
                old_count - 1
            ));
        }
    }
    if let Some(&highest) = plan.add.last() {
        if plan.add.len() as u32 != highest + 1 - old_count {
            return Err(format!(
                "instances {} would be added with a gap below them; \
                 add from {old_count} on (include {old_count}-{highest} in --instances)",
                format_ranges(&plan.add)
            ));
        }
    }
    plan.instances_after = match (plan.remove.first(), plan.add.last()) {
        (Some(&lowest), _) => lowest,
        (None, Some(&highest)) => highest + 1,
        (None, None) => old_count,
    };
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ranges_are_compact() {
        assert_eq!(format_ranges(&[7, 0, 1, 2, 3]), "0-3,7");
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(format_ranges(&[4]), "4");
    }

    #[test]
    fn a_plan_replaces_changed_instances_and_leaves_the_rest() {
        let p = plan_update(&hashes(&["a", "b", "a"]), "b", 3, None).unwrap();
        assert_eq!(p.replace, vec![(0, "a".into()), (2, "a".into())]);
        assert_eq!(p.unchanged, vec![1]);
        assert_eq!(p.instances_after, 3);
        assert_eq!(p.touched(), vec![0, 2]);
    }

    #[test]
    fn counts_grow_and_shrink_from_the_top() {
        let p = plan_update(&hashes(&["a"; 3]), "a", 5, None).unwrap();
        assert_eq!((p.add.clone(), p.instances_after), (vec![3, 4], 5));
        let p = plan_update(&hashes(&["a"; 5]), "b", 2, None).unwrap();
        assert_eq!(p.remove, vec![2, 3, 4]);
        assert_eq!(p.replace.len(), 2);
        assert_eq!(p.instances_after, 2);
        assert!(plan_update(&hashes(&["a"; 5]), "a", 2, Some(&[2, 3])).is_err());
        assert!(plan_update(&hashes(&["a"; 3]), "a", 6, Some(&[5])).is_err());
        assert!(plan_update(&hashes(&["a"; 3]), "a", 3, Some(&[3])).is_err());
    }

    #[test]
    fn a_canary_touches_only_its_instance() {
        let p = plan_update(&hashes(&["a"; 4]), "b", 4, Some(&[0])).unwrap();
        assert_eq!(p.touched(), vec![0]);
        assert!(p.unchanged.is_empty());
    }
}
