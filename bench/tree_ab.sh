#!/bin/bash
# Two trees side by side on the step benchmark: ROUNDS rounds, each running the scenarios once on a
# fresh server of each tree (BEFORE first in odd rounds, AFTER first in even ones), every run's
# rows gathered with its arm and round in OUT/rows.jsonl (each run's own folder under OUT/runs).
# For code outside gateway/ and storage/ (bench/code_ab.py swaps only those): the broker, the actors.
#   bench/tree_ab.sh BEFORE_TREE AFTER_TREE ROUNDS OUT_DIR SCENARIOS   (each tree with its own .venv)
set -u
before=$1; after=$2; rounds=$3; out=$4; scenarios=$5
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for arm in $order; do
    tree=$before; [ "$arm" = after ] && tree=$after
    (cd "$tree" && .venv/bin/agent-os bench steps --scenarios "$scenarios" --runs 1 --duration 10 \
        --name "ab-$arm-r$r" --results-root "$out/runs" >/dev/null 2>&1)
    python3 - "$out" "$arm" "$r" <<'PY'
import json, sys, pathlib
out, arm, r = sys.argv[1], sys.argv[2], int(sys.argv[3])
folder = next(pathlib.Path(out, "runs").glob(f"*-ab-{arm}-r{r}"))
with open(pathlib.Path(out, "rows.jsonl"), "a") as f:
    for line in (folder / "rows.jsonl").read_text().splitlines():
        f.write(json.dumps({"arm": arm, "round": r, **json.loads(line)}) + "\n")
PY
  done
done
