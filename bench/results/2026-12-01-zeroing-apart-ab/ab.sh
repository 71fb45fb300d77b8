#!/bin/sh
# Before/after a68b8d7 (the next segment zeroed by a child process instead of a thread),
# alternating, a fresh tree per run: the two commits' gateway/ and storage/ are
# checked out in turn (the venv installs the checkout in editable mode).
set -e
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-01-zeroing-apart-ab
for r in ${ROUNDS:-1 2 3}; do
  if [ $((r % 2)) = 1 ]; then order="4184362 a68b8d7"; else order="a68b8d7 4184362"; fi
  for rev in $order; do
    git checkout -q "$rev" -- gateway storage
    .venv/bin/python -m bench.checkpoints --targets agentos --scales 10k --modes write,mixed --repeat 1 \
      --floor-iterations 0 $EXTRA --results-root "$OUT/runs" --results-name "r$r-$rev" | grep " R1 "
  done
done
git checkout -q HEAD -- gateway storage
