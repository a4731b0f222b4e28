#!/usr/bin/env bash
# Paired throughput benchmark of two builds (issue 33): N one-shot `true` tasks on 4
# local agents over mTLS with tokens (the throughput part of tests/benches/e2e.rs,
# BENCH_TLS=1), run alternately against the release binaries of BASE_REF and of
# NEW_REF, ROUNDS times, with one table at the end.
#
#   scripts/bench-throughput.sh [BASE_REF] [NEW_REF]     (as root)
#
# BASE_REF defaults to the merge base with main; NEW_REF to HEAD, or to the working
# tree when tracked files have uncommitted changes. Each ref's release binaries are
# built once into target/bench-refs/<short-hash>/release (scripts/release.sh of that
# ref, in a temporary `git worktree` so the caller's checkout is untouched; a finished
# build, marked by target/bench-refs/<short-hash>/.built, is reused). The working tree
# builds into target/bench-refs/worktree (cargo rebuilds what changed).
#
# The harness (the e2e bench binary) comes from the checkout the script runs in, built
# in the dev profile: it only submits the job and polls the master every 50 ms, and the
# same harness drives both builds. Round k runs base then new when k is odd, new then
# base when k is even. Each run gets a fresh journal-less ext4 on a loop file as TMPDIR
# (the cluster's data dirs and sandboxes), because ext4 slows file creation after the
# previous run freed ~20,000 inodes nearby (docs/agent.md, "Measured").
#
# Environment: ROUNDS (default 3), BENCH_TASKS (default 5000), BENCH_HARNESS (an e2e
# bench binary to use instead of building one), BASE_BIN / NEW_BIN (a directory of
# release binaries to run instead of building that side's ref, labelled BASE_LABEL /
# NEW_LABEL in the table; e.g. one build with another drover-executor copied in), BENCH_FRESH_FS=0 to run
# in the ordinary TMPDIR instead (then wait >= 5.5 min between runs), BENCH_LOG_DIR
# (default target/bench-throughput/<date>) for every run's full output and a `summary`
# file (base, new, ratios, median_ratio; one "key value" a line).
#
# Slurm is an optional third column when `sbatch` is installed and `scontrol ping`
# answers UP: the same number of `true` jobs as job arrays, submit -> squeue empty,
# after the two Drover runs of each round. `scripts/slurm.sh start` sets up the
# tuned one-node Slurm it was measured with (docs/master.md, "Measured").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib-bench.sh
. scripts/lib-bench.sh

die() {
  echo "bench-throughput: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (the e2e bench creates task users and cgroups)"
rounds=${ROUNDS:-3}
tasks=${BENCH_TASKS:-5000}
fresh_fs=${BENCH_FRESH_FS:-1}
case $rounds in '' | *[!0-9]* | 0) die "ROUNDS must be a positive integer, got '$rounds'" ;; esac
case $tasks in '' | *[!0-9]* | 0) die "BENCH_TASKS must be a positive integer, got '$tasks'" ;; esac

short() {
  git rev-parse --verify --quiet "$1^{commit}" >/dev/null || die "not a commit: '$1'"
  git rev-parse --short=7 "$1^{commit}"
}

if [ $# -ge 1 ] && [ -n "$1" ]; then
  base=$(short "$1")
else
  base=$(git merge-base HEAD main) || die "no merge base with main; name BASE_REF"
  base=$(short "$base")
fi
if [ $# -ge 2 ] && [ -n "$2" ]; then
  new=$(short "$2")
elif [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  new=worktree
else
  new=$(short HEAD)
fi
[ "$base" != "$new" ] || die "BASE_REF and NEW_REF are the same commit ($base)"

# Builds ref $1 (a short hash, or `worktree`) unless a finished build is there; prints
# the directory holding its binaries.
build() {
  local ref=$1 out=$root/target/bench-refs/$1 src
  if [ "$ref" = worktree ]; then
    echo "==> building the working tree into $out (release, nice -n 10)" >&2
    CARGO_TARGET_DIR=$out nice -n 10 sh scripts/release.sh >&2
  elif [ -e "$out/.built" ]; then
    echo "==> $ref: reusing the build in $out" >&2
  else
    src=$(mktemp -d "${TMPDIR:-/tmp}/drover-bench-src-$ref.XXXXXX")
    echo "==> building $ref into $out (release, nice -n 10; sources in $src)" >&2
    git worktree add --detach --quiet "$src/tree" "$ref" >&2
    mkdir -p "$out"
    # Refs before scripts/protoc (e901ecc) needed a system protoc for etcd-client's
    # build script: give them this checkout's (a PROTOC already set wins).
    if ! (cd "$src/tree" && PROTOC=${PROTOC:-$root/scripts/protoc} CARGO_TARGET_DIR=$out \
      nice -n 10 sh scripts/release.sh) >&2; then
      git worktree remove --force "$src/tree" || true
      rm -rf "$src"
      die "the release build of $ref failed"
    fi
    git worktree remove --force "$src/tree"
    rm -rf "$src"
    echo "$ref" >"$out/.built"
  fi
  for b in drover drover-master drover-agent drover-executor; do
    [ -x "$out/release/$b" ] || die "$ref: no $out/release/$b after the build"
  done
  echo "$out/release"
}

if [ -n "${BASE_BIN:-}" ]; then
  base_bin=$(cd "$BASE_BIN" && pwd) base=${BASE_LABEL:-$base}
else
  base_bin=$(build "$base")
fi
if [ -n "${NEW_BIN:-}" ]; then
  new_bin=$(cd "$NEW_BIN" && pwd) new=${NEW_LABEL:-$new}
else
  new_bin=$(build "$new")
fi

harness=$(bench_harness) || die "no harness"

slurm=0
if command -v sbatch >/dev/null 2>&1 && scontrol ping 2>/dev/null | grep -q UP; then
  slurm=1
fi

logs=${BENCH_LOG_DIR:-$root/target/bench-throughput/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$logs"
cleanup() { bench_cleanup; }
trap cleanup EXIT
trap 'exit 130' INT TERM

load1() { cut -d' ' -f1 /proc/loadavg; }

# One Drover run against binaries in $2, labelled $1, output in $3; sets rate, cpu
# (ms per task) and load (1-min load average at the start).
run_drover() {
  local label=$1 bin=$2 log=$3 tmp=${TMPDIR:-/tmp}
  load=$(load1)
  if [ "$fresh_fs" = 1 ]; then
    bench_fresh_tmp
    tmp=$bench_mnt
  fi
  if ! TMPDIR=$tmp DROVER_BIN_DIR=$bin BENCH_ONLY=throughput BENCH_TLS=1 BENCH_TASKS=$tasks \
    "$harness" >"$log" 2>&1; then
    cleanup
    tail -n 20 "$log" >&2
    die "the $label run failed (full output: $log)"
  fi
  cleanup
  rate=$(sed -n 's/.* = \([0-9.]*\) tasks\/s.*/\1/p' "$log" | tail -n 1)
  cpu=$(sed -n 's/^CPU: .* = \([0-9.]*\) ms per task.*/\1/p' "$log" | tail -n 1)
  [ -n "$rate" ] || die "no tasks/s in $log"
  grep -q " 0 FAILED/LOST" "$log" || die "the $label run had failed or lost tasks ($log)"
  cpu=${cpu:--}
}

# The same number of `true` jobs in Slurm as job arrays (as few sbatch calls as its
# MaxArraySize allows), from the first submit until squeue lists none of them
# pending, configuring, running or completing, polled every 50 ms like the harness
# polls the master; sets rate (jobs/s) and load. A job that fails to launch drains
# the node, so the run fails unless the node is still usable afterwards.
run_slurm() {
  local max chunk first=0 start end name out node
  name=drover-bench-$$-$((++slurm_runs))
  load=$(load1)
  max=$(scontrol show config | sed -n 's/^MaxArraySize *= *\([0-9]*\).*/\1/p')
  max=${max:-1001}
  start=$(date +%s.%N)
  while [ "$first" -lt "$tasks" ]; do
    chunk=$((tasks - first))
    [ "$chunk" -le "$max" ] || chunk=$max
    sbatch --parsable --job-name="$name" --array=0-$((chunk - 1)) -o /dev/null -e /dev/null \
      --wrap=true >/dev/null || die "sbatch failed"
    first=$((first + chunk))
  done
  # A failed squeue (the controller busy) is asked again, never taken for "done".
  while ! out=$(squeue -h --name="$name" --states=PD,CF,R,CG,S -o %i 2>/dev/null) ||
    [ -n "$out" ]; do
    sleep 0.05
  done
  end=$(date +%s.%N)
  node=$(sinfo -h -N -o %t | sort -u | tr '\n' ' ')
  case $node in idle\ | mix\ | alloc\ ) ;; *) die "the Slurm node is '$node' after the run: jobs failed to launch? (see its slurmd log)" ;; esac
  rate=$(awk -v n="$tasks" -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", n / (e - s) }')
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) { print "-"; exit }
  if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

uptime_before=$(uptime)
echo "==> $rounds rounds of $tasks tasks over mTLS: base $base ($base_bin), new $new ($new_bin)"
echo "    harness $harness; logs in $logs; load before: $uptime_before"
rate='' cpu='' load='' slurm_runs=0
rows=()
base_rates=()
new_rates=()
ratios=()
slurm_rates=()
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
  for which in $order; do
    if [ "$which" = base ]; then bin=$base_bin; else bin=$new_bin; fi
    run_drover "$which" "$bin" "$logs/round$r-$which.log"
    echo "    round $r $which: $rate tasks/s, $cpu ms CPU per task (load $load at start)"
    if [ "$which" = base ]; then
      b_rate=$rate b_cpu=$cpu b_load=$load
    else
      n_rate=$rate n_cpu=$cpu n_load=$load
    fi
  done
  s_col=
  if [ "$slurm" = 1 ]; then
    run_slurm
    s_rate=$rate s_load=$load
    echo "    round $r slurm: $s_rate jobs/s (load $s_load at start)"
    slurm_rates+=("$s_rate")
    s_col=" $s_rate (${s_load}) |"
  fi
  ratio=$(awk -v n="$n_rate" -v b="$b_rate" 'BEGIN { printf "%.3f", n / b }')
  base_rates+=("$b_rate")
  new_rates+=("$n_rate")
  ratios+=("$ratio")
  rows+=("| $r | ${order/ /, } | $b_rate (${b_cpu} ms, load ${b_load}) | $n_rate (${n_cpu} ms, load ${n_load}) |$s_col $ratio |")
done
uptime_after=$(uptime)

echo
echo "$tasks one-shot \`true\` tasks on 4 agents, mTLS + tokens, release builds; tasks/s (CPU per task, 1-min load at the run's start)"
echo
if [ "$slurm" = 1 ]; then
  echo "| round | order | base $base | new $new | Slurm jobs/s | new/base |"
  echo "| --- | --- | --- | --- | --- | --- |"
else
  echo "| round | order | base $base | new $new | new/base |"
  echo "| --- | --- | --- | --- | --- |"
fi
printf '%s\n' "${rows[@]}"
s_med=
[ "$slurm" = 0 ] || s_med=" $(echo "${slurm_rates[*]}" | median) |"
median_ratio=$(echo "${ratios[*]}" | median)
echo "| median | | $(echo "${base_rates[*]}" | median) | $(echo "${new_rates[*]}" | median) |$s_med $median_ratio |"
# For scripts (bench-guard.sh): one "key value" a line.
{
  echo "base $base"
  echo "new $new"
  echo "ratios ${ratios[*]}"
  echo "median_ratio $median_ratio"
} >"$logs/summary"
echo
echo "load before: $uptime_before"
echo "load after:  $uptime_after"
echo "(Slurm: $([ "$slurm" = 1 ] && echo "measured, same series" || echo "not installed or not answering scontrol ping; no column"))"
