//! Where task cgroups go: at the cgroup root (`<root>/<cgroup_parent>/<task>`), or
//! inside the agent's own, delegated cgroup (`<own>/<cgroup_parent>/<task>`), as a
//! systemd unit with `Delegate=yes` must do. The decision is pure ([`plan`], from
//! the agent's `/proc/self/cgroup` text, the layout and the `cgroup_delegate`
//! setting); [`place`] reads those and carries it out: on cgroup v2 the agent moves
//! itself (and whatever else is in its cgroup) into the leaf `<own>/agent` and
//! enables cpu, memory and pids in `<own>/cgroup.subtree_control` (the kernel's
//! no-internal-process rule: a cgroup that hands controllers to children holds no
//! process), unless systemd already started it in that leaf (`DelegateSubgroup=agent`,
//! systemd 254 and later). v1 has no such rule: each controller's own path is used
//! as it is.
//!
//! The place is derived the same way at every start (the unit's cgroup does not
//! change across restarts), so re-adopted executors and the cleanup of a dead one
//! find the task cgroups where they were made; tasks an agent started with the
//! root layout are cleaned up there too ([`Placement::others`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The `cgroup_delegate` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delegate {
    /// Inside the agent's cgroup when systemd started the agent (`INVOCATION_ID`)
    /// and that cgroup is usable without breaking a restart; else at the root.
    #[default]
    Auto,
    /// Always inside the agent's cgroup; an agent whose cgroup cannot hold them
    /// does not start.
    On,
    /// Always at the cgroup root (`<root>/<cgroup_parent>`).
    Off,
}

impl std::str::FromStr for Delegate {
    type Err = String;
    fn from_str(s: &str) -> Result<Delegate, String> {
        match s {
            "auto" => Ok(Delegate::Auto),
            "on" | "true" | "yes" => Ok(Delegate::On),
            "off" | "false" | "no" => Ok(Delegate::Off),
            other => Err(format!("`{other}` is not one of auto, on, off")),
        }
    }
}

/// Which cgroup layout the host has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One hierarchy per controller.
    V1,
    /// The unified tree.
    V2,
}

/// The v1 controllers task cgroups use (the executor's `V1_CONTROLLERS`).
const V1_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// The leaf the agent lives in on v2 (and the `DelegateSubgroup=` of the unit).
pub const AGENT_LEAF: &str = "agent";

/// Where the cgroup filesystem is mounted (the executor's `--cgroup-root` default).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The executor's default `--cgroup-parent`.
pub const DEFAULT_PARENT: &str = "drover";

/// The layout at `root`, by the executor's rule (`FsCgroup::detect`): a
/// `cgroup.controllers` file means v2; `memory/memory.limit_in_bytes` and a `pids`
/// directory mean v1; anything else: no usable cgroups.
pub fn detect(root: &Path) -> Option<Version> {
    if root.join("cgroup.controllers").is_file() {
        Some(Version::V2)
    } else if root.join("memory/memory.limit_in_bytes").is_file() && root.join("pids").is_dir() {
        Some(Version::V1)
    } else {
        None
    }
}

/// Why task cgroups cannot go where `cgroup_delegate = "on"` asks.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("/proc/self/cgroup has no line for the {0} controller")]
    NoLine(&'static str),
    #[error("the agent's cgroups differ per controller (cpu {cpu}, memory {memory}, pids {pids}): start it in one cgroup in every controller (systemd: Delegate=yes) or set cgroup_delegate = \"off\"")]
    Differ {
        cpu: String,
        memory: String,
        pids: String,
    },
    #[error("the agent runs in the root cgroup: nothing is delegated to it; start it in a cgroup of its own (systemd: Delegate=yes) or set cgroup_delegate = \"off\"")]
    AtRoot,
}

/// The agent's own cgroup (`/`-rooted path) in the layout `version`, from the text
/// of `/proc/self/cgroup` (`id:controllers:path` lines): v2 the `0::PATH` line; v1
/// the line of each of cpu, memory and pids (`4:cpu,cpuacct:/x`), which must agree.
pub fn own_cgroup(proc_self_cgroup: &str, version: Version) -> Result<String, PlanError> {
    let lines = proc_self_cgroup.lines().filter_map(|l| {
        let mut parts = l.splitn(3, ':');
        Some((parts.next()?, parts.next()?, parts.next()?))
    });
    match version {
        Version::V2 => lines
            .filter(|(id, controllers, _)| *id == "0" && controllers.is_empty())
            .map(|(_, _, path)| path.to_string())
            .next()
            .ok_or(PlanError::NoLine("unified (0::)")),
        Version::V1 => {
            let lines: Vec<_> = lines.collect();
            let path_of = |want: &'static str| {
                lines
                    .iter()
                    .find(|(_, controllers, _)| controllers.split(',').any(|c| c == want))
                    .map(|(_, _, path)| path.to_string())
                    .ok_or(PlanError::NoLine(want))
            };
            let [cpu, memory, pids] = V1_CONTROLLERS.map(path_of);
            let (cpu, memory, pids) = (cpu?, memory?, pids?);
            if cpu == memory && memory == pids {
                Ok(cpu)
            } else {
                Err(PlanError::Differ { cpu, memory, pids })
            }
        }
    }
}

/// Where task cgroups go and what the agent does first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The executor's `--cgroup-parent` (relative to the cgroup root); None: the
    /// executor's default (`drover`).
    pub parent: Option<String>,
    /// v2: the delegated cgroup (relative) whose processes move into its
    /// [`AGENT_LEAF`] and whose `cgroup.subtree_control` gets cpu, memory, pids.
    pub prepare_v2: Option<String>,
    /// Other parents task cgroups of this host may be under (the root layout, for
    /// tasks started before the agent delegated): cleaned up there too.
    pub others: Vec<String>,
    /// What was decided and why, for the log.
    pub why: String,
}

/// The facts [`plan`] decides from.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The `cgroup_delegate` setting.
    pub delegate: Delegate,
    /// The `cgroup_parent` setting.
    pub parent: Option<&'a str>,
    /// The host's layout; None: no usable cgroups (nothing to place).
    pub version: Option<Version>,
    /// The text of `/proc/self/cgroup`.
    pub proc_self_cgroup: &'a str,
    /// Whether systemd started the agent (`INVOCATION_ID` is set).
    pub under_systemd: bool,
}

/// Decides where task cgroups go (pure; see the module doc).
pub fn plan(facts: &Facts) -> Result<Placement, PlanError> {
    let name = facts.parent.unwrap_or(DEFAULT_PARENT);
    let root_layout = |why: String| Placement {
        parent: facts.parent.map(str::to_string),
        prepare_v2: None,
        others: Vec::new(),
        why,
    };
    let Some(version) = facts.version else {
        return Ok(root_layout("no usable cgroup filesystem".into()));
    };
    let strict = match facts.delegate {
        Delegate::Off => return Ok(root_layout("cgroup_delegate = \"off\"".into())),
        Delegate::Auto if !facts.under_systemd => {
            return Ok(root_layout(
                "not started by systemd (cgroup_delegate = \"auto\")".into(),
            ))
        }
        Delegate::Auto => false,
        Delegate::On => true,
    };
    let own = match own_cgroup(facts.proc_self_cgroup, version) {
        Ok(own) => own,
        Err(e) if !strict => return Ok(root_layout(format!("not delegated: {e}"))),
        Err(e) => return Err(e),
    };
    let own = own.trim_matches('/').to_string();
    let (base, prepare) = match version {
        Version::V1 => (own, false),
        Version::V2 => match own.rsplit_once('/') {
            // Started in the leaf (DelegateSubgroup=agent, or by a supervisor that
            // placed it there): the delegated cgroup is the leaf's parent.
            Some((base, AGENT_LEAF)) => (base.to_string(), true),
            _ if own == AGENT_LEAF => (String::new(), true),
            // In the unit's cgroup itself: moving out of it would make systemd
            // before 254 fail the next start (219/CGROUP: it attaches the new main
            // process to the unit's cgroup, which then hands controllers to
            // children), so only when asked.
            _ if !strict => {
                return Ok(root_layout(format!(
                    "the agent's cgroup /{own} is not its `{AGENT_LEAF}` leaf: add DelegateSubgroup={AGENT_LEAF} to the unit (systemd 254 or later) to place tasks inside it"
                )))
            }
            _ => (own, true),
        },
    };
    if base.is_empty() {
        if strict {
            return Err(PlanError::AtRoot);
        }
        return Ok(root_layout("the agent runs in the root cgroup".into()));
    }
    let parent = format!("{base}/{name}");
    Ok(Placement {
        why: format!("inside the agent's delegated cgroup /{base}"),
        others: if parent == name {
            Vec::new()
        } else {
            vec![name.to_string()]
        },
        prepare_v2: prepare.then_some(base),
        parent: Some(parent),
    })
}

/// A cgroup file the agent could not read or write.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct SetupError {
    what: &'static str,
    path: PathBuf,
    source: io::Error,
}

/// v2: moves every process of `<root>/<base>` (this agent among them) into
/// `<root>/<base>/agent`, then enables those of cpu, memory and pids that
/// `<base>/cgroup.controllers` offers in `<base>/cgroup.subtree_control`. Returns
/// the controllers enabled. Idempotent: a restarted agent already in the leaf finds
/// nothing to move and the controllers enabled.
pub fn prepare_v2(root: &Path, base: &str) -> Result<Vec<String>, SetupError> {
    let dir = root.join(base.trim_matches('/'));
    let leaf = dir.join(AGENT_LEAF);
    let err = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| SetupError { what, path, source }
    };
    match fs::create_dir(&leaf) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(err("cannot create the agent's leaf cgroup", &leaf)(e))
        }
        _ => {}
    }
    let procs = dir.join("cgroup.procs");
    let leaf_procs = leaf.join("cgroup.procs");
    // Processes may fork while they move: a few rounds until none is left.
    for _ in 0..10 {
        let pids = fs::read_to_string(&procs).map_err(err("cannot read", &procs))?;
        let pids: Vec<&str> = pids.split_whitespace().collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            match fs::write(&leaf_procs, pid) {
                // Exited meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                r => r.map_err(err("cannot move a process into", &leaf_procs))?,
            }
        }
    }
    let offered = fs::read_to_string(dir.join("cgroup.controllers"))
        .map_err(err("cannot read", &dir.join("cgroup.controllers")))?;
    let enabled: Vec<String> = offered
        .split_whitespace()
        .filter(|c| V1_CONTROLLERS.contains(c))
        .map(str::to_string)
        .collect();
    if !enabled.is_empty() {
        let control = dir.join("cgroup.subtree_control");
        let value: Vec<String> = enabled.iter().map(|c| format!("+{c}")).collect();
        fs::write(&control, value.join(" "))
            .map_err(err("cannot enable controllers in", &control))?;
    }
    Ok(enabled)
}

/// Reads the facts, decides ([`plan`]) and, on v2, prepares the delegated cgroup.
pub fn place(
    delegate: Delegate,
    parent: Option<&str>,
    no_isolation: bool,
    root: &Path,
) -> Result<Placement, PlaceError> {
    if no_isolation {
        return Ok(Placement {
            parent: parent.map(str::to_string),
            why: "no_isolation: executors make no cgroups".into(),
            ..Placement::default()
        });
    }
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let placement = plan(&Facts {
        delegate,
        parent,
        version: detect(root),
        proc_self_cgroup: &own,
        under_systemd: std::env::var_os("INVOCATION_ID").is_some(),
    })?;
    if let Some(base) = &placement.prepare_v2 {
        let enabled = prepare_v2(root, base)?;
        tracing::info!(cgroup = %base, leaf = AGENT_LEAF, controllers = ?enabled, "moved into the leaf of the delegated cgroup and enabled controllers for task cgroups");
    }
    Ok(placement)
}

/// Why task cgroups could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// `cgroup_delegate = "on"` on a host where it cannot work.
    #[error("invalid `cgroup_delegate`: {0}")]
    Plan(#[from] PlanError),
    /// The delegated cgroup could not be prepared.
    #[error("preparing the delegated cgroup: {0}")]
    Setup(#[from] SetupError),
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_SYSTEMD: &str = "12:pids:/system.slice/drover-agent.service
11:memory:/system.slice/drover-agent.service
4:cpu,cpuacct:/system.slice/drover-agent.service
1:name=systemd:/system.slice/drover-agent.service
0::/system.slice/drover-agent.service
";
    const V2_UNIT: &str = "0::/system.slice/drover-agent.service\n";
    const V2_LEAF: &str = "0::/system.slice/drover-agent.service/agent\n";

    fn facts(delegate: Delegate, version: Version, text: &str, systemd: bool) -> Facts<'_> {
        Facts {
            delegate,
            parent: None,
            version: Some(version),
            proc_self_cgroup: text,
            under_systemd: systemd,
        }
    }

    #[test]
    fn own_cgroup_is_read_from_either_layout() {
        assert_eq!(
            own_cgroup(V1_SYSTEMD, Version::V1).unwrap(),
            "/system.slice/drover-agent.service"
        );
        assert_eq!(
            own_cgroup(V1_SYSTEMD, Version::V2).unwrap(),
            "/system.slice/drover-agent.service"
        );
        assert_eq!(own_cgroup("0::/\n", Version::V2).unwrap(), "/");
        // cpu found in a joint `cpu,cpuacct` line, not in `cpuacct` alone.
        let text = "3:cpuacct:/a\n2:cpu,cpuacct:/b\n1:memory:/b\n0:pids:/b\n";
        assert_eq!(own_cgroup(text, Version::V1).unwrap(), "/b");
        assert_eq!(
            own_cgroup("1:memory:/x\n", Version::V1),
            Err(PlanError::NoLine("cpu"))
        );
        assert_eq!(
            own_cgroup("4:memory:/x\n", Version::V2),
            Err(PlanError::NoLine("unified (0::)"))
        );
        // A path may hold `:`.
        assert_eq!(own_cgroup("0::/a:b\n", Version::V2).unwrap(), "/a:b");
    }

    #[test]
    fn v1_paths_that_differ_per_controller_are_named() {
        // This machine's shell: only memory is in a cgroup of its own.
        let text = "8:pids:/\n4:memory:/process_api/42\n1:cpu:/\n0::/\n";
        let err = own_cgroup(text, Version::V1).unwrap_err();
        assert!(err.to_string().contains("memory /process_api/42"), "{err}");
        // auto falls back to the root layout; on refuses.
        let p = plan(&facts(Delegate::Auto, Version::V1, text, true)).unwrap();
        assert_eq!(p.parent, None);
        assert!(p.why.contains("differ"), "{}", p.why);
        assert!(plan(&facts(Delegate::On, Version::V1, text, false)).is_err());
    }

    #[test]
    fn v1_under_systemd_puts_tasks_in_the_units_cgroup() {
        let p = plan(&facts(Delegate::Auto, Version::V1, V1_SYSTEMD, true)).unwrap();
        assert_eq!(
            p.parent.as_deref(),
            Some("system.slice/drover-agent.service/drover")
        );
        assert_eq!(p.prepare_v2, None, "v1: no move");
        assert_eq!(p.others, vec!["drover".to_string()]);
    }

    #[test]
    fn auto_outside_systemd_and_off_keep_the_root_layout() {
        for f in [
            facts(Delegate::Auto, Version::V1, V1_SYSTEMD, false),
            facts(Delegate::Off, Version::V2, V2_LEAF, true),
        ] {
            let p = plan(&f).unwrap();
            assert_eq!((p.parent, p.prepare_v2), (None, None));
        }
        let mut f = facts(Delegate::Off, Version::V1, V1_SYSTEMD, true);
        f.parent = Some("tasks");
        assert_eq!(plan(&f).unwrap().parent.as_deref(), Some("tasks"));
        f.version = None;
        f.delegate = Delegate::On;
        assert_eq!(plan(&f).unwrap().parent.as_deref(), Some("tasks"));
    }

    #[test]
    fn v2_in_the_leaf_uses_its_parent_and_the_same_path_after_a_restart() {
        let p = plan(&facts(Delegate::Auto, Version::V2, V2_LEAF, true)).unwrap();
        assert_eq!(
            p.parent.as_deref(),
            Some("system.slice/drover-agent.service/drover")
        );
        assert_eq!(
            p.prepare_v2.as_deref(),
            Some("system.slice/drover-agent.service")
        );
        // `on`, started in the unit's cgroup, moves into the leaf: the same parent.
        let on = plan(&facts(Delegate::On, Version::V2, V2_UNIT, false)).unwrap();
        assert_eq!(on.parent, p.parent);
        assert_eq!(on.prepare_v2, p.prepare_v2);
    }

    #[test]
    fn v2_auto_in_the_units_cgroup_itself_keeps_the_root_layout_and_says_why() {
        let p = plan(&facts(Delegate::Auto, Version::V2, V2_UNIT, true)).unwrap();
        assert_eq!((p.parent, p.prepare_v2), (None, None));
        assert!(p.why.contains("DelegateSubgroup=agent"), "{}", p.why);
    }

    #[test]
    fn the_root_cgroup_is_not_a_delegation() {
        assert_eq!(
            plan(&facts(Delegate::On, Version::V2, "0::/\n", false)),
            Err(PlanError::AtRoot)
        );
        assert_eq!(
            plan(&facts(Delegate::On, Version::V2, "0::/agent\n", false)),
            Err(PlanError::AtRoot)
        );
        let p = plan(&facts(
            Delegate::Auto,
            Version::V1,
            "1:cpu,memory,pids:/\n",
            true,
        ))
        .unwrap();
        assert_eq!(p.parent, None);
    }

    #[test]
    fn settings_parse() {
        assert_eq!("auto".parse(), Ok(Delegate::Auto));
        assert_eq!("on".parse(), Ok(Delegate::On));
        assert_eq!("off".parse(), Ok(Delegate::Off));
        assert!("maybe".parse::<Delegate>().is_err());
    }
}
