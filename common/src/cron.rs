//! Cron schedules, pure: reading a job's `cron_schedule` in its `cron_timezone`
//! ([`parse`], [`job_schedule`]), its firings ([`Schedule`]) and the firing missed
//! while the master was down ([`catch_up`]). The one validator of a cron job: the
//! CLI's `job validate` and the master's create and update both run it, so a spec
//! the CLI accepts is one the master accepts.
//!
//! - The schedule is the standard 5 fields (minute hour day-of-month month
//!   day-of-week, vixie-cron semantics, `@daily` and friends too), read in
//!   `cron_timezone` (IANA, default UTC). With the master's `cron_seconds` test
//!   switch a 6th leading seconds field is accepted as well.

use chrono::TimeZone;
use croner::parser::{CronParser, Seconds, Year};

use crate::spec::JobSpec;
use crate::state::UnixMillis;

/// A bad `cron_schedule` or `cron_timezone`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct CronSpecError {
    /// The spec field at fault.
    pub field: &'static str,
    pub message: String,
}

/// A parsed schedule in its time zone.
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
    text: String,
}

const FIELDS: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

fn parser(seconds: bool) -> CronParser {
    CronParser::builder()
        .seconds(if seconds {
            Seconds::Required
        } else {
            Seconds::Disallowed
        })
        .year(Year::Disallowed)
        .build()
}

/// Parses `expr` in time zone `tz` (None: UTC). `allow_seconds` accepts a leading
/// seconds field (6 fields; the test switch). The error names the cron field.
pub fn parse(expr: &str, tz: Option<&str>, allow_seconds: bool) -> Result<Schedule, CronSpecError> {
    let bad = |message: String| CronSpecError {
        field: "cron_schedule",
        message,
    };
    let tz = match tz {
        None => chrono_tz::UTC,
        Some(name) => name.parse::<chrono_tz::Tz>().map_err(|_| CronSpecError {
            field: "cron_timezone",
            message: format!(
                "`{name}` is not an IANA time zone; write one like UTC or Europe/Paris"
            ),
        })?,
    };
    let text = expr.trim();
    let parts: Vec<&str> = text.split_whitespace().collect();
    let nickname = text.starts_with('@');
    let seconds = allow_seconds && parts.len() == 6;
    if !nickname && parts.len() != 5 && !seconds {
        let want = if allow_seconds {
            "5 (or 6 with seconds)"
        } else {
            "5"
        };
        return Err(bad(format!(
            "`{text}` has {} fields; a schedule has {want}: minute hour day-of-month month day-of-week, e.g. `*/15 * * * *`",
            parts.len()
        )));
    }
    if !nickname {
        // Each field alone, the others `*`, so that the error names the field.
        let names: Vec<&str> = if seconds {
            std::iter::once("second").chain(FIELDS).collect()
        } else {
            FIELDS.to_vec()
        };
        for (i, part) in parts.iter().enumerate() {
            let probe: Vec<&str> = (0..parts.len())
                .map(|j| if j == i { *part } else { "*" })
                .collect();
            if let Err(e) = parser(seconds).parse(&probe.join(" ")) {
                return Err(bad(format!(
                    "the {} field `{part}` is not valid: {e}",
                    names[i]
                )));
            }
        }
    }
    let cron = parser(seconds)
        .parse(text)
        .map_err(|e| bad(format!("`{text}` is not a valid schedule: {e}")))?;
    Ok(Schedule {
        cron,
        tz,
        text: text.to_string(),
    })
}

impl Schedule {
    /// The schedule as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The time zone's name.
    pub fn timezone(&self) -> &str {
        self.tz.name()
    }

    fn at(&self, ms: UnixMillis) -> Option<chrono::DateTime<chrono_tz::Tz>> {
        self.tz.timestamp_millis_opt(ms as i64).single()
    }

    /// The first firing strictly after `ms`.
    pub fn next_after(&self, ms: UnixMillis) -> Option<UnixMillis> {
        let t = self.cron.find_next_occurrence(&self.at(ms)?, false).ok()?;
        u64::try_from(t.timestamp_millis()).ok()
    }

    /// The last firing at or before `ms`.
    pub fn last_at_or_before(&self, ms: UnixMillis) -> Option<UnixMillis> {
        let t = self
            .cron
            .find_previous_occurrence(&self.at(ms)?, true)
            .ok()?;
        u64::try_from(t.timestamp_millis()).ok()
    }
}

/// At start: the firing missed while the master was down that runs now, if any:
/// the latest one at or before `now`, later than `since` (the last firing handled,
/// else the job's creation) and at most `grace_ms` old.
pub fn catch_up(
    schedule: &Schedule,
    since: UnixMillis,
    now: UnixMillis,
    grace_ms: u64,
) -> Option<UnixMillis> {
    let missed = schedule.last_at_or_before(now)?;
    (missed > since && now.saturating_sub(missed) <= grace_ms).then_some(missed)
}

/// The schedule of `spec`, checked with everything a cron job must satisfy: a
/// valid schedule in a valid time zone, no time zone without a schedule, and no
/// service. None: not a cron job. `allow_seconds`: the master's test switch.
pub fn job_schedule(
    spec: &JobSpec,
    allow_seconds: bool,
) -> Result<Option<Schedule>, CronSpecError> {
    let Some(expr) = &spec.cron_schedule else {
        if spec.cron_timezone.is_some() {
            return Err(CronSpecError {
                field: "cron_timezone",
                message: "is set but cron_schedule is not; add a schedule or remove it".to_string(),
            });
        }
        return Ok(None);
    };
    if spec.service {
        return Err(CronSpecError {
            field: "cron_schedule",
            message: "a service runs forever and cannot be a cron job; set service: false"
                .to_string(),
        });
    }
    parse(expr, spec.cron_timezone.as_deref(), allow_seconds).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{parse_job, parse_job_json_with};

    fn batch(extra: &str) -> String {
        format!(
            "role: www-data\nenvironment: devel\nname: nightly\nservice: false\n{extra}\
             task:\n  processes: [{{name: run, cmdline: 'true'}}]\n  \
             resources: {{cpu: 0.1, ram: 16MiB, disk: 16MiB}}\n"
        )
    }

    #[test]
    fn validating_a_spec_runs_the_masters_cron_checks() {
        let e = parse_job("j.yaml", &batch("cron_schedule: \"61 * * * *\"\n")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("cron_schedule: the minute field `61`"),
            "{text}"
        );
        let e = parse_job(
            "j.yaml",
            &batch("cron_schedule: \"0 9 * * *\"\ncron_timezone: Mars/Olympus\n"),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("cron_timezone: `Mars/Olympus`"),
            "{e}"
        );
        let e = parse_job("j.yaml", &batch("cron_timezone: UTC\n")).unwrap_err();
        assert!(e.to_string().contains("cron_schedule is not"), "{e}");
        let service =
            batch("cron_schedule: \"@daily\"\n").replace("service: false", "service: true");
        let e = parse_job("j.yaml", &service).unwrap_err();
        assert!(e.to_string().contains("cannot be a cron job"), "{e}");
        assert!(parse_job("j.yaml", &batch("cron_schedule: \"*/15 * * * *\"\n")).is_ok());
    }

    #[test]
    fn a_seconds_field_needs_the_masters_test_switch() {
        let spec =
            crate::parse::parse_job("j.yaml", &batch("cron_schedule: \"*/15 * * * *\"\n")).unwrap();
        let mut json = serde_json::to_value(&spec).unwrap();
        json["cron_schedule"] = serde_json::json!("*/3 * * * * *");
        let text = json.to_string();
        assert!(parse_job_json_with(&text, false).is_err());
        assert!(parse_job_json_with(&text, true).is_ok());
    }

    #[test]
    fn missed_firings_run_once_within_the_grace() {
        let s = parse("0 * * * *", None, false).unwrap();
        let hour = 3_600_000;
        assert_eq!(catch_up(&s, 0, 5 * hour + 60_000, 120_000), Some(5 * hour));
        assert_eq!(catch_up(&s, 0, 5 * hour + 600_000, 120_000), None);
        assert_eq!(catch_up(&s, 5 * hour, 5 * hour + 60_000, 120_000), None);
    }
}
