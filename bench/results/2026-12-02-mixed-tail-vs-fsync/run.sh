#!/bin/bash
# Is our 10k mixed commit p99 the tail of the gateway log's write + fdatasync? A default server,
# its agentos_log_fsync_ms histogram scraped before and after two 10k mixed runs (then two write
# runs), each bench's own commit percentiles beside it.
set -u
out=$(dirname "$0")
dir=$(mktemp -d /tmp/tail-XXXX)
AGENTOS_STORAGE_DIR=$dir/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18090 .venv/bin/agent-os serve > "$out/server.log" 2>&1 &
for i in $(seq 1 60); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18090/readyz 2>/dev/null | grep -q 200 && break; sleep 0.5; done
for mode in mixed write; do
  curl -s http://127.0.0.1:18090/metrics | grep -E '^agentos_log_fsync_ms_(bucket|count|sum)' > "$out/$mode-before.txt"
  date -u +%H:%M:%S >> "$out/times.txt"
  .venv/bin/agent-os bench checkpoints --agentos-url http://127.0.0.1:18090 --targets agentos --scales 10k \
    --modes $mode --repeat 2 --floor-iterations 0 --results-root "$dir/results" --results-name $mode > "$out/$mode-bench.txt" 2>&1
  curl -s http://127.0.0.1:18090/metrics | grep -E '^agentos_log_fsync_ms_(bucket|count|sum)' > "$out/$mode-after.txt"
done
date -u +%H:%M:%S >> "$out/times.txt"
kill -TERM $(pgrep -f '^agent-os: supervisor'); sleep 3
rm -rf "$dir"
