#!/bin/sh
# Builds the release binaries into target/release (what packaging/ installs and the
# benchmarks measure).
#
# The executor is linked a second time on its own: in a workspace build cargo gives
# every crate the union of the features its dependencies are asked for, so the
# executor would carry tokio's multi-threaded scheduler (the master's) and libm,
# about 300 KiB more resident memory for each task on a host (docs/executor.md,
# "Memory").
set -eu
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
cargo build --release -p drover-executor --bin drover-executor
