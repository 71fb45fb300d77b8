#!/bin/bash
# A long-running tree idle before each burst: two servers from the spare-segments code (789c462),
# storage.spare_segments 1 and 4, side by side (a worktree of 789c462 at /work/spare-wt:
# `git worktree add /work/spare-wt 789c462`); each is warmed by one 10k write run (its log fills
# and rotates), then CYCLES times, alternating servers: idle IDLE s, one measured 10k write run.
set -u
out=$(cd "$(dirname "$0")" && pwd)
CYCLES=${CYCLES:-5}; IDLE=${IDLE:-8}
start() {  # name spares port
  mkdir -p "$out/work/$1"
  (cd /work/spare-wt && PYTHONPATH=/work/spare-wt AGENTOS_STORAGE_DIR="$out/work/$1/data" AGENTOS_STORAGE_SPARE_SEGMENTS=$2 \
     AGENTOS_KERNEL_RUN_DIR="$out/work/$1/run" AGENTOS_GATEWAY_LISTEN=127.0.0.1:$3 \
     /work/main/.venv/bin/python -c 'import sys; from agentos.cli import main; sys.argv[0]="agent-os"; sys.exit(main())' serve \
     > "$out/$1-server.log" 2>&1 &)
  for i in $(seq 1 80); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$3/readyz 2>/dev/null | grep -q 200 && return; sleep 0.5; done
  echo "server $1 did not start"; exit 1
}
run() {  # name port label
  /work/main/.venv/bin/agent-os bench checkpoints --agentos-url http://127.0.0.1:$2 --targets agentos --scales 10k \
    --modes write --repeat 1 --floor-iterations 0 --no-log-batches --results-root "$out/work/results" \
    --results-name "$1-$3" > /dev/null 2>&1
  /work/main/.venv/bin/python - "$out/work/results"/*-"$1-$3"/rows.jsonl "$1" "$3" >> "$out/runs.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(json.dumps({"server": sys.argv[2], "label": sys.argv[3], "checkpoints_per_sec": r["checkpoints_per_sec"],
                      "commit_p50_ms": r["commit_ms"]["p50"], "commit_p99_ms": r["commit_ms"]["p99"],
                      "errors": r["errors_total"]}))
PY
}
start spares1 1 18101
start spares4 4 18104
date -u +%H:%M:%S > "$out/times.txt"
run spares1 18101 warm; run spares4 18104 warm
for c in $(seq 1 "$CYCLES"); do
  if [ $((c % 2)) -eq 1 ]; then order="spares1:18101 spares4:18104"; else order="spares4:18104 spares1:18101"; fi
  for pair in $order; do
    sleep "$IDLE"
    echo "${pair%%:*} cycle $c spares ready: $(ls "$out/work/${pair%%:*}/data/wal/"*/ 2>/dev/null | grep -c 'spare.*zero$')" >> "$out/spares.txt"
    run "${pair%%:*}" "${pair##*:}" "c$c"
  done
done
date -u +%H:%M:%S >> "$out/times.txt"
kill -TERM $(pgrep -f '^agent-os: supervisor'); sleep 5
rm -rf "$out/work"
