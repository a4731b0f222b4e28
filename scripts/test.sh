#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, then all unit, integration and
# black-box tests. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Black-box tests start the real binaries from target/debug.
cargo build --workspace --bins
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
cargo test --workspace --doc
