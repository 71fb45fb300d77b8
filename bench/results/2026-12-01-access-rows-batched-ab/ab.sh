#!/bin/sh
# Before/after 682ef2e (access rows many to a record), alternating, a fresh tree per run:
# the two commits' gateway/ and storage/ are checked out in turn (the venv installs the checkout
# in editable mode, so the tree each run starts runs that code).
set -e
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-01-access-rows-batched-ab
for r in ${ROUNDS:-1 2 3}; do
  if [ $((r % 2)) = 1 ]; then order="b506257 682ef2e"; else order="682ef2e b506257"; fi
  for rev in $order; do
    git checkout -q "$rev" -- gateway storage
    .venv/bin/python -m bench.checkpoints --targets agentos --scales 10k --modes write,mixed --repeat 1 \
      --floor-iterations 0 --cpu-latency-us 0 --results-root "$OUT/runs" --results-name "r$r-$rev" | grep " R1 "
  done
done
git checkout -q HEAD -- gateway storage
