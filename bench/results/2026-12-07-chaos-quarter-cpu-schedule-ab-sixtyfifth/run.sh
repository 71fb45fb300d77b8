#!/bin/bash
# ARM NAME: the suite's chaos command at a quarter of a CPU, results kept under /tmp/chaosab/ARM
G=/sys/fs/cgroup/cpu/slowchaos
mkdir -p $G; echo 25000 > $G/cpu.cfs_quota_us
cd /work/main
mkdir -p /tmp/chaosab/$1
(echo $BASHPID > $G/cgroup.procs; /usr/bin/time -f "%e s" .venv/bin/python -m agentos.cli bench chaos --seconds 20 --kill-every 1.4 \
    --warmup 4 --cooldown 4 --deadline 45 --seed ${SEED:-3} --turn-clients 4 --checkpoint-clients 2 --flow-clients 2 \
    --close-clients 1 --busy-log --stall-every 5 --results-root /tmp/chaosab/$1 --name $2) > /tmp/chaosab/$1-$2.txt 2>&1
grep -E "lost =" /tmp/chaosab/$1-$2.txt | cut -c1-40; tail -1 /tmp/chaosab/$1-$2.txt
