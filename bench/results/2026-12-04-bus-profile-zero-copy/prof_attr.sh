#!/bin/bash
# profile the attr_read_10x16k scenario's server processes with py-spy
cd /work/main
.venv/bin/agent-os bench steps --scenarios attr_read_10x16k --runs 1 --duration 20 --warmup 3 --name prof-attr2 --results-root /tmp/profres > /tmp/prof_attr_bench.log 2>&1 &
B=$!
sleep 18
for role in "actor/0" "actor/1" "broker"; do
  pid=$(pgrep -f "agent-os: $role\$" | head -1)
  [ -n "$pid" ] && .venv/bin/py-spy record -p $pid -d 6 -f raw -o /tmp/spy_${role//\//_}.txt -r 200 >/dev/null 2>&1 &
done
BP=$(pgrep -f "bench steps --scenarios attr_read_10x16k" | head -1)
.venv/bin/py-spy record -p $BP -d 6 -f raw -o /tmp/spy_client.txt -r 200 >/dev/null 2>&1 &
wait
