#!/usr/bin/env bash
# Drover's main job: builds the binaries, then runs a one-host cluster (master, one
# agent, executors) with examples/hello_world.yaml and follows it until every
# instance is RUNNING. `--keep` keeps the cluster up until Ctrl-C; other arguments go
# to `drover dev`. Installs only what that needs (scripts/setup.sh --dev); a second
# run with nothing changed builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dev
# cargo waits for another cargo building in target/ (an editor's, a test run's); say
# which, instead of waiting in silence.
lock=target/debug/.cargo-lock
if [ -e "$lock" ] && command -v flock >/dev/null 2>&1 && ! flock -n "$lock" true 2>/dev/null; then
  holder=$(lslocks -n -o PID,PATH 2>/dev/null | awk -v p="$(pwd -P)/$lock" '$2 == p {print $1; exit}')
  what=${holder:+ (pid $holder: $(tr '\0' ' ' <"/proc/$holder/cmdline" 2>/dev/null | cut -c1-120))}
  echo "dev: waiting for another cargo building in target/ to finish$what"
fi
cargo build --workspace --bins
args=(--job examples/hello_world.yaml)
if [ "${1:-}" = "--keep" ]; then
  shift
else
  args+=(--exit-when-running)
fi
exec target/debug/drover dev "${args[@]}" "$@"
