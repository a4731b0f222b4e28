#!/usr/bin/env bash
# Checks that a test run left nothing behind (scripts/test.sh runs it around the tests):
#   scripts/leftovers.sh baseline FILE   records what exists before the run
#   scripts/leftovers.sh check FILE      fails (exit 1), naming each one, if anything the
#                                        run started is still there, then kills the
#                                        processes it named and removes the task cgroups
#                                        (--keep: leaves them); directories, mounts and
#                                        links it only names
# What counts as the run's (and was not in the baseline):
#   - a process whose executable is in this checkout's target/ (a daemon, an executor,
#     a test binary; build scripts excepted);
#   - a task of a test cluster: a process whose working directory is (or was, before it
#     was deleted) in a /tmp/drover-* directory, or that is in a task cgroup
#     (`.../drover/<task>`, `.../drover-t*`), unless it belongs to another checkout's
#     cluster (an ancestor is a drover-executor from elsewhere, or its directory's
#     `.drover-checkout` names another checkout);
#   - neither when it works in a directory of the baseline or descends from one of this
#     checkout's daemons of the baseline (your own `drover dev`, started before the
#     run, starting a task meanwhile);
#   - a /tmp/drover-* directory still there 2 s later (not one another checkout's
#     harness marked or whose daemons run from another target/), a task cgroup
#     still there 2 s later, a mount under /tmp/drover-* or /run/netns/drv*, a
#     network link drv*. With DROVER_KEEP_TEST_DIRS set (the harnesses then keep
#     their directories), directories are listed, not failed on.
# On a machine where another checkout runs tests at the same time, its unmarked
# directories, empty cgroups and namespaces may be named too.
# Where it looks can be moved (its own test, tests/tests/leftovers.rs, does):
# LEFTOVERS_ROOT (the checkout), LEFTOVERS_TMP (/tmp), LEFTOVERS_CGROUP (/sys/fs/cgroup),
# LEFTOVERS_NETNS (/run/netns), LEFTOVERS_LINKS (the link name prefix, drv); with
# another LEFTOVERS_CGROUP, processes' own cgroups are not looked at.
set -euo pipefail

root=$(cd "${LEFTOVERS_ROOT:-$(dirname "$0")/..}" && pwd -P)
tmp=${LEFTOVERS_TMP:-/tmp}
cgroup_root=${LEFTOVERS_CGROUP:-/sys/fs/cgroup}
netns=${LEFTOVERS_NETNS:-/run/netns}
links=${LEFTOVERS_LINKS:-drv}
target="$root/target/"

usage() {
  echo "usage: scripts/leftovers.sh baseline|check FILE [--keep]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
mode=$1
file=$2
keep=no
[ "${3:-}" = "--keep" ] && keep=yes

# The start time of process $1 (field 22 of /proc/PID/stat), "" if it is gone.
start_time() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
  local rest=${stat##*) }
  # shellcheck disable=SC2086
  set -- $rest
  echo "${20}"
}

# Whether process $1 is a zombie (already dead, waiting for its parent).
zombie() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
  local rest=${stat##*) }
  [ "${rest:0:1}" = Z ]
}

# Every task cgroup under the cgroup root: `.../drover/<task>` and `.../drover-t*`
# (the fault tests' per-cluster parents), at the root (v2), in each controller's
# hierarchy (v1) or inside a delegated cgroup.
task_cgroups() {
  [ -d "$cgroup_root" ] || return 0
  find "$cgroup_root" -mindepth 1 -maxdepth 5 -type d \
    \( -path '*/drover/*' -o -name 'drover-t*' \) -prune -print 2>/dev/null | sort
}

# Mount points of the run's kinds.
mounts() {
  awk '{print $5}' /proc/self/mountinfo |
    grep -E "^($tmp/drover-|$netns/$links)" | sort -u || true
}

network_links() {
  if command -v ip >/dev/null 2>&1; then
    ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
      grep -E "^$links" | sort -u || true
  fi
}

tmp_dirs() {
  find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'drover-*' 2>/dev/null | sort
}

if [ "$mode" = baseline ]; then
  {
    for p in /proc/[0-9]*; do
      pid=${p#/proc/}
      st=$(start_time "$pid")
      [ -n "$st" ] || continue
      echo "proc $pid $st"
      # This checkout's daemons already running (your own `drover dev`): what
      # they start during the run is theirs.
      exe=$(readlink "$p/exe" 2>/dev/null || true)
      case "$exe" in
      "$target"*/build/*) ;;
      "$target"*) echo "ours $pid $st" ;;
      esac
    done
    tmp_dirs | sed 's/^/dir /'
    task_cgroups | sed 's/^/cgroup /'
    mounts | sed 's/^/mount /'
    network_links | sed 's/^/link /'
  } >"$file"
  exit 0
fi
[ "$mode" = check ] || usage
[ -f "$file" ] || {
  echo "leftovers: no baseline $file (run: scripts/leftovers.sh baseline $file)" >&2
  exit 2
}

declare -A known=()
while read -r kind a b; do
  case $kind in
  proc | ours) known["$kind $a $b"]=1 ;;
  *) known["$kind $a"]=1 ;;
  esac
done <"$file"

baseline_dirs=()
while read -r kind a _; do
  [ "$kind" = dir ] && baseline_dirs+=("$a")
done <"$file"

# Whether process $1 is in the baseline.
old_process() {
  local st
  st=$(start_time "$1")
  [ -n "${known["proc $1 $st"]:-}" ]
}

# Whether path $1 is inside a baseline directory.
in_baseline_dir() {
  local d
  for d in "${baseline_dirs[@]}"; do
    case "$1" in "$d" | "$d"/*) return 0 ;; esac
  done
  return 1
}

# The /tmp/drover-* directory path $1 is in ("" if none), " (deleted)" cut off.
cluster_dir_of() {
  local path=${1% (deleted)}
  case "$path" in
  "$tmp"/drover-*)
    local rest=${path#"$tmp"/}
    echo "$tmp/${rest%%/*}"
    ;;
  esac
}

# Whether directory $1 was marked by another checkout's harness.
other_checkout_dir() {
  local marker="$1/.drover-checkout"
  [ -f "$marker" ] && [ "$(cat "$marker" 2>/dev/null)" != "$root" ]
}

# The parent of process $1 ("" if gone).
parent_of() {
  local key value
  while read -r key value; do
    if [ "$key" = PPid: ]; then
      echo "$value"
      return
    fi
  done <"/proc/$1/status" 2>/dev/null
}

# Whose process $1 is, by its ancestors: `baseline` when one is a daemon of this
# checkout that ran before the run (your own `drover dev` starting a task), `other`
# when one is a drover-executor from elsewhere than this checkout's target/ (another
# checkout's cluster, an installed agent), else "".
lineage() {
  local pid=$1 exe ppid st
  for _ in $(seq 1 24); do
    ppid=$(parent_of "$pid")
    [ -n "$ppid" ] && [ "$ppid" -gt 1 ] || return 0
    pid=$ppid
    st=$(start_time "$pid")
    if [ -n "${known["ours $pid $st"]:-}" ]; then
      echo baseline
      return
    fi
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    case "$exe" in
    "$target"*) return 0 ;;
    */drover-executor)
      echo other
      return
      ;;
    esac
  done
}

command_of() {
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-200 || true
}

found=()
kill_list=()
self=$$
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = "$self" ] && continue
  [ -r "$p/stat" ] || continue
  old_process "$pid" && continue
  zombie "$pid" && continue
  exe=$(readlink "$p/exe" 2>/dev/null || true)
  cwd=$(readlink "$p/cwd" 2>/dev/null || true)
  why=""
  # Started meanwhile by what ran before the run, or working where it did.
  in_baseline_dir "${cwd% (deleted)}" && continue
  lineage=$(lineage "$pid")
  [ "$lineage" = baseline ] && continue
  case "$exe" in
  "$target"*/build/*) ;;
  "$target"*) why="runs ${exe#"$root"/}" ;;
  esac
  if [ -z "$why" ] && [ "$lineage" != other ]; then
    dir=$(cluster_dir_of "$cwd")
    in_task_cgroup=no
    if [ "$cgroup_root" = /sys/fs/cgroup ] && grep -qE ':/(.*/)?(drover/[^/]+|drover-t[^/]*)(/|$)' "$p/cgroup" 2>/dev/null; then
      in_task_cgroup=yes
    fi
    if [ -n "$dir" ] || [ "$in_task_cgroup" = yes ]; then
      if [ -n "$dir" ] && other_checkout_dir "$dir"; then
        :
      elif [ -n "$dir" ]; then
        why="a test cluster's task (working in $cwd)"
      else
        why="in a task cgroup ($(grep -m1 -oE '(drover/[^/]+|drover-t[^/]*)' "$p/cgroup" 2>/dev/null))"
      fi
    fi
  fi
  if [ -n "$why" ]; then
    found+=("process $pid, $why: $(command_of "$pid")")
    kill_list+=("$pid")
  fi
done

# Whether a daemon of another checkout (run from another target/) names a path in
# directory $1 on its command line: that checkout's cluster is still running there.
used_by_other_checkout() {
  local p exe
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case "$exe" in
    "$target"*) continue ;;
    */target/*) ;;
    *) continue ;;
    esac
    if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -q "^$1"; then
      return 0
    fi
  done
  return 1
}

new_dirs=()
while read -r d; do
  [ -n "$d" ] && [ -z "${known["dir $d"]:-}" ] && new_dirs+=("$d")
done < <(tmp_dirs)
if [ ${#new_dirs[@]} -gt 0 ]; then
  # One another run is just removing goes away meanwhile.
  sleep 2
  for d in "${new_dirs[@]}"; do
    [ -d "$d" ] || continue
    other_checkout_dir "$d" && continue
    used_by_other_checkout "$d" && continue
    if [ -n "${DROVER_KEEP_TEST_DIRS:-}" ]; then
      echo "leftovers: kept as DROVER_KEEP_TEST_DIRS asks: $d"
      continue
    fi
    found+=("directory $d")
  done
fi

new_cgroups=()
cgroup_list=()
while read -r c; do
  [ -n "$c" ] && [ -z "${known["cgroup $c"]:-}" ] && new_cgroups+=("$c")
done < <(task_cgroups)
if [ ${#new_cgroups[@]} -gt 0 ]; then
  # A cgroup another run is just removing goes away meanwhile.
  sleep 2
  for c in "${new_cgroups[@]}"; do
    [ -d "$c" ] || continue
    # One holding tasks of what ran before the run, or of another checkout, is theirs
    # (its processes were skipped above).
    owned=yes
    while read -r pid; do
      [ -n "$pid" ] || continue
      if old_process "$pid" || [ "$(lineage "$pid")" != "" ] ||
        in_baseline_dir "$(readlink "/proc/$pid/cwd" 2>/dev/null || true)"; then
        owned=no
      fi
    done < <(cat "$c/cgroup.procs" 2>/dev/null)
    if [ "$owned" = yes ]; then
      found+=("cgroup $c")
      cgroup_list+=("$c")
    fi
  done
fi

while read -r m; do
  [ -n "$m" ] && [ -z "${known["mount $m"]:-}" ] && found+=("mount $m")
done < <(mounts)
while read -r l; do
  [ -n "$l" ] && [ -z "${known["link $l"]:-}" ] && found+=("network link $l")
done < <(network_links)

if [ ${#found[@]} -eq 0 ]; then
  echo "leftovers: nothing left behind"
  exit 0
fi
echo "leftovers: the run left these behind:" >&2
for f in "${found[@]}"; do
  echo "  $f" >&2
done
if [ ${#kill_list[@]} -gt 0 ]; then
  if [ "$keep" = yes ]; then
    echo "leftovers: processes kept (--keep)" >&2
  else
    kill -KILL "${kill_list[@]}" 2>/dev/null || true
    echo "leftovers: killed the processes above" >&2
  fi
fi
if [ "$keep" = no ] && [ ${#cgroup_list[@]} -gt 0 ]; then
  # Empty once their processes are gone (the kernel may take a moment).
  sleep 0.5
  for c in "${cgroup_list[@]}"; do
    rmdir "$c" 2>/dev/null || true
  done
  echo "leftovers: removed the cgroups above that were empty" >&2
fi
exit 1
