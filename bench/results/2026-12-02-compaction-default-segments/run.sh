#!/bin/bash
# A default-config server (64 MB segments, 16 MB of DuckDB memory per file), the checkpoint
# benchmark's 1k and 10k runs against it, then 70 s for compaction's passes (every 30 s):
# what the gateway's log holds and what the compaction metrics say. Usage: run.sh LABEL
set -u
label=$1
out=$(dirname "$0")/$label
mkdir -p "$out"
dir=$(mktemp -d /tmp/compaction-XXXX)
AGENTOS_STORAGE_DIR=$dir/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18090 .venv/bin/agent-os serve > "$out/server.log" 2>&1 &
for i in $(seq 1 60); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18090/readyz 2>/dev/null | grep -q 200 && break; sleep 0.5; done
date -u +%H:%M:%S > "$out/times.txt"
.venv/bin/agent-os bench checkpoints --agentos-url http://127.0.0.1:18090 --targets agentos --scales 1k,10k \
  --modes write,mixed --repeat 1 --floor-iterations 0 --results-root "$dir/results" --results-name run > "$out/bench.txt" 2>&1
date -u +%H:%M:%S >> "$out/times.txt"
sleep 70
curl -s http://127.0.0.1:18090/metrics | grep -E '^agentos_(compacted|payload_)' > "$out/metrics.txt"
du -sb "$dir/data/wal/1" "$dir/data/db" > "$out/disk.txt"
ls -l "$dir/data/wal/1" >> "$out/disk.txt"
kill -TERM $(pgrep -f '^agent-os: supervisor'); sleep 3
date -u +%H:%M:%S >> "$out/times.txt"
rm -rf "$dir"
