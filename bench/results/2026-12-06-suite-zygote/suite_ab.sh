#!/bin/bash
cd /work/main
for m in 0 1 0 1; do
  speed=$(.venv/bin/python -c "from bench.cpu_speed import python_workload; print(python_workload()['p50_us'])")
  start=$(date -u +%H:%M:%S)
  /usr/bin/time -f "%e %U %S" -o /tmp/suiteab/time-$m-$start.txt env TEST_ZYGOTE=$m PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -p no:cacheprovider -n 4 --dist worksteal > /tmp/suiteab/out-$m-$start.txt 2>&1
  echo "{\"zygote\": $m, \"start\": \"$start\", \"cpu_workload_us\": $speed, \"result\": \"$(tail -1 /tmp/suiteab/out-$m-$start.txt)\", \"wall_user_sys\": \"$(cat /tmp/suiteab/time-$m-$start.txt)\"}" >> /tmp/suiteab/rows.jsonl
done
echo done > /tmp/suiteab/DONE
