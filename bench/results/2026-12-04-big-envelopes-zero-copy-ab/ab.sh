#!/bin/bash
# Side by side: the bus before (BEFORE tree) and after (AFTER tree) the big-envelope change, the
# step benchmark's attribute reads, rounds alternating which tree goes first.
# usage: ab.sh BEFORE_TREE AFTER_TREE ROUNDS OUT_DIR
set -u
before=$1; after=$2; rounds=$3; out=$4
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for arm in $order; do
    tree=$before; [ "$arm" = after ] && tree=$after
    (cd "$tree" && .venv/bin/agent-os bench steps --scenarios $SCEN --runs 1 --duration 10 \
        --name "ab-$arm-r$r" --results-root "$out/runs" >/dev/null 2>&1)
    python3 - "$out" "$arm" "$r" <<'PY'
import json, sys, pathlib
out, arm, r = sys.argv[1], sys.argv[2], int(sys.argv[3])
folder = next(pathlib.Path(out, "runs").glob(f"*-ab-{arm}-r{r}"))
with open(pathlib.Path(out, "rows.jsonl"), "a") as f:
    for line in (folder / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        f.write(json.dumps({"arm": arm, "round": r, **row}) + "\n")
PY
  done
done
