# usage: bash bench/results/2026-12-03-forget-by-positions-leak/run.sh BEFORE AFTER ROUNDS  (from the repo root)
# each round: each commit's storage/ and broker/ checked out, a fresh tree, leak.sh; HEAD's restored after
M=bench/results/2026-12-03-forget-by-positions-leak
for r in $(seq 1 $3); do for rev in $1 $2; do
  git checkout -q --no-overlay $rev -- storage broker
  { echo "# round $r, storage/ and broker/ of $rev, $(date -u +%FT%TZ)"; bash $M/leak.sh $rev 2>&1 | grep -v '^round'; } > $M/rows-r$r-$rev.txt
done; done
git checkout -q --no-overlay HEAD -- storage broker
