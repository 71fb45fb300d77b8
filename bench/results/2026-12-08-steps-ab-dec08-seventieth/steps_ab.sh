#!/bin/bash
# channel_wake and flows, old (ce1c0226, /tmp/bA) and new (HEAD, /tmp/bt) alternating, the order swapped each round
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="bA bt"; else order="bt bA"; fi
  for d in $order; do
    cd /tmp/$d && .venv/bin/agent-os bench steps --runs 1 --scenarios channel_wake,flows --name steps-ab-r$r-$d --results-root /tmp/steps-ab > /tmp/steps-ab-r$r-$d.txt 2>&1
    echo "r$r $d rc $? $(date -u +%T)"
  done
done
