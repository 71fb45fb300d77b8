#!/bin/bash
# mab.sh MODE N ROUNDS: alternate base worktree and /work/main
mode=$1; n=$2; rounds=$3
for r in $(seq 1 $rounds); do
  for arm in base new; do
    if [ $arm = base ]; then root=/tmp/wt-base; else root=/work/main; fi
    echo -n "$arm "; ROOT=$root /work/main/.venv/bin/python bench/results/2026-12-01-put-path-cpu-in-process/put_path_cpu.py $mode $n
  done
done
rm -rf /tmp/put-path-cpu/data-*
