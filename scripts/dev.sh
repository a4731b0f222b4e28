#!/usr/bin/env bash
# Drover's main job: builds the binaries, then runs a one-host cluster (master, one
# agent, executors) with examples/hello_world.yaml and follows it until every
# instance is RUNNING. `--keep` keeps the cluster up until Ctrl-C; other arguments go
# to `drover dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --workspace --bins
args=(--job examples/hello_world.yaml)
if [ "${1:-}" = "--keep" ]; then
  shift
else
  args+=(--exit-when-running)
fi
exec target/debug/drover dev "${args[@]}" "$@"
