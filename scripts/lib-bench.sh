#!/usr/bin/env bash
# Shared by scripts/bench-throughput.sh and scripts/profile-throughput.sh (sourced,
# not run): the e2e harness build and the fresh journal-less ext4 each run gets as
# TMPDIR (ext4 slows file creation after a run freed ~20,000 inodes nearby,
# docs/agent.md "Measured").
#
#   bench_harness          prints the e2e bench binary: BENCH_HARNESS when set, else
#                          tests/benches/e2e.rs built in the dev profile
#   bench_fresh_tmp        mounts a fresh 4 GiB journal-less ext4 on a loop file; sets
#                          $bench_mnt
#   bench_cleanup          unmounts and deletes it (idempotent; installed as the EXIT
#                          trap by bench_fresh_tmp's callers)

bench_mnt=
bench_loopfile=

bench_harness() {
  local harness
  if [ -n "${BENCH_HARNESS:-}" ]; then
    harness=$BENCH_HARNESS
    echo "==> harness: $harness (BENCH_HARNESS)" >&2
  else
    echo "==> building the harness (tests/benches/e2e.rs, dev profile)" >&2
    harness=$(cargo build -q -p drover-tests --bench e2e --message-format=json |
      jq -r 'select(.reason == "compiler-artifact" and .target.name == "e2e") | .executable' |
      tail -n 1)
  fi
  [ -x "$harness" ] || {
    echo "no e2e bench binary ($harness)" >&2
    return 1
  }
  echo "$harness"
}

bench_cleanup() {
  if [ -n "$bench_mnt" ]; then
    umount "$bench_mnt" 2>/dev/null || umount -l "$bench_mnt" 2>/dev/null || true
    rmdir "$bench_mnt" 2>/dev/null || true
  fi
  [ -z "$bench_loopfile" ] || rm -f "$bench_loopfile"
  bench_mnt=
  bench_loopfile=
}

bench_fresh_tmp() {
  bench_loopfile=$(mktemp "${TMPDIR:-/tmp}/drover-bench-fs.XXXXXX")
  truncate -s 4G "$bench_loopfile"
  mkfs.ext4 -q -F -O ^has_journal "$bench_loopfile"
  bench_mnt=$(mktemp -d "${TMPDIR:-/tmp}/drover-bench-mnt.XXXXXX")
  mount -o loop "$bench_loopfile" "$bench_mnt"
}
