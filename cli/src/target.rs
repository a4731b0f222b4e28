//! Reading the job and instance arguments: `role/env/name`, `role/env/name/0-3,7`
//! and `role/env/name/INSTANCE`.

use drover_common::spec::JobKey;
use drover_common::wire::parse_instance_set;

/// A job, and optionally a set of its instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobTarget {
    pub key: JobKey,
    /// The instance set as written (`0-3,7`), checked; None: every instance.
    pub instances: Option<String>,
}

/// Why an argument is not a job target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("`{0}` is not a job: write role/environment/name, e.g. www-data/devel/hello")]
    BadKey(String),
    #[error("`{text}`: {message}")]
    BadInstances { text: String, message: String },
    #[error("`{0}` does not name one instance: write role/environment/name/INSTANCE, e.g. www-data/devel/hello/0")]
    BadInstance(String),
}

/// Parses `role/env/name` or `role/env/name/INSTANCES`.
pub fn parse_job_target(text: &str) -> Result<JobTarget, TargetError> {
    let (key_text, instances) = split_key(text);
    let key = JobKey::parse(key_text).map_err(|_| TargetError::BadKey(text.to_string()))?;
    if let Some(set) = instances {
        parse_instance_set(set).map_err(|message| TargetError::BadInstances {
            text: text.to_string(),
            message,
        })?;
    }
    Ok(JobTarget {
        key,
        instances: instances.map(str::to_string),
    })
}

/// Parses `role/env/name/INSTANCE` (exactly one instance).
pub fn parse_instance_target(text: &str) -> Result<(JobKey, u32), TargetError> {
    let (key_text, instance) = split_key(text);
    let key = JobKey::parse(key_text).map_err(|_| TargetError::BadKey(text.to_string()))?;
    let instance = instance
        .and_then(|i| i.trim().parse::<u32>().ok())
        .ok_or_else(|| TargetError::BadInstance(text.to_string()))?;
    Ok((key, instance))
}

/// Splits off a fourth `/`-separated part, if any.
fn split_key(text: &str) -> (&str, Option<&str>) {
    let slashes: Vec<usize> = text.match_indices('/').map(|(i, _)| i).collect();
    match slashes.get(2) {
        Some(&third) => (&text[..third], Some(&text[third + 1..])),
        None => (text, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_targets_take_an_optional_instance_set() {
        let all = parse_job_target("www-data/devel/hello").unwrap();
        assert_eq!(all.key.to_string(), "www-data/devel/hello");
        assert_eq!(all.instances, None);
        let some = parse_job_target("www-data/devel/hello/0-3,7").unwrap();
        assert_eq!(some.instances.as_deref(), Some("0-3,7"));
    }

    #[test]
    fn bad_job_targets_say_how_to_write_them() {
        let err = parse_job_target("hello").unwrap_err().to_string();
        assert!(err.contains("role/environment/name"), "{err}");
        let err = parse_job_target("a/b/c/3-1").unwrap_err().to_string();
        assert!(err.contains("0-3,7"), "{err}");
        assert!(parse_job_target("a/b/c/").is_err());
    }

    #[test]
    fn instance_targets_need_exactly_one_instance() {
        let (key, instance) = parse_instance_target("www-data/devel/hello/2").unwrap();
        assert_eq!((key.name.as_str(), instance), ("hello", 2));
        assert!(parse_instance_target("www-data/devel/hello").is_err());
        assert!(parse_instance_target("www-data/devel/hello/0-3").is_err());
    }
}
