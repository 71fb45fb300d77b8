#!/bin/bash
# two.sh NAME URL1 URL2 : two bench clients of 5 workers at once, 10k write x3
cd /work/main
name=$1; u1=$2; u2=$3
.venv/bin/agent-os bench checkpoints --agentos-url $u1 --targets agentos --workers 5 --scales 10k --modes write --repeat 3 --floor-iterations 0 --results-root bench/results/2026-12-01-two-trees-split-load --results-name $name-c1 > /tmp/two-$name-c1.log 2>&1 &
p1=$!
.venv/bin/agent-os bench checkpoints --agentos-url $u2 --targets agentos --workers 5 --scales 10k --modes write --repeat 3 --floor-iterations 0 --results-root bench/results/2026-12-01-two-trees-split-load --results-name $name-c2 > /tmp/two-$name-c2.log 2>&1 &
p2=$!
wait $p1 $p2
python3 - "$name" <<'PY'
import json, sys
name = sys.argv[1]
r1 = [json.loads(l) for l in open(f"bench/results/2026-12-01-two-trees-split-load/2026-12-01-{name}-c1/rows.jsonl")]
r2 = [json.loads(l) for l in open(f"bench/results/2026-12-01-two-trees-split-load/2026-12-01-{name}-c2/rows.jsonl")]
for a, b in zip(r1, r2):
    print(name, a["run"], a["checkpoints_per_sec"], b["checkpoints_per_sec"], "sum", round(a["checkpoints_per_sec"] + b["checkpoints_per_sec"], 1), "p99", a["commit_ms"]["p99"], b["commit_ms"]["p99"])
PY
