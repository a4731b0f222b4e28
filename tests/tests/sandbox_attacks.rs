//! Attacks on the sandbox boundary, black-box: a real master, agent and executors
//! (as root), tasks as `www-data` running hostile shell scripts. Each scenario plants
//! root-owned canary files and directories outside the sandbox and checks afterwards
//! that nothing there was created, written, truncated, renamed or deleted (content,
//! mode, owner, mtime, directory listing), that every attempt the task made on root's
//! files failed (a successful attempt prints `BREACH`), and that the task ended the
//! way it should (so the executor kept running and reported it).
//!
//! With the root-owned task directory most attacks cannot even reach their target;
//! each one is still tried for real. Scenarios run in parallel (one cluster each).

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drover_common::state::TaskState;
use drover_tests::{command_job, running_as_root, Cluster, ClusterConfig, WAIT};
use serde_json::Value;

/// What a canary looked like: content (files) or names (directories), and metadata.
#[derive(Debug, PartialEq, Eq)]
struct Look {
    content: Option<Vec<u8>>,
    names: Option<Vec<String>>,
    mode: u32,
    uid: u32,
    mtime_ns: i64,
    ino: u64,
}

/// Root-owned files and directories outside every sandbox, and how they looked.
struct Canaries {
    dir: PathBuf,
    before: BTreeMap<PathBuf, Look>,
}

impl Canaries {
    /// Plants `<cluster>/canary/` (0755): `file` (0644), `secret` (0600) and `sub/`
    /// with `inner` (0644).
    fn plant(cluster: &Cluster) -> Canaries {
        let dir = cluster.dir().join("canary");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for (name, text, mode) in [
            ("file", "canary\n", 0o644),
            ("secret", "SECRET-CANARY\n", 0o600),
            ("sub/inner", "inner\n", 0o644),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
            std::fs::set_permissions(dir.join(name), PermissionsExt::from_mode(mode)).unwrap();
        }
        for d in [dir.clone(), dir.join("sub")] {
            std::fs::set_permissions(&d, PermissionsExt::from_mode(0o755)).unwrap();
        }
        let mut canaries = Canaries {
            dir,
            before: BTreeMap::new(),
        };
        canaries.before = canaries.look();
        canaries
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn look(&self) -> BTreeMap<PathBuf, Look> {
        let mut out = BTreeMap::new();
        for name in ["", "file", "secret", "sub", "sub/inner"] {
            let path = if name.is_empty() {
                self.dir.clone()
            } else {
                self.dir.join(name)
            };
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let (content, names) = if meta.is_dir() {
                let mut names: Vec<String> = std::fs::read_dir(&path)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                (None, Some(names))
            } else {
                (Some(std::fs::read(&path).unwrap()), None)
            };
            out.insert(
                path,
                Look {
                    content,
                    names,
                    mode: meta.mode(),
                    uid: meta.uid(),
                    mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
                    ino: meta.ino(),
                },
            );
        }
        out
    }

    /// Asserts that every canary looks as it did when planted.
    fn assert_untouched(&self) {
        let now = self.look();
        for (path, before) in &self.before {
            assert_eq!(
                Some(before),
                now.get(path),
                "canary {} changed",
                path.display()
            );
        }
    }
}

/// A cluster of one agent with `agent_config`, its canaries planted.
fn cluster_with(agent_config: &str) -> (Cluster, Canaries) {
    let mut config = ClusterConfig::agents(1);
    config.agent_config = agent_config.to_string();
    let cluster = Cluster::start(config).unwrap();
    let canaries = Canaries::plant(&cluster);
    (cluster, canaries)
}

/// Starts a one-instance batch job running `script` and returns its task id.
fn start_job(cluster: &mut Cluster, name: &str, script: &str) -> String {
    start_spec(cluster, command_job(name, 1, false, script))
}

fn start_spec(cluster: &mut Cluster, spec: Value) -> String {
    let key = format!("www-data/test/{}", spec["name"].as_str().unwrap());
    cluster.create_job(&spec).unwrap();
    cluster
        .wait_for("the task to be placed", WAIT, |c| {
            let view = c.job(&key).ok()?;
            let task = view.instances.first()?.current.as_ref()?;
            task.agent_id.as_ref()?;
            Some(task.task_id.clone())
        })
        .unwrap()
}

/// Waits until task `id` is terminal and returns its state.
fn wait_terminal(cluster: &mut Cluster, id: &str) -> TaskState {
    cluster
        .wait_for("the task to end", WAIT, |c| {
            let task = c.task(id).ok()?;
            task.state.is_terminal().then_some(task.state)
        })
        .unwrap()
}

/// Waits until task `id` is RUNNING.
fn wait_running(cluster: &mut Cluster, id: &str) {
    cluster
        .wait_for("the task to run", WAIT, |c| {
            (c.task(id).ok()?.state == TaskState::Running).then_some(())
        })
        .unwrap()
}

/// The whole of a log (all rotated files, oldest first) as root reads it.
fn log_text(task_dir: &Path, stream: &str) -> String {
    let mut text = String::new();
    for n in (1..10).rev() {
        if let Ok(t) = std::fs::read_to_string(task_dir.join(format!("logs/main.{stream}.{n}"))) {
            text.push_str(&t);
        }
    }
    text + &std::fs::read_to_string(task_dir.join(format!("logs/main.{stream}")))
        .unwrap_or_default()
}

/// Root's side of the task directory is as the layout says: the directory root's
/// 0711, `sandbox/` the task user's 0700, every log a regular root file 0600.
fn assert_layout_intact(task_dir: &Path) {
    let meta = std::fs::symlink_metadata(task_dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o711));
    let sandbox = std::fs::symlink_metadata(task_dir.join("sandbox")).unwrap();
    assert!(sandbox.is_dir());
    let www = nix::unistd::User::from_name("www-data")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    assert_eq!(sandbox.uid(), www);
    for entry in std::fs::read_dir(task_dir.join("logs")).unwrap() {
        let meta = std::fs::symlink_metadata(entry.unwrap().path()).unwrap();
        assert!(meta.is_file());
        assert_eq!(
            (meta.uid(), meta.mode() & 0o777, meta.nlink()),
            (0, 0o600, 1)
        );
    }
    for name in ["task.json", "status.json"] {
        let meta = std::fs::symlink_metadata(task_dir.join(name)).unwrap();
        assert!(meta.is_file(), "{name}");
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600), "{name}");
    }
}

/// Waits for task `id` to FINISH (so its executor ran it to the end), then checks
/// that no attempt of the task worked (`BREACH` in its stdout), that the canaries
/// are untouched and root's side of the task directory intact. Returns the task
/// directory and the task's stdout.
fn assert_finished_unharmed(
    cluster: &mut Cluster,
    canaries: &Canaries,
    id: &str,
) -> (PathBuf, String) {
    assert_eq!(wait_terminal(cluster, id), TaskState::Finished);
    let task_dir = cluster.sandbox_of(id).unwrap();
    let out = log_text(&task_dir, "stdout");
    assert!(!out.contains("BREACH"), "{out}");
    canaries.assert_untouched();
    assert_layout_intact(&task_dir);
    (task_dir, out)
}

/// Shell lines that each try one thing on root's side and print `BREACH <what>` if
/// it worked. The task's working directory is `sandbox/`, so `..` is its task
/// directory and `../..` the sandbox root.
fn attempts(canaries: &Canaries) -> String {
    let file = canaries.path("file");
    let dir = canaries.path("");
    [
        "ls .. >/dev/null 2>&1 && echo BREACH listed-task-dir".to_string(),
        "ls ../.. >/dev/null 2>&1 && echo BREACH listed-sandbox-root".into(),
        "cat ../task.json >/dev/null 2>&1 && echo BREACH read-task-json".into(),
        "cat ../status.json >/dev/null 2>&1 && echo BREACH read-checkpoint".into(),
        "echo forged >> ../status.json 2>/dev/null && echo BREACH wrote-checkpoint".into(),
        "echo forged > ../task.json 2>/dev/null && echo BREACH wrote-task-json".into(),
        "echo forged >> ../logs/main.stdout 2>/dev/null && echo BREACH wrote-log".into(),
        "rm -f ../status.json 2>/dev/null; test -e ../status.json || echo BREACH removed-checkpoint".into(),
        "mv ../logs ../logs.old 2>/dev/null && echo BREACH renamed-logs".into(),
        format!("ln -s {dir} ../logs.new 2>/dev/null && echo BREACH linked-in-task-dir"),
        format!("ln -sf {file} ../logs/main.stdout 2>/dev/null && echo BREACH linked-log"),
        format!("ln -sf {file} ../logs/main.stdout.1 2>/dev/null && echo BREACH linked-rotated-log"),
        "mkdir ../x 2>/dev/null && echo BREACH mkdir-in-task-dir".into(),
        "mv ../sandbox ../sandbox.old 2>/dev/null && echo BREACH renamed-sandbox".into(),
        "chmod 777 .. 2>/dev/null && echo BREACH chmod-task-dir".into(),
        "rm -f ../executor.sock 2>/dev/null; echo > /dev/null".into(),
    ]
    .join("\n")
}

/// The older layout's trap, laid inside `sandbox/` where the task may write: a
/// `.drover/` with its logs symlinked to root's files, and `logs` a symlink.
fn old_layout_traps(canaries: &Canaries) -> String {
    let (file, dir) = (canaries.path("file"), canaries.path(""));
    format!(
        "mkdir -p .drover/logs\n\
         ln -sf {file} .drover/logs/main.stdout\n\
         ln -sf {file} .drover/logs/main.stderr\n\
         ln -sf {dir} logs\n\
         ln -sf {file} status.json\n\
         ln -sf {file} executor.stderr\n"
    )
}

#[test]
fn a_task_cannot_touch_roots_files_nor_list_other_tasks() {
    if !running_as_root("sandbox attack: reach root's files") {
        return;
    }
    let (mut cluster, canaries) = cluster_with("");
    let script = format!(
        "{}\n{}\necho out-line\necho err-line >&2\n",
        old_layout_traps(&canaries),
        attempts(&canaries)
    );
    let id = start_job(&mut cluster, "reach", &script);
    let (task_dir, out) = assert_finished_unharmed(&mut cluster, &canaries, &id);
    assert_eq!(out, "out-line\n");
    let err = log_text(&task_dir, "stderr");
    assert!(err.contains("err-line"), "{err}");
}

#[test]
fn swapping_symlinks_in_a_tight_loop_during_rotation_changes_nothing_outside() {
    if !running_as_root("sandbox attack: swap race during rotation") {
        return;
    }
    let (mut cluster, canaries) =
        cluster_with("executor_log_max_size = \"1KiB\"\nexecutor_log_max_files = 2\n");
    let (file, dir) = (canaries.path("file"), canaries.path(""));
    // For 4 s: a swapper in the background turns `.drover`, `logs` and the snooze
    // file into symlinks to root's files and back, and keeps trying root's side; the
    // foreground writes output fast enough to rotate the logs many times. 200 more
    // lines per stream after the race rotate both logs however slow a loaded machine
    // made the timed loop.
    let script = format!(
        "end=$(( $(date +%s) + 4 ))\n\
         (while [ $(date +%s) -lt $end ]; do\n\
            rm -rf .drover logs .healthchecksnooze; ln -s {dir} .drover; ln -s {dir} logs; ln -s {file} .healthchecksnooze\n\
            rm -f .drover logs .healthchecksnooze; mkdir -p .drover/logs; ln -s {file} .drover/logs/main.stdout; touch .healthchecksnooze\n\
            ln -sf {file} ../logs/main.stdout 2>/dev/null && echo BREACH linked-log\n\
            mv ../logs ../l 2>/dev/null && echo BREACH renamed-logs\n\
          done) &\n\
         i=0\n\
         while [ $(date +%s) -lt $end ]; do i=$((i+1)); echo \"line $i of the output that rotates\"; echo \"err $i\" >&2; done\n\
         wait\n\
         i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo \"line $i of the output after the race\"; echo \"stderr line $i after the race\" >&2; done\n\
         echo last-line\n"
    );
    let id = start_job(&mut cluster, "swaprace", &script);
    let (task_dir, out) = assert_finished_unharmed(&mut cluster, &canaries, &id);
    assert!(out.ends_with("last-line\n"), "{out}");
    for name in ["main.stdout.1", "main.stdout.2", "main.stderr.1"] {
        assert!(task_dir.join("logs").join(name).is_file(), "{name} rotated");
    }
    assert!(!task_dir.join("logs/main.stdout.3").exists(), "keeps 2");
}

#[test]
fn fifos_device_nodes_and_hard_links_where_logs_are_expected_change_nothing() {
    if !running_as_root("sandbox attack: fifos, devices, hard links") {
        return;
    }
    let (mut cluster, canaries) = cluster_with("");
    let (file, secret) = (canaries.path("file"), canaries.path("secret"));
    let script = format!(
        "mkdir -p .drover/logs\n\
         mkfifo .drover/logs/main.stdout .drover/logs/main.stderr\n\
         mkfifo ../logs/main.stderr 2>/dev/null && echo BREACH fifo-log\n\
         mknod null-copy c 1 3 2>/dev/null && echo BREACH mknod\n\
         mknod ../logs/main.stdout c 1 3 2>/dev/null && echo BREACH mknod-log\n\
         ln {file} hardlink 2>/dev/null && echo hard-link-allowed-here\n\
         ln {file} ../logs/main.stdout 2>/dev/null && echo BREACH hard-link-log\n\
         ln {secret} ../status.json 2>/dev/null && echo BREACH hard-link-checkpoint\n\
         echo out-line\n"
    );
    let id = start_job(&mut cluster, "nodes", &script);
    let (_, out) = assert_finished_unharmed(&mut cluster, &canaries, &id);
    assert!(out.ends_with("out-line\n"), "{out}");
    // The log API serves the real log.
    let logs = cluster
        .drover(&["task", "logs", "www-data/test/nodes/0"])
        .unwrap();
    assert!(String::from_utf8_lossy(&logs.stdout).ends_with("out-line\n"));
}

#[test]
fn a_forged_checkpoint_or_task_file_is_not_believed_by_a_restarted_agent() {
    if !running_as_root("sandbox attack: forged checkpoint") {
        return;
    }
    let (mut cluster, canaries) = cluster_with("");
    // The task forges a FINISHED checkpoint and a task file naming a process `evil`
    // wherever it can write, tries root's copies, starts an impostor whose command
    // line is its executor's (`drover-executor ... run --sandbox <task dir>`), then
    // runs on.
    let forged = r#"{"seq":99,"task_id":"ID","state":"FINISHED","exit_reason":null,"message":"forged","timestamp_ms":1,"executor_pid":1,"processes":[]}"#;
    let script = format!(
        "mkdir -p .drover\n\
         for f in status.json .drover/status.json; do echo '{forged}' > $f; done\n\
         echo '{forged}' >> ../status.json 2>/dev/null && echo BREACH wrote-checkpoint\n\
         echo '{{\"task\":{{\"processes\":[{{\"name\":\"evil\"}}]}}}}' > task.json\n\
         cp task.json ../task.json 2>/dev/null && echo BREACH wrote-task-json\n\
         bash -c 'exec -a drover-executor bash -c \"sleep 600; true\" run --sandbox '\"$(dirname $DROVER_SANDBOX)\" &\n\
         echo running\n\
         exec sleep 600\n"
    );
    let id = start_job(&mut cluster, "forger", &script.replace("ID", "forger"));
    wait_running(&mut cluster, &id);
    let task_dir = cluster.sandbox_of(&id).unwrap();
    cluster
        .wait_for("the task's output", WAIT, |_| {
            log_text(&task_dir, "stdout")
                .contains("running")
                .then_some(())
        })
        .unwrap();
    // The log server believes root's task.json: there is no process `evil`.
    let evil = cluster
        .drover(&[
            "task",
            "logs",
            "www-data/test/forger/0",
            "--process",
            "evil",
        ])
        .unwrap();
    assert!(
        !evil.status.success(),
        "a log of a forged process was served"
    );
    // Agent and executor die; the restarted agent finds the sandbox without an
    // executor (the impostor runs as the task user: not believed) and a checkpoint
    // that says RUNNING, whatever the task wrote.
    let checkpoint = std::fs::read(task_dir.join("status.json")).unwrap();
    let executor = drover_common::wire::checkpointed_status(&checkpoint)
        .unwrap()
        .executor_pid;
    cluster.kill_agent(0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(executor as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    cluster.start_agent_again(0).unwrap();
    assert_eq!(wait_terminal(&mut cluster, &id), TaskState::Lost);
    let task = cluster.task(&id).unwrap();
    assert!(
        task.events.iter().all(|e| e.state != TaskState::Finished),
        "{task:?}"
    );
    assert!(!log_text(&task_dir, "stdout").contains("BREACH"));
    canaries.assert_untouched();
}

#[test]
fn the_log_server_never_serves_what_a_task_swaps_in() {
    if !running_as_root("sandbox attack: log server race") {
        return;
    }
    let (mut cluster, canaries) = cluster_with("");
    let secret = canaries.path("secret");
    // For 6 s the task swaps a file and a symlink to a root-only secret wherever a
    // log of it could be named, and prints a line between swaps.
    let script = format!(
        "end=$(( $(date +%s) + 6 ))\n\
         mkdir -p .drover/logs logs\n\
         while [ $(date +%s) -lt $end ]; do\n\
           echo swap\n\
           for d in .drover/logs logs; do echo x > $d/f; mv -f $d/f $d/main.stdout; ln -sf {secret} $d/l; mv -f $d/l $d/main.stdout; done\n\
           ln -sf {secret} ../logs/main.stdout 2>/dev/null && echo BREACH linked-log\n\
         done\n\
         echo done\n"
    );
    let id = start_job(&mut cluster, "lograce", &script);
    wait_running(&mut cluster, &id);
    // Through the master's log route: the agent's log server answers only it.
    let path = format!("/v1/tasks/{id}/logs/main/stdout");
    let (mut served, started) = (0, Instant::now());
    for _ in 0..2000 {
        let (status, body) = cluster.get_status(&path).unwrap();
        assert!(!body.contains("SECRET"), "the log server served the secret");
        if status == 200 {
            served += 1;
        }
    }
    assert!(served > 0, "no log was ever served");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_finished_unharmed(&mut cluster, &canaries, &id);
}

#[test]
fn the_pids_limit_comes_from_the_spec_within_the_hosts_maximum() {
    if !running_as_root("pids limit") {
        return;
    }
    let (mut cluster, _canaries) = cluster_with("max_task_pids = 64\n");
    let with_pids = |name: &str, pids: Option<u64>| {
        let mut spec = command_job(name, 1, false, "exec sleep 600");
        if let Some(n) = pids {
            spec["task"]["resources"]["pids"] = n.into();
        }
        spec
    };
    let pids_max = |id: &str| {
        ["/sys/fs/cgroup/pids/drover", "/sys/fs/cgroup/drover"]
            .iter()
            .find_map(|parent| {
                std::fs::read_to_string(Path::new(parent).join(id).join("pids.max")).ok()
            })
            .map(|t| t.trim().to_string())
    };
    let small = start_spec(&mut cluster, with_pids("small", Some(16)));
    let default = start_spec(&mut cluster, with_pids("default", None));
    let greedy = start_spec(&mut cluster, with_pids("greedy", Some(100)));
    wait_running(&mut cluster, &small);
    wait_running(&mut cluster, &default);
    assert_eq!(pids_max(&small).as_deref(), Some("16"));
    // The default (1024) is cut to the host's maximum.
    assert_eq!(pids_max(&default).as_deref(), Some("64"));
    assert_eq!(wait_terminal(&mut cluster, &greedy), TaskState::Failed);
    let task = cluster.task(&greedy).unwrap();
    let said = format!("{task:?}");
    assert!(said.contains("max_task_pids"), "{said}");
    for key in ["small", "default"] {
        cluster.kill_job(&format!("www-data/test/{key}")).unwrap();
    }
}

/// The host pids in the cgroup of task `id` (v1 pids hierarchy or v2).
fn cgroup_pids(id: &str) -> Vec<i32> {
    ["/sys/fs/cgroup/pids/drover", "/sys/fs/cgroup/drover"]
        .iter()
        .find_map(|parent| {
            std::fs::read_to_string(Path::new(parent).join(id).join("cgroup.procs")).ok()
        })
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Two tasks of the same user (`www-data`): the attacker cannot read the victim's
/// `/proc/<pid>/environ` (its `task.env` secret), signal it, list the host's
/// processes nor write into the victim's `/tmp`; its own `/tmp` is its own. Each
/// task has its own pid and mount namespaces (pid 1 there is the executor's init,
/// which ignores the task's signals).
#[test]
fn a_task_cannot_read_signal_or_list_other_processes_nor_write_another_tasks_tmp() {
    if !running_as_root("sandbox attack: other tasks' processes and /tmp") {
        return;
    }
    let (mut cluster, canaries) = cluster_with("");
    let mut spec = command_job(
        "victim",
        1,
        false,
        "echo mine > /tmp/victim-file; exec sleep 600",
    );
    spec["task"]["env"] = serde_json::json!({"SECRET": "VICTIM-SECRET-4711"});
    let victim = start_spec(&mut cluster, spec);
    wait_running(&mut cluster, &victim);
    let victim_dir = cluster.sandbox_of(&victim).unwrap();
    let mut vpid = Vec::new();
    cluster
        .wait_for("the victim's process", WAIT, |_| {
            vpid = cgroup_pids(&victim);
            (!vpid.is_empty()).then_some(())
        })
        .unwrap();
    let vpid = vpid[0];
    let environ = std::fs::read_to_string(format!("/proc/{vpid}/environ")).unwrap();
    assert!(
        environ.contains("VICTIM-SECRET-4711"),
        "the secret is really there"
    );
    let script = format!(
        "VP={vpid}\n\
         cat /proc/$VP/environ 2>/dev/null | grep -q VICTIM-SECRET && echo BREACH read-environ\n\
         for f in /proc/[0-9]*/environ; do grep -qs VICTIM-SECRET \"$f\" && echo BREACH found-environ; done\n\
         kill -0 $VP 2>/dev/null && echo BREACH signalled\n\
         kill -STOP $VP 2>/dev/null && echo BREACH stopped\n\
         kill -9 1 2>/dev/null; kill -TERM 1 2>/dev/null\n\
         n=$(ls -d /proc/[0-9]* | wc -l); [ \"$n\" -gt 10 ] && echo BREACH listed-$n-processes\n\
         p=drover; for f in /proc/[0-9]*/cmdline; do [ $f = /proc/1/cmdline ] || [ $f = /proc/$$/cmdline ] || ! grep -qs $p- $f || echo BREACH saw-$f; done\n\
         test -e /tmp/victim-file && echo BREACH saw-victim-tmp\n\
         echo planted > {dir}/tmp/data/planted 2>/dev/null && echo BREACH wrote-victim-tmp\n\
         ls {dir}/tmp/data >/dev/null 2>&1 && echo BREACH listed-victim-tmp\n\
         echo planted > /tmp/planted-by-attacker || echo BREACH own-tmp-unwritable\n\
         echo done\n",
        dir = victim_dir.display()
    );
    let attacker = start_job(&mut cluster, "attacker", &script);
    let (_, out) = assert_finished_unharmed(&mut cluster, &canaries, &attacker);
    assert_eq!(out, "done\n");
    assert!(
        !victim_dir.join("tmp/data/planted").exists(),
        "the victim's /tmp got a file"
    );
    assert!(
        !Path::new("/tmp/planted-by-attacker").exists(),
        "the attacker's /tmp is the host's"
    );
    assert_eq!(
        std::fs::read_to_string(victim_dir.join("tmp/data/victim-file")).unwrap(),
        "mine\n",
        "the victim's /tmp is its tmp/data"
    );
    let stat = std::fs::read_to_string(format!("/proc/{vpid}/stat")).unwrap();
    let state = stat.rsplit(')').next().unwrap().split_whitespace().next();
    assert_eq!(state, Some("S"), "the victim still sleeps: {stat}");
    assert_eq!(
        cluster.task(&victim).unwrap().state,
        TaskState::Running,
        "the victim runs on"
    );
    cluster.kill_job("www-data/test/victim").unwrap();
}

/// `resources.disk` is enforced: a task writing past it is stopped and fails with
/// `disk_limit_exceeded` naming its usage and limit, while another task on the same
/// host keeps writing and finishes.
#[test]
fn a_task_filling_the_disk_past_its_limit_is_stopped_while_its_neighbour_writes_on() {
    if !running_as_root("sandbox attack: fill the disk") {
        return;
    }
    let (mut cluster, _canaries) = cluster_with("");
    let mut hog = command_job(
        "hog",
        1,
        false,
        "while :; do head -c 1048576 /dev/zero >> /tmp/fill; head -c 1048576 /dev/zero >> fill; sleep 0.1; done",
    );
    hog["task"]["resources"]["disk"] = "8MiB".into();
    let neighbour = command_job(
        "neighbour",
        1,
        false,
        "i=0; while [ $i -lt 100 ]; do echo line $i >> log.txt; i=$((i+1)); sleep 0.1; done; wc -l < log.txt",
    );
    let hog = start_spec(&mut cluster, hog);
    let neighbour = start_spec(&mut cluster, neighbour);
    assert_eq!(wait_terminal(&mut cluster, &hog), TaskState::Failed);
    let task = cluster.task(&hog).unwrap();
    match task.exit_reason {
        Some(drover_common::state::ExitReason::DiskLimitExceeded {
            used_bytes,
            limit_bytes,
        }) => {
            assert_eq!(limit_bytes, 8 << 20);
            assert!(used_bytes > 8 << 20, "{used_bytes}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        cluster.task(&neighbour).unwrap().state,
        TaskState::Running,
        "the neighbour still writes when the hog is stopped"
    );
    assert_eq!(wait_terminal(&mut cluster, &neighbour), TaskState::Finished);
    let dir = cluster.sandbox_of(&neighbour).unwrap();
    assert_eq!(log_text(&dir, "stdout").trim(), "100");
}

/// The host's first non-loopback IPv4 address (`ip -4 -o addr show scope global`).
fn host_address() -> Option<std::net::Ipv4Addr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// `task.network: isolated` with a named port: the service is reachable from the
/// host through its assigned port (the executor forwards it into the task's
/// namespace) and passes its HTTP health check that way, while the task itself
/// cannot connect out, not even to a listener on the host's own address.
#[test]
fn an_isolated_service_is_reachable_through_its_port_but_cannot_connect_out() {
    if !running_as_root("sandbox attack: connect out of an isolated task") {
        return;
    }
    let Some(ip) = host_address() else {
        eprintln!("SKIPPED isolated network: the host has no non-loopback IPv4 address to try");
        return;
    };
    let outside = std::net::TcpListener::bind((ip, 0)).unwrap();
    outside.set_nonblocking(true).unwrap();
    let outside_port = outside.local_addr().unwrap().port();
    let (mut cluster, canaries) = cluster_with("");
    let mut spec = drover_tests::service_job("isolated", 1);
    spec["task"]["network"] = "isolated".into();
    spec["task"]["processes"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "probe",
            "cmdline": format!(
                "exec python3 -c 'import socket\ntry:\n socket.create_connection((\"{ip}\", {outside_port}), timeout=3)\n print(\"BREACH connected\")\nexcept OSError as e:\n print(\"blocked\", e.errno)'"
            ),
        }));
    cluster.create_job(&spec).unwrap();
    let view = cluster
        .wait_for_all("www-data/test/isolated", TaskState::Running)
        .unwrap();
    let task = view.instances[0].current.clone().unwrap();
    let port = task.ports["http"];
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(
        &mut conn,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut conn, &mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.0 200") && answer.ends_with("hello"),
        "{answer}"
    );
    let dir = cluster.sandbox_of(&task.task_id).unwrap();
    let probe = cluster
        .wait_for("the probe's verdict", WAIT, |_| {
            let out = std::fs::read_to_string(dir.join("logs/probe.stdout")).ok()?;
            out.ends_with('\n').then_some(out)
        })
        .unwrap();
    assert!(probe.starts_with("blocked"), "{probe}");
    assert!(
        matches!(outside.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the isolated task reached the host's listener"
    );
    // The host itself reaches that listener: the probe was blocked by the namespace.
    std::net::TcpStream::connect((ip, outside_port)).unwrap();
    cluster.kill_job("www-data/test/isolated").unwrap();
    canaries.assert_untouched();
}

/// An ext4 file system in an image file, on a loop device (`mount -o loop`) over a
/// directory; unmounted (lazily: executors may still hold files) and its loop device
/// detached when dropped.
struct LoopFs {
    dir: PathBuf,
    image: PathBuf,
}

impl LoopFs {
    /// A 256 MiB ext4 (a sparse image) over `dir` (empty), with project quotas (`-O quota,project`,
    /// mounted `prjquota`) when `quota`.
    fn over(dir: &Path, image: &Path, quota: bool) -> anyhow::Result<LoopFs> {
        let run = |cmd: &mut std::process::Command| -> anyhow::Result<()> {
            let out = cmd.output()?;
            anyhow::ensure!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(())
        };
        std::fs::File::create(image)?.set_len(256 << 20)?;
        let mut mkfs = std::process::Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F"]);
        if quota {
            mkfs.args(["-O", "quota,project"]);
        }
        run(mkfs.arg(image))?;
        let options = if quota { "loop,prjquota" } else { "loop" };
        run(std::process::Command::new("mount")
            .args(["-o", options])
            .arg(image)
            .arg(dir))?;
        let fs = LoopFs {
            dir: dir.to_path_buf(),
            image: image.to_path_buf(),
        };
        std::fs::set_permissions(dir, PermissionsExt::from_mode(0o755))?;
        Ok(fs)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
        // `mount -o loop` sets autoclear; a device still attached is detached here.
        if let Ok(out) = std::process::Command::new("losetup")
            .arg("-j")
            .arg(&self.image)
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(dev) = line.split(':').next() {
                    let _ = std::process::Command::new("losetup")
                        .args(["-d", dev])
                        .status();
                }
            }
        }
    }
}

/// `resources.disk` on a sandbox root that keeps project quotas (ext4 `-O
/// quota,project` on a loop device, mounted `prjquota`): the kernel refuses the hog's
/// write past its limit (plus the executor's 1 MiB margin), the hog's writer exits on
/// `EDQUOT`, and the task still ends `disk_limit_exceeded` with the quota's usage,
/// while a neighbour keeps writing and finishes. On a kernel without quota support
/// (no `CONFIG_QFMT_V2`: such an ext4 does not mount at all) the same runs on a plain
/// ext4, where the executor says it falls back to the scan.
#[test]
fn a_task_over_its_project_quota_is_stopped_while_its_neighbour_writes_on() {
    if !running_as_root("sandbox attack: project quota") {
        return;
    }
    let tools = ["losetup", "mkfs.ext4", "mount"].iter().all(|t| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !Path::new("/dev/loop-control").exists() || !tools {
        eprintln!(
            "SKIPPED project quota: no loop devices (/dev/loop-control) or no losetup/mkfs.ext4 (scripts/setup.sh installs them)"
        );
        return;
    }
    let (mut cluster, _canaries) = cluster_with("");
    cluster.kill_agent(0);
    let root = cluster.sandbox_roots[0].clone();
    let image = cluster.dir().join("sandboxes.img");
    let (fs, quota) = match LoopFs::over(&root, &image, true) {
        Ok(fs) => (fs, true),
        Err(e) => {
            eprintln!(
                "NOTE: no ext4 project quotas here ({e}); testing the executor's fallback to the scan on a plain ext4"
            );
            (LoopFs::over(&root, &image, false).unwrap(), false)
        }
    };
    cluster.start_agent_again(0).unwrap();
    let mut hog = command_job(
        "qhog",
        1,
        false,
        "while :; do head -c 1048576 /dev/zero >> fill || exit 3; head -c 1048576 /dev/zero >> /tmp/fill || exit 4; sleep 0.2; done",
    );
    hog["task"]["resources"]["disk"] = "8MiB".into();
    let neighbour = command_job(
        "qneighbour",
        1,
        false,
        "i=0; while [ $i -lt 60 ]; do echo line $i >> log.txt; i=$((i+1)); sleep 0.1; done; wc -l < log.txt",
    );
    let hog = start_spec(&mut cluster, hog);
    let neighbour = start_spec(&mut cluster, neighbour);
    assert_eq!(wait_terminal(&mut cluster, &hog), TaskState::Failed);
    let task = cluster.task(&hog).unwrap();
    let said: Vec<&str> = task.events.iter().map(|e| e.message.as_str()).collect();
    let enforcement = if quota {
        "resources.disk by project quota"
    } else {
        "resources.disk by a scan every"
    };
    assert!(
        said.iter().any(|m| m.contains(enforcement)),
        "{enforcement}: {said:?}"
    );
    // The agent said so once, at its start, from the sandbox root's mount options.
    let agent_said = if quota {
        "resources.disk: project quotas"
    } else {
        "resources.disk: the executor's scan alone"
    };
    let log = std::fs::read_to_string(cluster.dir().join("logs/agent-0.log")).unwrap();
    assert!(log.contains(agent_said), "{agent_said}:\n{log}");
    match task.exit_reason {
        Some(drover_common::state::ExitReason::DiskLimitExceeded {
            used_bytes,
            limit_bytes,
        }) => {
            assert_eq!(limit_bytes, 8 << 20);
            assert!(used_bytes > 8 << 20, "{used_bytes}");
            if quota {
                // The kernel refused the write that would pass limit + margin.
                assert!(used_bytes <= 9 << 20, "{used_bytes}");
            }
        }
        other => panic!("{other:?} {said:?}"),
    }
    assert_eq!(
        cluster.task(&neighbour).unwrap().state,
        TaskState::Running,
        "the neighbour still writes when the hog is stopped"
    );
    assert_eq!(wait_terminal(&mut cluster, &neighbour), TaskState::Finished);
    let dir = cluster.sandbox_of(&neighbour).unwrap();
    assert_eq!(log_text(&dir, "stdout").trim(), "60");
    // The file system first (a lazy unmount), so the cluster's directory, mount point
    // included, can be removed when the cluster goes.
    drop(fs);
    drop(cluster);
}
