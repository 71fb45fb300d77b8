#!/usr/bin/env bash
set -u
PY=/work/main/.venv/bin/python
ROUNDS=${ROUNDS:-4}
start() {
  rm -rf /tmp/ab/data
  (cd /tmp && env $1 AGENTOS_STORAGE_DIR=/tmp/ab/data AGENTOS_GATEWAY_LISTEN=127.0.0.1:18095 \
     setsid $PY -m agentos.cli serve > /tmp/ab/server-$2.log 2>&1 &)
  for i in $(seq 1 100); do curl -sf http://127.0.0.1:18095/readyz >/dev/null && return 0; sleep 0.2; done
  echo "server $2 not ready"; return 1
}
stop() {
  kill -TERM $(pgrep -f '^agent-os: supervisor') 2>/dev/null
  for i in $(seq 1 100); do pgrep -f '^agent-os: ' >/dev/null || return 0; sleep 0.2; done
}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="be idle"; else order="idle be"; fi
  for name in $order; do
    envs="AOS_NOTHING=1"; [ $name = idle ] && envs="AOS_ZERO_IDLE=1"
    start "$envs" $name-r$r || exit 1
    pid=$(pgrep -f '^agent-os: supervisor')
    (cd /work/main && .venv/bin/python -m bench.checkpoints --agentos-url http://127.0.0.1:18095 --agentos-pid $pid \
       --targets agentos --scales 10k --modes write,mixed --repeat 1 --floor-iterations 0 \
       --results-root /tmp/ab/iores --results-name r$r-$name 2>&1 | grep -E "^agentos 10k" | cut -c1-120 | sed "s/^/r$r $name: /")
    grep -h "ioprio" /tmp/ab/server-$name-r$r.log | head -2
    stop
  done
done
