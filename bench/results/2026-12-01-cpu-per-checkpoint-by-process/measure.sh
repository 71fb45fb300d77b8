#!/bin/sh
# CPU time and page faults per checkpoint of each server process, before (b506257, this
# session's start) and after (a55d2f0) this session's changes to the write path, alternating.
# Each run: a fresh tree started by hand, 10k checkpoints in write mode twice, /proc/<pid>/stat
# (minflt, utime, stime) of every process before and after; one JSON row per process and run.
set -e
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-01-cpu-per-checkpoint-by-process
DATA=$(mktemp -d /tmp/cpu-per-ckpt.XXXXXX)
snapshot() {
  for p in $(pgrep -f '^agent-os: '); do
    printf '%s %s\n' "$(tr -d '\0' < /proc/$p/cmdline | sed 's/agent-os: //;s/ /_/g')" \
      "$(sed 's/.*) //' /proc/$p/stat | awk '{print $8, $12, $13}')"
  done | sort
}
: > "$OUT/rows.jsonl"
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="b506257 a55d2f0"; else order="a55d2f0 b506257"; fi
  for rev in $order; do
    git checkout -q "$rev" -- gateway storage agentos
    rm -rf "$DATA/tree"
    AGENTOS_STORAGE_DIR="$DATA/tree" AGENTOS_GATEWAY_LISTEN=127.0.0.1:18181 .venv/bin/agent-os serve > "$DATA/server.log" 2>&1 &
    for i in $(seq 100); do curl -s -o /dev/null -w '%{http_code}' localhost:18181/readyz | grep -q 200 && break; sleep 0.2; done
    snapshot > "$DATA/before"
    .venv/bin/python -m bench.checkpoints --targets agentos --agentos-url http://127.0.0.1:18181 --scales 10k \
      --modes write --repeat 2 --floor-iterations 0 --results-root "$DATA/res" --results-name run > "$DATA/bench.log"
    rate=$(grep -o '= [0-9.]*/s' "$DATA/bench.log" | tr -d '=/s ' | paste -sd, -)
    sleep 6   # writer/store finishes loading what the runs wrote
    snapshot > "$DATA/after"
    join "$DATA/before" "$DATA/after" | awk -v r=$r -v rev=$rev -v rate="$rate" '$6+$7-$3-$4 > 2 {
      printf "{\"round\": %d, \"code\": \"%s\", \"process\": \"%s\", \"checkpoints\": 20000, \"checkpoints_per_sec\": [%s], \"faults_per_checkpoint\": %.2f, \"user_us_per_checkpoint\": %.1f, \"system_us_per_checkpoint\": %.1f}\n",
        r, rev, $1, rate, ($5-$2)/20000, ($6-$3)*10000/20000, ($7-$4)*10000/20000 }' >> "$OUT/rows.jsonl"
    kill -TERM $(pgrep -f '^agent-os: supervisor')
    while pgrep -f '^agent-os: ' > /dev/null; do sleep 0.2; done
  done
done
git checkout -q HEAD -- gateway storage agentos
rm -rf "$DATA"
