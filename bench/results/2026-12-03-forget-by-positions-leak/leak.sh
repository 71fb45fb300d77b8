# usage: leak.sh TAG  -> start a tree (passes every 5 s), 5 rounds of overwrites, wait, stop, count
cd /work/main
printf 'storage: {compaction_interval_secs: 5}\n' > /tmp/x/cfg5.yaml
rm -rf /tmp/x/data
AGENTOS_STORAGE_DIR=/tmp/x/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18090 setsid .venv/bin/agent-os serve --config /tmp/x/cfg5.yaml > /tmp/x/server-$1.log 2>&1 &
for i in $(seq 1 100); do grep -q "serving on" /tmp/x/server-$1.log && break; sleep 0.1; done
.venv/bin/python bench/results/2026-12-03-forget-by-positions-leak/overwrite.py 5
sleep ${WAIT:-90}
kill -TERM $(pgrep -f '^agent-os: supervisor'); while pgrep -f '^agent-os: supervisor' >/dev/null; do sleep 0.1; done
.venv/bin/python bench/results/2026-12-03-forget-by-positions-leak/logcount.py /tmp/x/data
grep -c "dropped" /tmp/x/server-$1.log; grep -E "ERROR|Traceback" /tmp/x/server-$1.log | head -3
