#!/bin/bash
# writer/store at nice 0 vs 10 (every thread), 10k mixed (and write), fresh tree per run, alternating.
# The question: does the commit p99 of mixed mode come from writer/store's bursts taking a CPU
# the gateway or the client wanted? Run from the repo root.
set -u
for r in 1 2 3 4 5; do
  if [ $((r % 2)) = 1 ]; then arms="0 10"; else arms="10 0"; fi
  for n in $arms; do
    rm -rf /tmp/aos-nice && mkdir -p /tmp/aos-nice
    env AGENTOS_STORAGE_DIR=/tmp/aos-nice/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18082 setsid .venv/bin/agent-os serve > /tmp/aos-nice/server.log 2>&1 &
    for i in $(seq 100); do curl -sf http://127.0.0.1:18082/readyz > /dev/null && break; sleep 0.2; done
    ST=$(pgrep -f '^agent-os: writer/store')
    for t in /proc/$ST/task/*; do renice -n $n -p $(basename $t) > /dev/null; done
    .venv/bin/agent-os bench checkpoints --agentos-url http://127.0.0.1:18082 --targets agentos --scales 10k \
        --modes write,mixed --repeat 1 --floor-iterations 0 --results-root /tmp/aos-nice/res \
        | grep 'ok in' | cut -d, -f1-3 | sed "s/^/round $r nice $n: /"
    kill -TERM $(pgrep -f '^agent-os: supervisor'); while pgrep -f '^agent-os: supervisor' > /dev/null; do sleep 0.2; done
  done
done
rm -rf /tmp/aos-nice
