//! Whether an executor is alive, from `/proc`: a pid that is still one of ours
//! (not reused, not a task process dressed up as one), and the running
//! executors of a sandbox root by their command line or working directory.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

/// True if `pid` is a running (not zombie) process of the agent's own user whose
/// command line mentions `binary_name` (so a reused pid is not mistaken for the
/// executor, and a task process dressed up as one, which runs as the task user, is
/// never believed).
pub fn executor_pid_is_live(pid: u32, binary_name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = fs::metadata(format!("/proc/{pid}"))
        .is_ok_and(|m| m.uid() == nix::unistd::Uid::effective().as_raw());
    if !ours {
        return false;
    }
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(_) => return false,
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, Some('Z') | Some('X') | None) {
        return false;
    }
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => String::from_utf8_lossy(&cmdline).contains(binary_name),
        Err(_) => false,
    }
}

/// Finds running executors of sandboxes below `sandbox_root` by their command line
/// (`<binary_name> run ... --sandbox <root>/<task_id>`), or for one forked by the fork
/// server (whose command line is the zygote's) by its working directory, the task
/// directory: task id -> pid. Covers an executor whose pid the agent never recorded
/// (a crash right after the spawn).
pub fn find_running_executors(binary_name: &str, sandbox_root: &Path) -> HashMap<String, u32> {
    let mut found = HashMap::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok();
        if let Some(task_id) = executor_task_of(&cmdline, cwd.as_deref(), binary_name, sandbox_root)
        {
            if executor_pid_is_live(pid, binary_name) {
                found.insert(task_id, pid);
            }
        }
    }
    found
}

/// The task id an executor runs, if it is one of ours, from its command line and
/// working directory (pure). An executor forked by the fork server has the zygote's
/// command line (`<binary_name> zygote ...`) and its task directory as working directory; the
/// fork server itself works in `/`.
pub fn executor_task_of(
    cmdline: &[u8],
    cwd: Option<&Path>,
    binary_name: &str,
    sandbox_root: &Path,
) -> Option<String> {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if !args.iter().take(2).any(|a| a.contains(binary_name)) {
        return None;
    }
    let sandbox = if args.get(1).is_some_and(|a| a == "zygote") {
        cwd?
    } else if args.iter().any(|a| a == "run") {
        let pos = args.iter().position(|a| a == "--sandbox")?;
        Path::new(args.get(pos + 1)?)
    } else {
        return None;
    };
    if sandbox.parent()? != sandbox_root {
        return None;
    }
    let task_id = sandbox.file_name()?.to_str()?.to_string();
    drover_common::spec::is_valid_name(&task_id).then_some(task_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn executor_command_lines_name_their_task() {
        let root = Path::new("/srv/sandboxes");
        let ours = b"/usr/bin/drover-executor\0run\0--task\0/srv/sandboxes/t1/task.json\0--sandbox\0/srv/sandboxes/t1\0";
        let cwd = Some(Path::new("/"));
        let of = |cmdline: &[u8], cwd| executor_task_of(cmdline, cwd, "drover-executor", root);
        assert_eq!(of(ours, cwd), Some("t1".into()));
        let elsewhere = b"/usr/bin/drover-executor\0run\0--sandbox\0/tmp/x/t1\0";
        assert_eq!(of(elsewhere, cwd), None);
        let cleanup = b"/usr/bin/drover-executor\0cleanup\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(of(cleanup, cwd), None);
        let other = b"/bin/sleep\0run\0--sandbox\0/srv/sandboxes/t1\0";
        assert_eq!(of(other, cwd), None);
        // Forked by the fork server: the zygote's command line, the sandbox as cwd.
        let forked = b"/usr/bin/drover-executor\0zygote\0--socket-fd\x005\0";
        let sandbox = Path::new("/srv/sandboxes/t2");
        assert_eq!(of(forked, Some(sandbox)), Some("t2".into()));
        assert_eq!(of(forked, cwd), None, "the fork server itself");
        assert_eq!(of(forked, None), None);
        assert_eq!(of(forked, Some(Path::new("/tmp/t2"))), None);
    }

    #[test]
    fn our_own_pid_is_live_only_under_the_right_name() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_string_lossy().into_owned();
        assert!(executor_pid_is_live(me, &name));
        assert!(!executor_pid_is_live(me, "no-such-binary-name-xyz"));
        assert!(!executor_pid_is_live(u32::MAX - 1, &name));
    }

    #[test]
    fn a_process_of_another_user_is_never_taken_for_an_executor() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        // Waits until the child has exec'd `sleep` (its command line says so).
        let execd = |pid: u32| {
            for _ in 0..200 {
                if fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep")) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("{pid} never exec'd sleep");
        };
        // A task user's process named like the executor.
        let mut impostor = std::process::Command::new("sleep")
            .arg("30")
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        execd(impostor.id());
        let fooled = executor_pid_is_live(impostor.id(), "sleep");
        impostor.kill().unwrap();
        impostor.wait().unwrap();
        assert!(
            !fooled,
            "a process of another user was taken for an executor"
        );
        let mut ours = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        execd(ours.id());
        let live = executor_pid_is_live(ours.id(), "sleep");
        ours.kill().unwrap();
        ours.wait().unwrap();
        assert!(live);
    }
}
