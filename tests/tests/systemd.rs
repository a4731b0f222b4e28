//! Drover under a real systemd: the Debian packages (scripts/package.sh, from the
//! binaries this test run uses, target/debug unless DROVER_BIN_DIR says otherwise)
//! installed with dpkg in a minimal Debian 12 root booted by `systemd-nspawn --boot`
//! (made once by scripts/systemd-root.sh and cached). The packaged units start
//! (Type=notify: READY and STATUS seen by systemctl), a job runs, the agent is
//! restarted, upgraded and killed by its watchdog with the task pids unchanged, a
//! stopped master is restarted by its watchdog, and removal and purge leave what
//! they should. Also here: the agent binary's READY and watchdog against a socket
//! the test binds, and lintian on the packages.
//!
//! Not exercised inside the container: cgroup limits and the task cgroups inside
//! the agent's delegated cgroup. On a host with cgroup v1 (CI) nspawn mounts the
//! controllers read-only (only its name=systemd hierarchy is the container's), so
//! the container's systemd cannot give the agent's unit a cgroup in cpu, memory
//! or pids, and the agent runs executors with `no_isolation = true` there; the
//! test says so when it does and checks the agent said why it placed no cgroups.
//! Where the controllers are writable, it checks the task's cgroup is where the
//! agent said it would put it. tests/tests/cgroup_delegation.rs covers the layout
//! outside the container.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use drover_common::wire::{AgentVersions, AgentView};
use drover_tests::{bin, bin_dir, running_as_root, workspace_root};

/// True when `tool` is on PATH; else prints why `test` is skipped.
fn have(tool: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("SKIP {test}: {tool} is not installed; scripts/setup.sh installs it");
    }
    found
}

/// Builds the three packages from the test's binaries into `out` with `suffix`.
fn package(out: &Path, suffix: &str) -> anyhow::Result<Vec<PathBuf>> {
    let output = Command::new(workspace_root().join("scripts/package.sh"))
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(out)
        .args(["--fast", "--version-suffix", suffix])
        .output()
        .context("running scripts/package.sh")?;
    if !output.status.success() {
        bail!(
            "scripts/package.sh failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(PathBuf::from)
        .collect())
}

/// A booted Debian root: systemd as PID 1 of its own namespaces, a private network
/// (only `lo`, so ports never clash with the host's). Powered off when dropped.
struct Container {
    nspawn: Child,
    leader: u32,
    _dir: tempfile::TempDir,
}

impl Container {
    fn boot() -> anyhow::Result<Container> {
        let made = Command::new(workspace_root().join("scripts/systemd-root.sh"))
            .stderr(Stdio::inherit())
            .output()
            .context("running scripts/systemd-root.sh")?;
        if !made.status.success() {
            bail!("scripts/systemd-root.sh failed");
        }
        let cached = PathBuf::from(String::from_utf8_lossy(&made.stdout).trim());
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root");
        let copied = Command::new("cp")
            .args(["-a", "--reflink=auto"])
            .arg(&cached)
            .arg(&root)
            .status()?;
        if !copied.success() {
            bail!("cannot copy {}", cached.display());
        }
        let nspawn = Command::new("systemd-nspawn")
            .args([
                "--boot",
                "--register=no",
                "--keep-unit",
                "--private-network",
                "--console=passive",
            ])
            .arg(format!("--machine=drover-test-{}", std::process::id()))
            .arg("-D")
            .arg(&root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting systemd-nspawn")?;
        let mut c = Container {
            leader: 0,
            nspawn,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.leader == 0 {
            if Instant::now() > deadline {
                bail!("systemd-nspawn started no init within 60s");
            }
            std::thread::sleep(Duration::from_millis(100));
            let children = std::fs::read_to_string(format!(
                "/proc/{}/task/{}/children",
                c.nspawn.id(),
                c.nspawn.id()
            ))
            .unwrap_or_default();
            // The container's init: a child of nspawn named systemd (nspawn's
            // short-lived helpers are not) whose namespaces can be entered.
            c.leader = children
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .find(|p: &u32| {
                    std::fs::read_to_string(format!("/proc/{p}/comm"))
                        .is_ok_and(|comm| comm.trim() == "systemd")
                })
                .unwrap_or(0);
            if c.leader != 0 && c.sh("true").is_err() {
                c.leader = 0;
            }
        }
        // "running", or "degraded" when some unit of the minimal root failed;
        // "offline" until its systemd answers at all.
        loop {
            let state = c.sh("timeout 90 systemctl is-system-running --wait || true")?;
            if matches!(state.trim(), "running" | "degraded") {
                return Ok(c);
            }
            if Instant::now() > deadline + Duration::from_secs(60) {
                bail!("the container did not boot: {state}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `script` with sh inside the container; its stdout, or an error with
    /// both outputs when it fails.
    fn sh(&self, script: &str) -> anyhow::Result<String> {
        let out = self.run(script)?;
        if !out.status.success() {
            bail!(
                "`{script}` failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn run(&self, script: &str) -> anyhow::Result<Output> {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "--"])
            .args([
                "env",
                "-i",
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/root",
            ])
            .args([
                "DROVER_TOKEN_FILE=/var/lib/drover-master/admin.token",
                "sh",
                "-c",
                script,
            ])
            .stdin(Stdio::null())
            .output()
            .context("nsenter")
    }

    /// `systemctl show -p PROP --value UNIT`.
    fn prop(&self, unit: &str, prop: &str) -> String {
        self.sh(&format!("systemctl show -p {prop} --value {unit}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Copies `file` into the container's /debs.
    fn put(&self, file: &Path) -> anyhow::Result<String> {
        let name = file.file_name().context("no file name")?.to_string_lossy();
        let root = format!("/proc/{}/root/debs", self.leader);
        std::fs::create_dir_all(&root)?;
        std::fs::copy(file, format!("{root}/{name}"))?;
        Ok(format!("/debs/{name}"))
    }

    /// Waits until `check` holds, up to `within`; fails with `what` and the unit's
    /// journal.
    fn wait(&self, what: &str, within: Duration, check: impl Fn(&Container) -> bool) {
        let deadline = Instant::now() + within;
        while !check(self) {
            if Instant::now() > deadline {
                let journal = self
                    .sh("journalctl --no-pager -n 40 -u drover-master -u drover-agent")
                    .unwrap_or_default();
                panic!("{what} not within {within:?}; journal:\n{journal}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Pids of the task processes (`sleep 100000`), sorted.
    fn task_pids(&self) -> Vec<u32> {
        let out = self.sh("pgrep -x sleep || true").unwrap_or_default();
        let mut pids: Vec<u32> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        pids.sort_unstable();
        pids
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // SIGTERM: nspawn asks the container's systemd to power off.
        let pid = nix::unistd::Pid::from_raw(self.nspawn.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.nspawn.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}

const SLEEPER: &str = "role: www-data
environment: prod
name: sleeper
instances: 1
service: true
task:
  processes:
    - name: sleep
      cmdline: exec sleep 100000
  resources:
    cpu: 0.1
    ram: 32MiB
    disk: 64MiB
";

/// Sets `WatchdogSec=` of `unit` to 3s through a drop-in, so the test sees a
/// watchdog restart quickly.
fn short_watchdog(c: &Container, unit: &str) -> anyhow::Result<()> {
    c.sh(&format!(
        "mkdir -p /etc/systemd/system/{unit}.d && \
         printf '[Service]\\nWatchdogSec=3s\\n' >/etc/systemd/system/{unit}.d/test.conf && \
         systemctl daemon-reload"
    ))?;
    Ok(())
}

/// SIGSTOPs the unit's main process and waits for systemd to kill it for its
/// silent watchdog and start a new one.
fn watchdog_restarts(c: &Container, unit: &str) -> anyhow::Result<()> {
    let before = c.prop(unit, "MainPID");
    let restarts: u32 = c.prop(unit, "NRestarts").parse().unwrap_or(0);
    c.sh(&format!("kill -STOP {before}"))?;
    c.wait(
        &format!("{unit} restarted by its watchdog"),
        Duration::from_secs(60),
        |c| {
            c.prop(unit, "ActiveState") == "active"
                && c.prop(unit, "MainPID") != before
                && c.prop(unit, "NRestarts").parse().unwrap_or(0) > restarts
        },
    );
    let journal = c.sh(&format!("journalctl --no-pager -u {unit}"))?;
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    Ok(())
}

#[test]
fn packages_install_run_upgrade_and_survive_watchdogs_under_systemd() -> anyhow::Result<()> {
    let test = "packages_install_run_upgrade_and_survive_watchdogs_under_systemd";
    if !running_as_root(test)
        || !have("systemd-nspawn", test)
        || !have("debootstrap", test)
        || !have("dpkg-deb", test)
    {
        return Ok(());
    }
    bin("drover-agent")?;
    let debs = tempfile::tempdir()?;
    let v1 = package(&debs.path().join("v1"), "")?;
    let v2 = package(&debs.path().join("v2"), "+t2")?;
    let c = Container::boot()?;
    let mut first = Vec::new();
    for deb in &v1 {
        first.push(c.put(deb)?);
    }

    // Install: nothing starts or is enabled unless configured.
    c.sh(&format!("dpkg -i {}", first.join(" ")))?;
    for unit in ["drover-master", "drover-agent"] {
        assert_eq!(c.prop(unit, "ActiveState"), "inactive", "{unit}");
        assert_eq!(c.prop(unit, "UnitFileState"), "disabled", "{unit}");
        let verify = c.run(&format!("systemd-analyze verify {unit}.service"))?;
        assert!(
            verify.status.success() && verify.stderr.is_empty(),
            "systemd-analyze verify {unit}: {}",
            String::from_utf8_lossy(&verify.stderr)
        );
    }
    assert_eq!(
        c.sh("stat -c '%U %a' /var/lib/drover-master /etc/drover/master.toml")?,
        "drover 700\nroot 640\n"
    );

    // Type=notify: `systemctl start` returns once READY=1 came with its STATUS=.
    c.sh("systemctl start drover-master")?;
    assert_eq!(c.prop("drover-master", "ActiveState"), "active");
    let status = c.prop("drover-master", "StatusText");
    assert!(status.starts_with("serving on 127.0.0.1:7070"), "{status}");
    assert_eq!(c.prop("drover-master", "User"), "drover");

    // The agent, with its token; cgroups only where the container can make them.
    let cgroups = c.run(
        "mkdir /sys/fs/cgroup/memory/drover-probe && rmdir /sys/fs/cgroup/memory/drover-probe",
    )?;
    if !cgroups.status.success() {
        eprintln!(
            "{test}: the container's cgroup controllers are read-only (cgroup v1 host under \
             systemd-nspawn): executors run with no_isolation; cgroup limits and task cgroups \
             inside the agent's delegated cgroup are not tested here"
        );
        // An operator's edit of the conffile, which the upgrade below must keep.
        c.sh("sed -i 's/^# no_isolation = false.*/no_isolation = true/' /etc/drover/agent.toml")?;
    }
    c.sh("mkdir -p /var/lib/drover/agent && umask 077 && \
          drover token create --role agent >/var/lib/drover/agent/agent.token")?;
    c.sh("systemctl start drover-agent")?;
    c.wait(
        "the agent registered (StatusText)",
        Duration::from_secs(60),
        |c| {
            c.prop("drover-agent", "StatusText")
                .contains("registered with the master")
        },
    );

    // A job runs.
    c.sh(&format!(
        "cat >/tmp/sleeper.yaml <<'EOF'\n{SLEEPER}EOF\n\
         drover job create /tmp/sleeper.yaml --wait --timeout 60s"
    ))?;
    let pids = c.task_pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    // Where task cgroups go: the agent logs what it decided at start and why.
    let placed = c.sh("journalctl --no-pager -o cat -u drover-agent | grep 'task cgroups'")?;
    if cgroups.status.success() {
        // Inside the unit's cgroup (Delegate=yes) when the agent could use it
        // (v1; v2 only in its `agent` leaf, DelegateSubgroup=, systemd 254+), else
        // at the hierarchy's root.
        let own = c.sh(&format!("cat /proc/{}/cgroup", pids[0]))?;
        let want = if placed.contains("inside the agent's delegated cgroup") {
            "/system.slice/drover-agent.service/drover/"
        } else {
            ":/drover/"
        };
        assert!(own.contains(want), "{placed}\n{own}");
    } else {
        assert!(placed.contains("no_isolation"), "{placed}");
    }

    // Restart: the agent goes, its executors and tasks stay.
    let agent_pid = c.prop("drover-agent", "MainPID");
    c.sh("systemctl restart drover-agent")?;
    assert_ne!(c.prop("drover-agent", "MainPID"), agent_pid);
    assert_eq!(
        c.task_pids(),
        pids,
        "a restart of the agent touched the tasks"
    );

    // Upgrade the agent package: restarted, same tasks, the operator's edit kept.
    let agent_pid = c.prop("drover-agent", "MainPID");
    let agent_deb = v2
        .iter()
        .find(|p| p.to_string_lossy().contains("drover-agent_"))
        .context("no agent package")?;
    c.sh(&format!("dpkg -i {}", c.put(agent_deb)?))?;
    assert_eq!(
        c.sh("dpkg-query -W -f '${Version}' drover-agent")?,
        "0.1.0-1+t2"
    );
    assert_eq!(c.prop("drover-agent", "ActiveState"), "active");
    assert_ne!(c.prop("drover-agent", "MainPID"), agent_pid);
    assert_eq!(c.task_pids(), pids, "the upgrade touched the tasks");
    // The agent and executor versions reach `drover agent list`.
    let version = env!("CARGO_PKG_VERSION").to_string();
    let want = Some(AgentVersions {
        agent: version.clone(),
        executor: version,
    });
    c.wait(
        "the agent's versions in `drover agent list --json`",
        Duration::from_secs(60),
        |c| {
            c.sh("drover agent list --json")
                .ok()
                .and_then(|out| serde_json::from_str::<Vec<AgentView>>(&out).ok())
                .is_some_and(|agents| agents.len() == 1 && agents[0].versions == want)
        },
    );
    assert!(c.sh("drover agent list")?.contains("VERSION"));
    if !cgroups.status.success() {
        assert!(c
            .sh("cat /etc/drover/agent.toml")?
            .contains("no_isolation = true"));
    }
    c.wait(
        "the upgraded agent registered",
        Duration::from_secs(60),
        |c| {
            c.prop("drover-agent", "StatusText")
                .contains("1 tasks running; registered")
        },
    );
    // New tasks start under the new agent and executor.
    c.sh(
        "sed 's/name: sleeper/name: sleeper2/' /tmp/sleeper.yaml >/tmp/sleeper2.yaml && \
          drover job create /tmp/sleeper2.yaml --wait --timeout 60s",
    )?;
    assert_eq!(c.task_pids().len(), 2);

    // Watchdogs: a stopped agent is killed and restarted, its tasks untouched; a
    // stopped master likewise.
    let pids = c.task_pids();
    short_watchdog(&c, "drover-agent")?;
    c.sh("systemctl restart drover-agent")?;
    watchdog_restarts(&c, "drover-agent")?;
    assert_eq!(
        c.task_pids(),
        pids,
        "the watchdog restart touched the tasks"
    );
    short_watchdog(&c, "drover-master")?;
    c.sh("systemctl restart drover-master")?;
    watchdog_restarts(&c, "drover-master")?;
    c.sh("drover job status www-data/prod/sleeper")?;

    // Remove keeps data and conffiles; purge removes them.
    c.sh("dpkg -r drover-master")?;
    assert_eq!(c.prop("drover-master", "LoadState"), "not-found");
    c.sh("test -f /var/lib/drover-master/drover.db && test -f /etc/drover/master.toml")?;
    c.sh("dpkg --purge drover-master")?;
    c.sh("test ! -e /var/lib/drover-master && test ! -e /etc/drover/master.toml")?;
    Ok(())
}

#[test]
fn the_packages_are_lintian_clean() -> anyhow::Result<()> {
    let test = "the_packages_are_lintian_clean";
    if !have("lintian", test) || !have("dpkg-deb", test) {
        return Ok(());
    }
    bin("drover-agent")?;
    let debs = tempfile::tempdir()?;
    let files = package(debs.path(), "")?;
    let out = Command::new("lintian")
        .args(["--fail-on", "warning"])
        .args(&files)
        .output()?;
    assert!(
        out.status.success(),
        "lintian: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The next datagram on `sock` holding the line `field`, within `within`.
fn wait_for_field(sock: &UnixDatagram, field: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {field} within {within:?}");
        sock.set_read_timeout(Some(left)).unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.lines().any(|l| l == field) {
                return msg;
            }
        }
    }
}

#[test]
fn the_agent_is_ready_without_its_master_and_a_stopped_one_stops_pinging() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path)?;
    // A master that does not answer: port 1 on loopback.
    let mut child = Command::new(bin("drover-agent")?)
        .args(["--master", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("agent"))
        .arg("--sandbox-root")
        .arg(dir.path().join("sandboxes"))
        .args(["--no-isolation", "--executor-fork-server", "false"])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "600000")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let result = (|| -> anyhow::Result<()> {
        let ready = wait_for_field(&sock, "READY=1", Duration::from_secs(60));
        assert!(
            ready.contains("STATUS=0 tasks running; not registered with the master yet"),
            "{ready}"
        );
        // Ready means serving: the log server's port answers.
        let addr = std::fs::read_to_string(dir.path().join("agent/agent.addr"))?;
        std::net::TcpStream::connect(addr.trim())?;
        wait_for_field(&sock, "WATCHDOG=1", Duration::from_secs(10));
        wait_for_field(&sock, "WATCHDOG=1", Duration::from_secs(10));
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
        std::thread::sleep(Duration::from_millis(100));
        sock.set_read_timeout(Some(Duration::from_millis(1)))?;
        let mut buf = [0u8; 4096];
        while sock.recv(&mut buf).is_ok() {}
        sock.set_read_timeout(Some(Duration::from_millis(2000)))?;
        if let Ok(n) = sock.recv(&mut buf) {
            bail!(
                "a stopped agent notified: {}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT)?;
        wait_for_field(&sock, "WATCHDOG=1", Duration::from_secs(10));
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}
