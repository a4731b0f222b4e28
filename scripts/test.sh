#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, then all unit, integration and
# black-box tests. This is the README's test command and what CI runs. Each step
# prints a header (`==> [N/8] what`) and the time it took, so a failure is easy to place.
# Last, pass or fail, scripts/leftovers.sh checks that the run left no process, task,
# /tmp/drover-* directory, cgroup or mount behind (it fails the run naming them).
set -euo pipefail
cd "$(dirname "$0")/.."

# What exists before the run is not the run's (e.g. your own `drover dev`).
mkdir -p target
baseline=target/leftovers.baseline
./scripts/leftovers.sh baseline "$baseline"
check_leftovers() {
  local status=$?
  trap - EXIT
  echo "==> [8/8] leftovers: nothing the run started is still there (scripts/leftovers.sh)"
  if ! ./scripts/leftovers.sh check "$baseline"; then
    [ "$status" -ne 0 ] || status=1
  fi
  [ "$status" -ne 0 ] || echo "==> all checks passed"
  exit "$status"
}
trap check_leftovers EXIT

step_number=0
step_started=$SECONDS
step() {
  if [ "$step_number" -gt 0 ]; then
    echo "    (took $((SECONDS - step_started))s)"
  fi
  step_number=$((step_number + 1))
  step_started=$SECONDS
  echo "==> [$step_number/8] $*"
}

step "setup: packages the tests need (scripts/setup.sh)"
./scripts/setup.sh
step "format: cargo fmt --check"
cargo fmt --all -- --check
step "lint: cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
# Black-box tests start the real binaries from target/debug.
step "build: the binaries the black-box tests start"
cargo build --workspace --bins
step "tests: unit, integration and black-box"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
step "doc tests"
cargo test --workspace --doc
# The committed ui/dist must be what ui/src builds to (refresh: scripts/ui.sh and
# commit ui/dist); then the web UI in Chromium against a real `drover dev` cluster,
# screenshots in target/ui-artifacts.
step "web UI: dist matches its source, browser suite (ui/tests)"
./scripts/ui.sh --check
(cd ui && npm run --silent browser-test)
echo "    (took $((SECONDS - step_started))s)"
check_leftovers

