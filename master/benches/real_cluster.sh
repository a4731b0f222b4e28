#!/usr/bin/env bash
# Job create -> RUNNING and batch throughput on a real one-host cluster: the release
# drover-master, N drover-agents and real drover-executors. Times come from the
# master's own task events (PENDING "created" -> RUNNING), so polling adds nothing.
# Not run in CI. Usage (after `cargo build --release --bins`):
#   master/benches/real_cluster.sh [JOBS=30] [BATCH=1000] [AGENTS=4]
set -euo pipefail

JOBS=${1:-30}
BATCH=${2:-1000}
AGENTS=${3:-4}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release}
WORK=$(mktemp -d /tmp/drover-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/master.toml" <<'EOF'
heartbeat_interval = "500ms"
agent_timeout = "5s"
EOF
mkdir -p "$WORK/m"
"$BIN/drover-master" --config "$WORK/master.toml" --listen 127.0.0.1:0 --data-dir "$WORK/m" \
    2>"$WORK/master.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/m/master.addr" ] && break; sleep 0.05; done
MASTER=http://$(cat "$WORK/m/master.addr")
for i in $(seq "$AGENTS"); do
    mkdir -p "$WORK/a$i" "$WORK/s$i"
    lo=$((33000 + i * 200))
    "$BIN/drover-agent" --master "$MASTER" --listen 127.0.0.1:0 --data-dir "$WORK/a$i" \
        --sandbox-root "$WORK/s$i" --cpu 64 --ram 64GiB --disk 100GiB \
        --ports "$lo-$((lo + 199))" --attribute "host=bench$i" 2>"$WORK/agent$i.log" &
    PIDS+=($!)
done
for _ in $(seq 200); do
    n=$(curl -s "$MASTER/v1/agents" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
    [ "$n" = "$AGENTS" ] && break
    sleep 0.05
done

job() { # name instances cmd
    printf '{"role":"nobody","environment":"bench","name":"%s","instances":%s,
      "task":{"processes":[{"name":"m","cmdline":"%s","min_duration":"0s"}],
      "resources":{"cpu":0.01,"ram":"8MiB","disk":"8MiB"}}}' "$1" "$2" "$3"
}

echo "== create -> RUNNING, $JOBS one-task jobs (sleep 60)"
for i in $(seq "$JOBS"); do
    curl -s -XPOST "$MASTER/v1/jobs" -d "$(job "lat$i" 1 'sleep 60')" >/dev/null
    sleep 0.2
done
sleep 2
for i in $(seq "$JOBS"); do curl -s "$MASTER/v1/jobs/nobody/bench/lat$i"; echo; done | python3 -c '
import json, sys
lat = []
for line in sys.stdin:
    v = json.loads(line)
    ev = v["instances"][0]["current"]["events"]
    t = {e["state"]: e["timestamp_ms"] for e in ev}
    if "RUNNING" in t:
        lat.append(t["RUNNING"] - t["PENDING"])
lat.sort()
print(f"running: {len(lat)}; median {lat[len(lat)//2]} ms; p90 {lat[len(lat)*9//10]} ms; max {lat[-1]} ms")
'
for i in $(seq "$JOBS"); do curl -s -XPOST "$MASTER/v1/jobs/nobody/bench/lat$i/kill" >/dev/null; done

echo "== $BATCH one-shot 'true' tasks on $AGENTS agents"
start=$(date +%s%3N)
curl -s -XPOST "$MASTER/v1/jobs" -d "$(job batch "$BATCH" true)" >/dev/null
while :; do
    done_n=$(curl -s "$MASTER/v1/jobs/nobody/bench/batch" | python3 -c '
import json, sys
v = json.load(sys.stdin)
print(sum(n for s, n in v["state_counts"].items() if s in ("FINISHED", "FAILED", "LOST", "KILLED")))')
    [ "$done_n" -ge "$BATCH" ] && break
    sleep 0.2
done
end=$(date +%s%3N)
python3 -c "print(f'$BATCH tasks in {($end-$start)/1000:.2f} s = {$BATCH*1000/($end-$start):.0f} tasks/s')"
curl -s "$MASTER/v1/jobs/nobody/bench/batch" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state_counts"])'
