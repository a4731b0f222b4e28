#!/usr/bin/env bash
# A one-node Slurm on this host, the peer column of scripts/bench-throughput.sh
# (issue 33). As root:
#
#   scripts/slurm.sh start    installs the pinned packages if needed, writes the
#                             config, starts munged, slurmctld and slurmd as plain
#                             daemons (no systemd) and waits until the controller
#                             answers UP and the node is idle
#   scripts/slurm.sh stop     cancels every job, stops the three daemons and any
#                             slurmstepd left, and checks that nothing runs
#   scripts/slurm.sh status   what runs, `scontrol ping` and `sinfo` (exit 3 when
#                             not up)
#
# Both start and stop are safe to run again. Everything the daemons keep (munge key,
# controller state, slurmd spool, pid files, logs, the config itself) lives under
# SLURM_BENCH_DIR (default /var/lib/drover-bench-slurm); /etc/slurm/slurm.conf is a
# link to that config so that sbatch, squeue and scontrol find it. A slurm.conf that
# this script did not write is never replaced. The controller starts with a clean
# state (`slurmctld -c`): a start forgets jobs of an earlier one. A start while it
# runs changes nothing (stop first to apply a new config). SLURM_BENCH_OVERSUBSCRIBE
# sets the partition's OverSubscribe (default FORCE:32, see the config below).
set -euo pipefail

state=${SLURM_BENCH_DIR:-/var/lib/drover-bench-slurm}
etc_conf=/etc/slurm/slurm.conf
conf=$state/slurm.conf
socket=$state/munge/munge.socket

# Exact versions, so that a fresh machine gets the same Slurm: Debian 12's
# slurm-wlm and the packages it pulls in that the base image does not have (its
# other dependencies -- libnuma1, liblz4-1, libpam0g, libreadline8, libdbus-1-3,
# libjson-c5, libyaml-0-2, ucf, adduser, libgcrypt20, sysvinit-utils for lsb-base --
# are part of the image). Debian 12 ships slurm-wlm 22.05.8 and munge 0.5.15.
slurm_version=22.05.8-4+deb12u3
munge_version=0.5.15-2+deb12u1
packages=(
  "slurm-wlm=$slurm_version"
  "slurmctld=$slurm_version"
  "slurmd=$slurm_version"
  "slurm-client=$slurm_version"
  "slurm-wlm-basic-plugins=$slurm_version"
  "munge=$munge_version"
  "libmunge2=$munge_version"
  "libhwloc15=2.9.0-1"
  "liblua5.1-0=5.1.5-9"
)

die() {
  echo "slurm.sh: $*" >&2
  exit 1
}

usage() {
  echo "usage: scripts/slurm.sh start|stop|status" >&2
  exit 2
}

installed() {
  local p
  for p in "${packages[@]}"; do
    [ "$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "${p%%=*}" 2>/dev/null)" = "ii ${p#*=}" ] ||
      return 1
  done
}

install_packages() {
  installed && return 0
  echo "slurm.sh: installing ${packages[*]}" >&2
  # The packages' postinst would start munge with its own defaults where the host
  # lets invoke-rc.d start services; this script starts its own daemons, so keep
  # them from starting (only when the host has no policy-rc.d of its own).
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  local ok=0
  if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" ||
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      --no-install-recommends "${packages[@]}"; }; then
    ok=1
  fi
  [ "$own_policy" = 0 ] || rm -f "$policy"
  [ "$ok" = 1 ] || die "apt-get install of ${packages[*]} failed"
  installed || die "after the install, not every package is at its pinned version"
}

pid_of() { # the pid in pid file $1 if that process is alive
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  case $pid in '' | *[!0-9]*) return 1 ;; esac
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

# Our daemons and job steps: munged, slurmctld and slurmd whose command line names
# this state directory (they are started with paths under it), and slurmstepd
# processes (a job's step keeps running when slurmd stops, and only a Slurm started
# here can have made one: start refuses to run beside another controller).
our_pids() {
  local p exe
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
    # Debian's /usr/sbin/slurm* are alternatives for the *-wlm binaries.
    case $exe in
    /usr/sbin/slurmstepd | /usr/sbin/slurmstepd-wlm) echo "$p" ;;
    /usr/sbin/munged | /usr/sbin/slurmctld | /usr/sbin/slurmctld-wlm | /usr/sbin/slurmd | /usr/sbin/slurmd-wlm)
      if tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "^--[a-z-]*=$state/\|^$state/"; then
        echo "$p"
      fi
      ;;
    esac
  done
}

stop_all() {
  local pids
  [ -d "$state" ] || return 0
  if command -v scontrol >/dev/null 2>&1 && [ -e "$conf" ] &&
    timeout 5 scontrol ping 2>/dev/null | grep -q UP; then
    # Cancel the jobs first so that slurmd ends their steps.
    timeout 10 squeue -h -o %A 2>/dev/null | xargs -r timeout 10 scancel --quiet 2>/dev/null || true
    for _ in $(seq 1 50); do
      [ -n "$(timeout 5 squeue -h -o %A 2>/dev/null || echo busy)" ] || break
      sleep 0.2
    done
  fi
  pids=$(our_pids)
  [ -z "$pids" ] && return 0
  # shellcheck disable=SC2086 # one pid a word
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 1 50); do
    pids=$(our_pids)
    [ -n "$pids" ] || return 0
    sleep 0.2
  done
  echo "slurm.sh: still running after 10 s, killing: $pids" >&2
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  sleep 0.5
  pids=$(our_pids)
  [ -z "$pids" ] || die "could not stop: $pids"
}

write_config() {
  local host node
  host=$(hostname -s)
  # slurmd -C prints this node's line as slurmd sees it (CPUs, sockets, cores,
  # threads, RealMemory in MiB), so the node is never marked invalid for a mismatch.
  node=$(slurmd -C 2>/dev/null | sed -n '1s/^\(NodeName=.*\)$/\1/p')
  [ -n "$node" ] || die "slurmd -C printed no NodeName line"
  case $node in "NodeName=$host "*) ;; *) die "slurmd -C names another host: $node" ;; esac
  mkdir -p /etc/slurm
  if [ -e "$etc_conf" ] || [ -L "$etc_conf" ]; then
    [ "$(readlink "$etc_conf" 2>/dev/null)" = "$conf" ] ||
      die "$etc_conf exists and is not this script's; move it away first"
  fi
  cat >"$conf.tmp" <<EOF
# Written by scripts/slurm.sh (Drover's benchmark peer); rewritten by every start.
ClusterName=drover-bench
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$state/slurmctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldDebug=error
SlurmdDebug=error
# PID 1 is not systemd and there is no cgroup setup for Slurm: track a job's
# processes by their parent chain, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# No accounting database, no per-job accounting or completion records: nothing that
# costs per job beyond running it (Drover keeps none of that either).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Tuned for many tiny jobs on one node, as the high-throughput guide of Slurm's
# documentation suggests:
# - sched/builtin: strict priority (FIFO) order; a backfill pass over thousands of
#   pending jobs is pure cost when every job is the same one-CPU \`true\`.
# - batch_sched_delay=0: start batch jobs at once instead of batching them up for up
#   to 3 s after a submit; sched_interval=1: the full scheduling pass every second
#   instead of every 60 s (with one job per CPU, jobs of an array started at about
#   that pace here: 300 jobs at 2.2 jobs/s); default_queue_depth=1000: each
#   event-driven pass looks at up to 1,000 pending jobs, not 100;
#   sched_max_job_start=0: no cap on the jobs started per pass.
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_interval=1,default_queue_depth=1000,sched_max_job_start=0
# Whole arrays of up to 100,000 tasks in one sbatch (default 1,001), room for them
# in the controller, and finished jobs dropped after 2 s (default 300 s: 5,000
# finished records a run would otherwise fill MaxJobCount within two runs and slow
# every pass over the job list).
MaxArraySize=100001
MaxJobCount=200000
MinJobAge=2
# One CPU per job, and OverSubscribe=FORCE:32 lets up to 32 jobs share each of the
# node's CPUs (so 64 at a time), as Drover's benchmark tasks ask for 0.01 CPU each
# and share the CPUs too; without it each pass could start only two jobs.
# SLURM_BENCH_OVERSUBSCRIBE overrides it (NO, FORCE:n).
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=bench Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=${SLURM_BENCH_OVERSUBSCRIBE:-FORCE:32}
EOF
  mv "$conf.tmp" "$conf"
  ln -sfn "$conf" "$etc_conf"
}

wait_up() {
  for _ in $(seq 1 150); do
    if timeout 5 scontrol ping 2>/dev/null | grep -q UP &&
      [ "$(timeout 5 sinfo -h -N -o %t 2>/dev/null)" = idle ]; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

start() {
  install_packages
  if timeout 5 scontrol ping 2>/dev/null | grep -q UP; then
    [ -n "$(pid_of "$state/run/slurmctld.pid" || true)" ] ||
      die "a slurmctld not started by this script answers; stop it first"
    wait_up || die "slurmctld is UP but the node is not idle: $(sinfo -N 2>&1)"
    echo "slurm.sh: already running"
    status
    return 0
  fi
  # Whatever an earlier, failed start left.
  stop_all
  trap 'echo "slurm.sh: start failed, stopping what it started" >&2; stop_all' EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$state"/{run,log,slurmctld,slurmd,munge}
  chmod 755 "$state"
  chown munge:munge "$state/munge"
  # munged's own directory: only munge writes it; root (sbatch, the daemons) must
  # reach the socket in it.
  chmod 711 "$state/munge"
  if [ ! -s "$state/munge/munge.key" ]; then
    runuser -u munge -- mungekey --create --keyfile="$state/munge/munge.key"
  fi
  write_config
  # munged forks into the background; its socket lives in its own directory.
  runuser -u munge -- munged --socket="$socket" --key-file="$state/munge/munge.key" \
    --pid-file="$state/munge/munged.pid" --log-file="$state/munge/munged.log" \
    --seed-file="$state/munge/munged.seed"
  munge -n --socket="$socket" | unmunge --socket="$socket" >/dev/null ||
    die "munged does not answer on $socket"
  slurmctld -c -f "$conf"
  slurmd -f "$conf"
  wait_up || die "not up within 30 s: $(scontrol ping 2>&1); $(sinfo -N 2>&1); see $state/log"
  trap - EXIT
  status
}

status() {
  local up=1 name pidfile pid
  for name in munged slurmctld slurmd; do
    pidfile=$state/run/$name.pid
    [ "$name" != munged ] || pidfile=$state/munge/munged.pid
    if pid=$(pid_of "$pidfile"); then
      echo "$name: running, pid $pid"
    else
      echo "$name: not running"
      up=0
    fi
  done
  if command -v scontrol >/dev/null 2>&1 && [ -e "$conf" ]; then
    timeout 5 scontrol ping 2>&1 || up=0
    timeout 5 sinfo -N 2>&1 || true
  else
    up=0
  fi
  [ "$up" = 1 ] || return 3
}

[ $# -eq 1 ] || usage
case $1 in
start | stop) [ "$(id -u)" -eq 0 ] || die "needs root" ;;
esac
case $1 in
start) start ;;
stop)
  stop_all
  echo "slurm.sh: stopped (nothing of it runs; state and logs kept in $state)"
  ;;
status) status ;;
*) usage ;;
esac
