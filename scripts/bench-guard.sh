#!/usr/bin/env bash
# Throughput guard (issue 33 part 3): the short form of scripts/bench-throughput.sh,
# 1,000 one-shot tasks over mTLS (BENCH_TASKS), ROUNDS (default 3) alternations of
# the merge base with main (or BASE_REF) against HEAD / the working tree. Fails only
# when the median paired ratio new/base is below 0.8, i.e. throughput dropped by more
# than 20 %; a smaller drop or any gain passes. Needs root, like the e2e bench.
#
#   scripts/bench-guard.sh [BASE_REF]
#
# Not part of scripts/test.sh: two release builds (fat LTO) do not fit the CI time
# budget. Run it by hand before merging a change that may cost throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
threshold=0.8
base=${1:-$(git merge-base HEAD main)}
if [ "$(git rev-parse "$base^{commit}")" = "$(git rev-parse HEAD)" ] &&
  [ -z "$(git status --porcelain --untracked-files=no)" ]; then
  echo "bench-guard: HEAD is the base ($(git rev-parse --short HEAD)) and the tree is clean: nothing to compare"
  exit 0
fi
logs=$PWD/target/bench-guard/$(date -u +%Y%m%dT%H%M%SZ)
BENCH_TASKS=${BENCH_TASKS:-1000} ROUNDS=${ROUNDS:-3} BENCH_LOG_DIR=$logs \
  scripts/bench-throughput.sh "$base"
ratio=$(sed -n 's/^median_ratio //p' "$logs/summary")
[ -n "$ratio" ] || {
  echo "bench-guard: no median_ratio in $logs/summary" >&2
  exit 1
}
if awk -v r="$ratio" -v t="$threshold" 'BEGIN { exit !(r < t) }'; then
  echo "bench-guard: FAIL: median paired ratio new/base $ratio < $threshold (throughput dropped by more than 20 %)" >&2
  exit 1
fi
echo "bench-guard: ok: median paired ratio new/base $ratio (fails below $threshold)"
