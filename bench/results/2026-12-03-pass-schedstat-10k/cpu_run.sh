#!/bin/bash
# cpu_run.sh NAME ANCHOR: like traced_run.sh, sampling per-thread CPU of the server tree + client every 0.2 s
name=$1; anchor=$2
now=$(date +%s.%N)
wait=$(python3 -c "a=$anchor; n=$now; k=int((n-a)//15)+1; t=a+15*k+2.0; print(t-n if t-n>1 else t-n+15)")
sleep $wait
cd /work/main
(timeout 600 .venv/bin/python -m bench.checkpoints --targets agentos --scales 10k --modes write,mixed --repeat 3 --floor-iterations 0 --agentos-url http://127.0.0.1:18090 --results-root /tmp/x/res-$name > /tmp/x/bench-$name.log 2>&1) &
sleep 0.5
pids="$(pgrep -f '^agent-os: (gateway|writer|compaction)' | tr '\n' ' ') $(pgrep -f 'bench.checkpoints' | tr '\n' ' ')"
STEP=0.2 python3 /work/notes/schedstat.py $pids 24 > /tmp/x/cpu-$name.txt 2>&1
wait
grep ' R[123] (' /tmp/x/bench-$name.log | cut -c1-110
