#!/usr/bin/env bash
# Builds the web UI (ui/) into ui/dist, which the master embeds (master/src/ui.rs)
# and which is committed, so that `cargo build` needs no node.
#   scripts/ui.sh          npm ci, type check, vite build into ui/dist
#   scripts/ui.sh --check  builds into a temporary dir and fails if it differs from
#                          the committed ui/dist (refresh with: scripts/ui.sh, then
#                          commit ui/dist)
# Needs node and npm (the npm registry for `npm ci`).
set -euo pipefail
cd "$(dirname "$0")/../ui"

if ! command -v npm >/dev/null 2>&1; then
  echo "ui: npm is not installed; install nodejs and npm (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
# The lock file pins every package; `npm ci` installs exactly that.
npm ci --no-audit --no-fund --loglevel=error
npx --no-install tsc --noEmit -p .

if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  npx --no-install vite build --logLevel error --outDir "$out/dist"
  if ! diff -r dist "$out/dist"; then
    echo "ui: ui/dist differs from a build of ui/src: run scripts/ui.sh and commit ui/dist" >&2
    exit 1
  fi
  echo "ui: ui/dist matches a fresh build of ui/src"
else
  npx --no-install vite build --logLevel warn
fi
