#!/bin/bash
# py-spy record the gateway and writer/store of the agent-os tree started by the bench
out=$1; dur=$2
for i in $(seq 1 60); do
  gw=$(pgrep -f '^agent-os: gateway/0' | head -1); st=$(pgrep -f '^agent-os: writer/store' | head -1)
  [ -n "$gw" ] && [ -n "$st" ] && break; sleep 0.5
done
/work/main/.venv/bin/py-spy record -p $gw -d $dur -r 250 -f raw -o $out.gw.txt --nonblocking > $out.gw.log 2>&1 &
/work/main/.venv/bin/py-spy record -p $st -d $dur -r 250 -f raw -o $out.st.txt --nonblocking > $out.st.log 2>&1 &
wait
