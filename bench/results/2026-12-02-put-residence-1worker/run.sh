#!/usr/bin/env bash
# Where a one-worker commit's time goes: the server's own hold of each PUT (its access row's
# duration: from the parsed head to the answer written) against what the client measures, and
# the mean write + fdatasync of the gateway's log (agentos_log_fsync_ms). Run from the repo root.
set -euo pipefail
out=bench/results/2026-12-02-put-residence-1worker
tmp=$(mktemp -d /tmp/aos-residence.XXXX)
AGENTOS_STORAGE_DIR=$tmp/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18093 setsid .venv/bin/agent-os serve > $tmp/serve.log 2>&1 &
trap 'kill -TERM $(pgrep -f "^agent-os: supervisor") 2>/dev/null || true; sleep 3; rm -rf $tmp' EXIT
for _ in $(seq 50); do curl -sf 127.0.0.1:18093/readyz >/dev/null && break; sleep 0.2; done
for round in 1 2 3; do
  .venv/bin/python -m bench.checkpoints --agentos-url http://127.0.0.1:18093 --targets agentos --workers 1 \
      --scales 1000x5 --modes write --repeat 1 --floor-iterations 0 --results-root $tmp/res 2>&1 \
      | grep -E "^agentos " | cut -d, -f1-2 | sed "s/^/round $round: client: /"
done
curl -s 127.0.0.1:18093/metrics | grep -E "^agentos_log_fsync_ms_(sum|count)"
kill -TERM $(pgrep -f "^agent-os: supervisor"); sleep 4
.venv/bin/python - "$tmp" <<'PY'
import glob, sys
import duckdb
db = glob.glob(f"{sys.argv[1]}/data/**/access.db", recursive=True)[0]
con = duckdb.connect(db, read_only=True)
n, p50, p90, p99 = con.execute("select count(*), quantile_cont(duration_ms, 0.5), quantile_cont(duration_ms, 0.9),"
                               " quantile_cont(duration_ms, 0.99) from access where method = 'PUT'").fetchone()
print(f"server hold of a PUT (access rows, parsed head to answer written), n={n}: "
      f"p50 {p50:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms")
PY
