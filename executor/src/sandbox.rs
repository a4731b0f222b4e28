//! The task directory on disk ([`drover_common::layout`]): root's area (task.json,
//! the status checkpoint status.json, executor.sock, rotated process logs under
//! `logs/`, created on a process's first byte of output) and in it `sandbox/`, the
//! task's working directory (owned by the task user, mode 0700), the only part the
//! task can write. Also who the task runs as.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use drover_common::layout::{self, TaskDir};
use drover_common::wire::{checkpointed_status, ExecutorStatus, ExecutorTask};
use nix::unistd::{Gid, Uid, User};

/// The task directory of a forked executor whose `executor.stderr` is created on its first
/// line ([`defer_stderr`]).
static DEFERRED_STDERR: OnceLock<OwnedFd> = OnceLock::new();
/// Whether [`open_deferred_stderr`] ran.
static STDERR_OPENED: AtomicBool = AtomicBool::new(false);

/// Makes this process create `executor.stderr` in the directory `dir` (the task
/// directory) only when it first writes to stderr ([`diag!`](crate::diag), a panic),
/// and put it on descriptor 2 then; until then descriptor 2 is whatever the caller
/// left there (/dev/null). An executor that has nothing to say costs no file.
pub fn defer_stderr(dir: OwnedFd) {
    if DEFERRED_STDERR.set(dir).is_ok() {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            open_deferred_stderr();
            previous(info)
        }));
    }
}

/// Opens the deferred `executor.stderr` onto descriptor 2, once (see
/// [`defer_stderr`]); nothing when stderr is not deferred. Errors leave stderr as it
/// was: there is nowhere to report them.
pub fn open_deferred_stderr() {
    let Some(dir) = DEFERRED_STDERR.get() else {
        return;
    };
    if STDERR_OPENED.swap(true, Ordering::SeqCst) {
        return;
    }
    crate::sys::open_onto_stderr(
        std::os::fd::AsFd::as_fd(dir),
        c"executor.stderr",
        layout::PRIVATE_FILE_MODE,
    );
}

/// `eprintln!` for the executor: creates a deferred `executor.stderr` first
/// ([`sandbox::defer_stderr`](crate::sandbox::defer_stderr)).
#[macro_export]
macro_rules! diag {
    ($($arg:tt)*) => {{
        $crate::sandbox::open_deferred_stderr();
        eprintln!($($arg)*);
    }};
}

/// The task directory's paths ([`drover_common::layout`]): `dir`, root's, and
/// `work`, its `sandbox/`, the processes' working directory.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The task directory.
    pub dir: TaskDir,
    /// `sandbox/`: the processes' working directory, the task user's.
    pub work: PathBuf,
}

/// Who the processes run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Whether the executor switches to this user (only as root).
    pub switch: bool,
}

/// A sandbox that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("task user `{0}` does not exist on this host; create it or set task.user")]
    NoSuchUser(String),
    #[error("the task would run as root (user `{0}`); both task.allow_root in the spec and --allow-root on the executor must allow that")]
    RootRefused(String),
    #[error("cannot look up user `{user}`: {source}")]
    Lookup { user: String, source: nix::Error },
    #[error("cannot set up {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Layout {
    /// The layout of the task directory at `dir`.
    pub fn new(dir: &Path) -> Layout {
        let dir = TaskDir::new(dir);
        Layout {
            work: dir.sandbox(),
            dir,
        }
    }
    /// The task directory.
    pub fn area(&self) -> &Path {
        self.dir.path()
    }
    /// `task.json`.
    pub fn task_file(&self) -> PathBuf {
        self.dir.task_file()
    }
    /// `status.json`.
    pub fn status_file(&self) -> PathBuf {
        self.dir.status_file()
    }
    /// `executor.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.socket()
    }
    /// `logs/`.
    pub fn logs(&self) -> PathBuf {
        self.dir.logs()
    }
    /// Whether `sandbox/.healthchecksnooze` exists (any entry by that name: it is
    /// never followed).
    pub fn snoozed(&self) -> bool {
        fs::symlink_metadata(self.dir.snooze_file()).is_ok()
    }

    /// Creates the task directory (root's, mode 0711 when root; idempotent) and in it
    /// `sandbox/` for the task user with mode 0700. `sandbox/` is chowned and chmodded
    /// through a descriptor opened without following links, so an existing entry by
    /// that name that is not a directory fails setup instead of being followed.
    /// `logs/` is created by the first log file ([`RotatingLog::open`]): a task whose
    /// processes print nothing costs no log directory and no log files.
    pub fn create(&self, user: &TaskUser) -> Result<(), SandboxError> {
        let area = self.area();
        match fs::DirBuilder::new()
            .mode(layout::ROOT_DIR_MODE)
            .create(area)
        {
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
                .recursive(true)
                .mode(layout::ROOT_DIR_MODE)
                .create(area)
                .map_err(io_err(area))?,
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io_err(area)(e)),
            _ => {}
        }
        // Only root (or, without isolation, the user itself) may write the task
        // directory; a symlink or a file in its place is refused.
        let meta = fs::symlink_metadata(area).map_err(io_err(area))?;
        if !meta.is_dir() {
            return Err(io_err(area)(io::Error::other(
                "the task directory is not a directory",
            )));
        }
        if user.switch && meta.uid() != 0 {
            return Err(io_err(area)(io::Error::other(format!(
                "the task directory is owned by uid {}, not root; it may be an older layout's sandbox: remove it",
                meta.uid()
            ))));
        }
        if meta.mode() & 0o7777 != layout::ROOT_DIR_MODE {
            fs::set_permissions(area, fs::Permissions::from_mode(layout::ROOT_DIR_MODE))
                .map_err(io_err(area))?;
        }
        task_owned_dir(&self.work, user)
    }

    /// Writes a copy of the task spec.
    pub fn write_task(&self, task: &ExecutorTask) -> Result<(), SandboxError> {
        let text = serde_json::to_vec_pretty(task).map_err(|e| SandboxError::Io {
            path: self.task_file(),
            source: e.into(),
        })?;
        // A copy for people and `cleanup`; the agent keeps the original, so no fsync
        // on the way to the first process.
        let tmp = self.task_file().with_extension("json.tmp");
        private_file(false)
            .truncate(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&text))
            .and_then(|()| fs::rename(&tmp, self.task_file()))
            .map_err(io_err(&self.task_file()))
    }

    /// Reads the checkpointed status, if any ([`checkpointed_status`]).
    pub fn read_status(&self) -> Option<ExecutorStatus> {
        checkpointed_status(&fs::read(self.status_file()).ok()?)
    }
}

/// Creates `work` (a directory of the root-owned task directory) for the task user,
/// mode 0700, chowned and chmodded through a descriptor opened without following
/// links: an existing entry by that name that is not a directory fails.
fn task_owned_dir(work: &Path, user: &TaskUser) -> Result<(), SandboxError> {
    {
        match fs::DirBuilder::new()
            .mode(layout::PRIVATE_DIR_MODE)
            .create(work)
        {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io_err(work)(e)),
            _ => {}
        }
        let dir = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(work)
            .map_err(io_err(work))?;
        dir.set_permissions(fs::Permissions::from_mode(layout::PRIVATE_DIR_MODE))
            .map_err(io_err(work))?;
        if user.switch {
            nix::unistd::fchown(
                dir.as_raw_fd(),
                Some(Uid::from_raw(user.uid)),
                Some(Gid::from_raw(user.gid)),
            )
            .map_err(|e| SandboxError::Io {
                path: work.to_path_buf(),
                source: e.into(),
            })?;
        }
        Ok(())
    }
}

/// Options for a file root keeps in the task directory: mode 0600 when created, never
/// through a symlink, closed on exec. Write access (appending when `append`).
fn private_file(append: bool) -> fs::OpenOptions {
    let mut options = fs::OpenOptions::new();
    options
        .create(true)
        .mode(layout::PRIVATE_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if append {
        options.append(true);
    } else {
        options.write(true);
    }
    options
}

/// Above this size the checkpoint file is rewritten with only the current status.
const CHECKPOINT_COMPACT_AT: u64 = 64 * 1024;

/// The task's checkpoint, `status.json` in the task directory: every status the executor reports is
/// first appended to it as one JSON line, through a descriptor kept open, so a task
/// costs one inode for all its checkpoints and no rename. A reader takes the last line
/// that parses ([`checkpointed_status`]): a crash can tear only the line being written,
/// so the file always holds one whole status from before it. Once the file passes
/// [`CHECKPOINT_COMPACT_AT`] (a long-lived service's process and health changes), the
/// current line alone is written to a new file renamed over it.
///
/// What is flushed to the disk ([`Checkpoint::sync`]) is the caller's policy: the
/// runner syncs only a terminal status that no agent has taken (see `Runner::flush`).
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    /// The open file and its length; none before the first append and after a failed
    /// write (the next append then starts a new file, so a torn line is never
    /// continued).
    file: Option<(fs::File, u64)>,
    /// Appended since the last sync.
    unsynced: bool,
    /// The file was replaced since the last sync, so its directory entry is new too.
    renamed: bool,
}

impl Checkpoint {
    /// The checkpoint at `path`; nothing is opened until the first append.
    pub fn new(path: PathBuf) -> Checkpoint {
        Checkpoint {
            path,
            file: None,
            unsynced: false,
            renamed: false,
        }
    }

    /// Appends `status` as one line, in one write.
    pub fn append(&mut self, status: &ExecutorStatus) -> io::Result<()> {
        let mut line = serde_json::to_vec(status)?;
        line.push(b'\n');
        self.append_line(&line)
    }

    /// Appends `line`, one status serialized as JSON and ending in a newline (as the
    /// runner also writes it to stdout), in one write.
    pub fn append_line(&mut self, line: &[u8]) -> io::Result<()> {
        let fits = |len: u64| len + line.len() as u64 <= CHECKPOINT_COMPACT_AT;
        let (mut file, len) = match self.file.take() {
            Some((file, len)) if fits(len) => (file, len),
            Some(_) => (self.replace_file()?, 0),
            // An earlier executor's file (the same task started again) is continued
            // unless it is full or ends in a torn line, which the new line would
            // otherwise continue.
            None => {
                let file = private_file(true).read(true).open(&self.path)?;
                let len = file.metadata()?.len();
                if fits(len) && (len == 0 || ends_in_newline(&file, len)?) {
                    (file, len)
                } else {
                    (self.replace_file()?, 0)
                }
            }
        };
        self.unsynced = true;
        // On an error `file` is dropped: a partial line may be on disk, and the next
        // append starts over in a new file rather than continue it.
        file.write_all(line)?;
        self.file = Some((file, len + line.len() as u64));
        Ok(())
    }

    /// A new, empty file in place of the current one (compaction, or a file a failed
    /// write may have torn): created beside it and renamed over it.
    fn replace_file(&mut self) -> io::Result<fs::File> {
        let tmp = self.path.with_extension("json.tmp");
        let file = private_file(false).truncate(true).open(&tmp)?;
        fs::rename(&tmp, &self.path)?;
        self.renamed = true;
        Ok(file)
    }

    /// Makes what was appended durable (`fdatasync`, and the directory after a
    /// replacement); nothing when it already is.
    pub fn sync(&mut self) -> io::Result<()> {
        if !self.unsynced && !self.renamed {
            return Ok(());
        }
        match &self.file {
            Some((file, _)) => file.sync_data()?,
            // A failed write dropped the file: sync what is on disk under the name.
            None => fs::File::open(&self.path)?.sync_data()?,
        }
        if std::mem::take(&mut self.renamed) {
            if let Some(dir) = self.path.parent() {
                fs::File::open(dir)?.sync_all()?;
            }
        }
        self.unsynced = false;
        Ok(())
    }
}

fn ends_in_newline(file: &fs::File, len: u64) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

/// Finds the task user: `task.user`, else the role. As root the executor switches to
/// it and refuses uid 0 unless both `spec_allows_root` and `flag_allows_root`. Not as
/// root, processes run as the executor's own user.
pub fn resolve_user(
    task: &ExecutorTask,
    spec_allows_root: bool,
    flag_allows_root: bool,
) -> Result<TaskUser, SandboxError> {
    let name = task.task.user.as_deref().unwrap_or(&task.role);
    let me = Uid::current();
    if !me.is_root() {
        return Ok(TaskUser {
            name: User::from_uid(me)
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| me.to_string()),
            uid: me.as_raw(),
            gid: Gid::current().as_raw(),
            groups: Vec::new(),
            switch: false,
        });
    }
    if let Some(found) = crate::users::lookup(Path::new("/etc"), name) {
        if found.uid == 0 && !(spec_allows_root && flag_allows_root) {
            return Err(SandboxError::RootRefused(name.to_string()));
        }
        return Ok(TaskUser {
            name: name.to_string(),
            uid: found.uid,
            gid: found.gid,
            groups: found.groups,
            switch: true,
        });
    }
    let user = User::from_name(name)
        .map_err(|source| SandboxError::Lookup {
            user: name.to_string(),
            source,
        })?
        .ok_or_else(|| SandboxError::NoSuchUser(name.to_string()))?;
    if user.uid.is_root() && !(spec_allows_root && flag_allows_root) {
        return Err(SandboxError::RootRefused(name.to_string()));
    }
    let cname = std::ffi::CString::new(name).map_err(|_| SandboxError::NoSuchUser(name.into()))?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid)
        .map(|g| g.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_else(|_| vec![user.gid.as_raw()]);
    Ok(TaskUser {
        name: name.to_string(),
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        groups,
        switch: true,
    })
}

fn open_append(path: &Path) -> io::Result<fs::File> {
    private_file(true).open(path)
}

/// A log file that rotates: `<name>` then `<name>.1` ... `<name>.<keep>`.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    file: fs::File,
    size: u64,
    max_bytes: u64,
    keep: u32,
}

impl RotatingLog {
    /// Opens (appending to) `path`, creating its directory (mode 0700) when that is
    /// missing. The runner opens a log on the process's first byte of output, so a
    /// missing log file means an empty log.
    pub fn open(path: PathBuf, max_bytes: u64, keep: u32) -> io::Result<RotatingLog> {
        let file = match open_append(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(dir)?;
                }
                open_append(&path)?
            }
            other => other?,
        };
        let size = file.metadata()?.len();
        Ok(RotatingLog {
            path,
            file,
            size,
            max_bytes: max_bytes.max(1),
            keep,
        })
    }

    /// Appends `data`, rotating first when it would overflow the current file.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + data.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(data)?;
        self.size += data.len() as u64;
        Ok(())
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file.set_len(0)?;
            self.size = 0;
            return Ok(());
        }
        let _ = fs::remove_file(self.rotated(self.keep));
        for n in (1..self.keep).rev() {
            let _ = fs::rename(self.rotated(n), self.rotated(n + 1));
        }
        fs::rename(&self.path, self.rotated(1))?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::state::TaskState;

    fn status(seq: u64, state: TaskState, message: &str) -> ExecutorStatus {
        ExecutorStatus {
            seq,
            task_id: "t1".into(),
            state,
            exit_reason: None,
            message: message.into(),
            timestamp_ms: 1,
            executor_pid: 1,
            processes: Vec::new(),
            escalation: None,
        }
    }

    /// A task directory in a temp dir.
    fn sandbox_with_area() -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        fs::create_dir_all(layout.area()).unwrap();
        (dir, layout)
    }

    fn inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn checkpoints_append_to_one_file_and_the_last_is_read() {
        let (_dir, layout) = sandbox_with_area();
        let mut checkpoint = Checkpoint::new(layout.status_file());
        checkpoint
            .append(&status(1, TaskState::Starting, &"x".repeat(200)))
            .unwrap();
        let first = inode(&layout.status_file());
        let running = status(2, TaskState::Running, "up");
        checkpoint.append(&running).unwrap();
        assert_eq!(layout.read_status(), Some(running));
        let done = status(3, TaskState::Finished, "done");
        checkpoint.append(&done).unwrap();
        checkpoint.sync().unwrap();
        assert_eq!(layout.read_status(), Some(done));
        assert_eq!(inode(&layout.status_file()), first, "no new inode");
        let names: Vec<_> = fs::read_dir(layout.area()).unwrap().collect();
        assert_eq!(names.len(), 1, "no spare or temp file");
    }

    #[test]
    fn a_full_checkpoint_is_compacted_to_the_current_status() {
        let (_dir, layout) = sandbox_with_area();
        let mut checkpoint = Checkpoint::new(layout.status_file());
        let mut last = None;
        for seq in 1..=400 {
            let s = status(seq, TaskState::Running, &"y".repeat(300));
            checkpoint.append(&s).unwrap();
            last = Some(s);
        }
        checkpoint.sync().unwrap();
        let len = fs::metadata(layout.status_file()).unwrap().len();
        assert!(len <= CHECKPOINT_COMPACT_AT, "{len} bytes");
        assert_eq!(layout.read_status(), last);
    }

    #[test]
    fn a_new_executor_does_not_continue_a_torn_checkpoint() {
        let (_dir, layout) = sandbox_with_area();
        // An earlier executor crashed while appending its second line.
        let starting = serde_json::to_string(&status(1, TaskState::Starting, "")).unwrap();
        fs::write(
            layout.status_file(),
            format!("{starting}\n{{\"seq\":2,\"ta"),
        )
        .unwrap();
        assert_eq!(layout.read_status().map(|s| s.seq), Some(1));
        let mut checkpoint = Checkpoint::new(layout.status_file());
        let lost = status(2, TaskState::Lost, "again");
        checkpoint.append(&lost).unwrap();
        assert_eq!(layout.read_status(), Some(lost));
    }

    fn me() -> TaskUser {
        TaskUser {
            name: "me".into(),
            uid: Uid::current().as_raw(),
            gid: Gid::current().as_raw(),
            groups: vec![],
            switch: false,
        }
    }

    #[test]
    fn create_makes_a_private_task_dir_around_the_tasks_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(&dir.path().join("root/t1"));
        layout.create(&me()).unwrap();
        layout.create(&me()).unwrap();
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(layout.area()), 0o711);
        assert_eq!(mode(&layout.work), 0o700);
        assert_eq!(layout.work, dir.path().join("root/t1/sandbox"));
    }

    #[test]
    fn a_symlink_in_place_of_the_sandbox_or_task_dir_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).unwrap();
        let layout = Layout::new(&dir.path().join("t1"));
        fs::create_dir(layout.area()).unwrap();
        std::os::unix::fs::symlink(&target, &layout.work).unwrap();
        assert!(layout.create(&me()).is_err());
        let linked = Layout::new(&dir.path().join("t2"));
        std::os::unix::fs::symlink(&target, linked.area()).unwrap();
        assert!(linked.create(&me()).is_err());
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755, "the link's target was not chmodded");
        assert!(!target.join("sandbox").exists());
    }

    #[test]
    fn roots_files_are_never_opened_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"keep").unwrap();
        let log = dir.path().join("p.stdout");
        std::os::unix::fs::symlink(&outside, &log).unwrap();
        assert!(RotatingLog::open(log, 100, 1).is_err());
        let checkpoint = dir.path().join("status.json");
        std::os::unix::fs::symlink(&outside, &checkpoint).unwrap();
        assert!(Checkpoint::new(checkpoint)
            .append(&status(1, TaskState::Running, ""))
            .is_err());
        assert_eq!(fs::read(&outside).unwrap(), b"keep");
    }

    #[test]
    fn logs_rotate_and_keep_n_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.stdout");
        let mut log = RotatingLog::open(path.clone(), 10, 2).unwrap();
        for chunk in ["aaaaaaaa", "bbbbbbbb", "cccccccc", "dddddddd"] {
            log.write(chunk.as_bytes()).unwrap();
        }
        assert_eq!(fs::read_to_string(&path).unwrap(), "dddddddd");
        assert_eq!(
            fs::read_to_string(dir.path().join("p.stdout.1")).unwrap(),
            "cccccccc"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("p.stdout.2")).unwrap(),
            "bbbbbbbb"
        );
        assert!(!dir.path().join("p.stdout.3").exists());
    }

    #[test]
    fn a_log_creates_its_missing_directory_private() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("t/logs");
        let mut log = RotatingLog::open(logs.join("p.stderr"), 100, 1).unwrap();
        log.write(b"x").unwrap();
        assert_eq!(fs::read_to_string(logs.join("p.stderr")).unwrap(), "x");
        let mode = fs::metadata(&logs).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn status_checkpoint_round_trips() {
        let (_dir, layout) = sandbox_with_area();
        let status = ExecutorStatus {
            seq: 3,
            task_id: "t".into(),
            state: TaskState::Running,
            exit_reason: None,
            message: "m".into(),
            timestamp_ms: 1,
            executor_pid: 2,
            processes: vec![],
            escalation: None,
        };
        let mut checkpoint = Checkpoint::new(layout.status_file());
        checkpoint.append(&status).unwrap();
        assert_eq!(layout.read_status(), Some(status));
    }
}
