#!/bin/bash
# One worker against a tree started by hand: the client's commit latency (bench), the server's own
# time per PUT (access rows: head parsed -> answer written) and the log's write+fdatasync per batch
# (/metrics), from the same runs.
set -eu
OUT=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/../../.."
rm -rf /tmp/aos-1w && mkdir -p /tmp/aos-1w
env AGENTOS_STORAGE_DIR=/tmp/aos-1w/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18081 .venv/bin/agent-os serve > /tmp/aos-1w/server.log 2>&1 &
for i in $(seq 100); do curl -sf http://127.0.0.1:18081/readyz > /dev/null && break; sleep 0.2; done
.venv/bin/agent-os bench checkpoints --agentos-url http://127.0.0.1:18081 --targets agentos --scales 1k --modes write \
    --workers 1 --repeat 3 --floor-bytes 4096,11264 ${AWAKE:+--cpu-latency-us 0} --results-root /tmp/aos-1w/res | grep -E "ok in|disk floor"
curl -s http://127.0.0.1:18081/metrics | grep -E "^agentos_log_fsync_ms_(bucket|sum|count)" > "$OUT/metrics${AWAKE:+-awake}.txt"
awk '/_sum/ {s=$2} /_count/ {c=$2} END {printf "log write+fdatasync per batch: n=%d mean %.3f ms\n", c, s/c}' "$OUT/metrics${AWAKE:+-awake}.txt"
kill -TERM $(pgrep -f '^agent-os: supervisor'); while pgrep -f '^agent-os: supervisor' > /dev/null; do sleep 0.2; done
.venv/bin/python - <<'PY'
import duckdb
con = duckdb.connect('/tmp/aos-1w/data/db/access.db', read_only=True)
for row in con.execute("select method, count(*), quantile_cont(duration_ms, 0.5), quantile_cont(duration_ms, 0.99) "
                       "from access where route like '%checkpoints%' group by method order by method desc").fetchall():
    print("server time per %s: n=%d p50 %.3f ms p99 %.3f ms" % row)
PY
rm -rf /tmp/aos-1w
