#!/bin/sh
# Before/after ae37beb (a checkpoint PUT answered from its append's callback, no Task; a request
# read whole parsed from the read itself) at ONE worker, where each request pays its event-loop
# turns alone. Alternating, a fresh tree per run; the commits' gateway/ and storage/ checked out
# in turn (the venv installs the checkout in editable mode).
set -e
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-01-put-without-task-1worker-ab
for r in ${ROUNDS:-1 2 3}; do
  if [ $((r % 2)) = 1 ]; then order="9b68308 ae37beb"; else order="ae37beb 9b68308"; fi
  for rev in $order; do
    git checkout -q "$rev" -- gateway storage
    .venv/bin/python -m bench.checkpoints --targets agentos --scales 1k --modes write,mixed --workers 1 \
      --repeat 3 --floor-iterations 0 --results-root "$OUT/runs" --results-name "r$r-$rev" | grep " R3 "
  done
done
git checkout -q HEAD -- gateway storage
