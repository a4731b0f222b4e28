#!/usr/bin/env bash
# Where a task's CPU goes (issue 33): the throughput run of tests/benches/e2e.rs
# (BENCH_TASKS one-shot `true` tasks, default 5000, on 4 agents over mTLS with
# tokens, like scripts/bench-throughput.sh) under `perf record -a` with DWARF call
# graphs, then the samples split by process (master, agents, the executors' fork
# server, executors, the `true` tasks, the rest) and, within each, by what the call
# chain is doing.
#
#   scripts/profile-throughput.sh BIN_DIR     (as root; BIN_DIR: release binaries
#                                              with symbols, e.g. a build of
#                                              scripts/release.sh: profile.release
#                                              has debug = 1)
#
# The run gets a fresh journal-less ext4 as TMPDIR, as in bench-throughput.sh. The
# event is cpu-clock (a sample's period is CPU time in ns), PERF_FREQ samples/s per
# CPU (default 499), 8 KiB of stack per sample. perf also sees the cluster's start
# and stop, which the harness's own CPU figures (printed first) leave out.
# BENCH_HARNESS names an e2e bench binary to use instead of building one.
# Everything is kept in PROFILE_DIR (default target/profile-throughput/<time>):
# perf.data, the harness output, and report.txt, also printed.
#
# The split: each sample goes to the first of these that any frame of its chain
# matches (so JSON written inside the change stream's code counts as change stream;
# a malloc inside JSON as JSON): fsync, SQLite, token check, TLS, change stream,
# JSON, HTTP, process spawn and exit (clone, exec, exit, wait), page faults,
# cgroups, files, sockets, scheduling, tokio, allocator, dynamic loading, Drover's
# own code, other. The patterns are in the Python below. Each process also gets its
# CPU by outermost system call and its hottest leaf functions.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib-bench.sh
. scripts/lib-bench.sh

die() {
  echo "profile-throughput: $*" >&2
  exit 1
}
[ $# -eq 1 ] || die "usage: scripts/profile-throughput.sh BIN_DIR"
[ "$(id -u)" -eq 0 ] || die "needs root (the e2e bench creates task users and cgroups)"
bin=$(cd "$1" && pwd)
for b in drover drover-master drover-agent drover-executor; do
  [ -x "$bin/$b" ] || die "no $bin/$b"
done
command -v perf >/dev/null 2>&1 || die "needs perf (Debian: linux-perf)"
tasks=${BENCH_TASKS:-5000}
freq=${PERF_FREQ:-499}
out=${PROFILE_DIR:-$root/target/profile-throughput/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

harness=$(bench_harness) || die "no harness"

trap bench_cleanup EXIT
trap 'exit 130' INT TERM
bench_fresh_tmp
mnt=$bench_mnt

load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "==> $tasks tasks over mTLS under perf (binaries $bin, load $load)" >&2
perf record -q -a -e cpu-clock -F "$freq" --call-graph dwarf,8192 -o "$out/perf.data" -- \
  env TMPDIR="$mnt" DROVER_BIN_DIR="$bin" BENCH_ONLY=throughput BENCH_TLS=1 \
  BENCH_TASKS="$tasks" "$harness" >"$out/harness.log" 2>&1 ||
  {
    tail -n 20 "$out/harness.log" >&2
    die "the run failed (full output: $out/harness.log)"
  }
bench_cleanup
grep -q " 0 FAILED/LOST" "$out/harness.log" || die "failed or lost tasks ($out/harness.log)"

echo "==> perf script (unwinding the call chains; this takes a while)" >&2
perf script -i "$out/perf.data" --show-task-events --no-inline \
  -F comm,pid,tid,period,event,ip,sym,dso 2>/dev/null >"$out/perf.txt"

{
  echo "build: $bin"
  echo "machine: $(nproc) CPUs, kernel $(uname -r); 1/5/15-min load at the start: $load"
  grep -E 'tasks/s|^CPU:' "$out/harness.log"
  echo
  python3 - "$out/perf.txt" "$tasks" <<'EOF'
import collections, re, sys

path, tasks = sys.argv[1], int(sys.argv[2])
# First match wins, in this order, over all the frames of a sample's chain.
CATEGORIES = [
    ("fsync", r"fsync|fdatasync|jbd2|blkdev_issue_flush"),
    ("SQLite", r"sqlite3|rusqlite"),
    ("token check", r"tokens::Tokens::authenticate|auth::secret_matches|auth::hash_secret|auth::parse_bearer|sha2::|sha256"),
    ("TLS", r"rustls|ring_core|\bring::|tokio_rustls"),
    ("change stream", r"drover_master::core::changes|changes_since|longpoll"),
    ("JSON", r"serde"),
    ("HTTP", r"hyper|\bh2::|axum|reqwest|httparse|\bhttp::|tower"),
    ("spawn/exit", r"copy_process|kernel_clone|sys_clone|sys_vfork|sys_execve|do_execveat|bprm_execve|load_elf_binary|begin_new_exec|do_exit\b|do_group_exit|exit_mmap|mmput|sys_wait4|sys_waitid|do_wait|release_task|wait_consider_task"),
    ("page faults", r"page_fault|handle_mm_fault|do_user_addr_fault"),
    ("cgroups", r"cgroup|css_"),
    ("files", r"ext4|vfs_|do_sys_open|path_openat|sys_openat|sys_unlink|sys_rename|sys_mkdir|sys_rmdir|sys_newfstatat|sys_statx|sys_getdents|sys_close|d_alloc|dput|iput|evict"),
    ("sockets", r"tcp_|unix_stream|sock_|sys_sendto|sys_recvfrom|sys_sendmsg|sys_recvmsg|sys_accept|sys_connect|inet_|net_rx|__napi|ip_finish|ip_rcv"),
    ("scheduling", r"futex|epoll|__schedule|try_to_wake_up|sys_sched_yield|do_nanosleep|hrtimer"),
    ("tokio", r"tokio::"),
    ("allocator", r"malloc|\bfree\b|realloc|cfree|_int_free|mallocx|jemalloc"),
    ("dynamic loading", r"_dl_|ld-linux|do_lookup_x"),
    ("Drover code", r"drover_"),
]
CATEGORIES = [(name, re.compile(p)) for name, p in CATEGORIES]

role = {}  # tgid -> role
def role_of_comm(comm, pid, parent_role):
    if comm.startswith("drover-master"): return "master"
    if comm.startswith("drover-agent"): return "agents"
    if comm.startswith("drover-execut"): return "executor fork server" if parent_role == "agents" else "executors"
    if comm == "true": return "tasks (true)"
    if "e2e" in comm: return "harness"
    return None

comm_re = re.compile(r"PERF_RECORD_COMM( exec)?: (.*):(\d+)/(\d+)")
fork_re = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")
head_re = re.compile(r"^(.*?)\s+(\d+)/(\d+)\s+(\d+)\s+(\S+):\s*$")
parent = {}
time_by = collections.Counter()
cat_by = collections.defaultdict(collections.Counter)
sym_by = collections.defaultdict(collections.Counter)
sys_by = collections.defaultdict(collections.Counter)
sys_re = re.compile(r"__(?:x64|do)_sys_(\w+)")
cur = None
frames = []

def flush():
    global cur, frames
    if cur is None:
        return
    pid, comm, period = cur
    r = role.get(pid)
    if r is None:
        r = "idle" if pid == 0 else ("kernel threads" if comm.startswith(("kworker", "ksoftirq", "rcu", "migration", "kswapd", "jbd2", "loop")) else "other")
    time_by[r] += period
    syms = [f for f in frames]
    for name, pat in CATEGORIES:
        if any(pat.search(s) for s in syms):
            cat_by[r][name] += period
            break
    else:
        cat_by[r]["other"] += period
    if syms:
        sym_by[r][syms[0]] += period
    for s_ in reversed(syms):
        m_ = sys_re.search(s_)
        if m_:
            sys_by[r][m_.group(1)] += period
            break
    else:
        sys_by[r]["(user space, page faults, interrupts)"] += period
    cur, frames = None, []

with open(path, errors="replace") as f:
    for line in f:
        if "PERF_RECORD_" in line:
            flush()
            m = fork_re.search(line)
            if m:
                child, ctid, par = int(m.group(1)), int(m.group(2)), int(m.group(3))
                if child == ctid and child != par:
                    parent[child] = par
                    if par in role and child not in role:
                        # The fork server's children are the executors.
                        r = role[par]
                        role[child] = "executors" if r == "executor fork server" else r
                continue
            m = comm_re.search(line)
            if m and m.group(1):
                pid = int(m.group(3))
                r = role_of_comm(m.group(2), pid, role.get(parent.get(pid)))
                if r:
                    role[pid] = r
            continue
        if not line.strip():
            flush()
            continue
        if line[0] in " \t":
            parts = line.split(None, 1)
            if len(parts) == 2:
                frames.append(re.sub(r"\+0x[0-9a-f]+", "", parts[1].strip()))
            continue
        flush()
        m = head_re.match(line.rstrip("\n"))
        if m:
            cur = (int(m.group(2)), m.group(1).strip(), int(m.group(4)))
flush()

total = sum(v for k, v in time_by.items() if k != "idle")
print(f"perf samples (cpu-clock), whole run including the cluster's start and stop: "
      f"{total/1e9:.2f} s of CPU busy, idle {time_by['idle']/1e9:.2f} s")
print()
print("| process | CPU s | ms per task | share of busy CPU |")
print("| --- | --- | --- | --- |")
for r, v in sorted(time_by.items(), key=lambda kv: -kv[1]):
    if r == "idle":
        continue
    print(f"| {r} | {v/1e9:.2f} | {v/1e6/tasks:.3f} | {100*v/total:.1f} % |")
for r, v in sorted(time_by.items(), key=lambda kv: -kv[1]):
    if r == "idle" or v < total * 0.01:
        continue
    print()
    print(f"{r}: {v/1e6/tasks:.3f} ms per task")
    for name, c in cat_by[r].most_common():
        if c >= v * 0.01:
            print(f"  {name:16s} {100*c/v:5.1f} %  {c/1e6/tasks:.3f} ms/task")
    print("  by system call (the outermost one in the chain):")
    for s_, c in sys_by[r].most_common(8):
        print(f"    {100*c/v:5.1f} %  {c/1e6/tasks:.3f} ms/task  {s_}")
    print("  top leaf functions:")
    for s, c in sym_by[r].most_common(12):
        print(f"    {100*c/v:5.1f} %  {s[:110]}")
EOF
} | tee "$out/report.txt"
