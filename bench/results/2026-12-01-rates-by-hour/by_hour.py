"""Every 10-worker 10k write row in bench/results, by the hour its run started: agentos and pgredis."""
import collections
import glob
import json
import os
import statistics
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

root = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
out = os.path.dirname(os.path.abspath(__file__))
seen, points = set(), collections.defaultdict(list)
for f in sorted(glob.glob(f"{root}/**/rows.jsonl", recursive=True)):
    d = os.path.dirname(f)
    try:
        cfg = json.load(open(os.path.join(d, "config.json")))
    except (OSError, ValueError):
        continue
    if not cfg.get("started_at") or cfg.get("bench", {}).get("workers") != 10:
        continue
    for line in open(f):
        r = json.loads(line)
        if r.get("scale") != "10k" or r.get("mode") != "write" or r.get("target") not in ("agentos", "pgredis"):
            continue
        key = (cfg["started_at"], r["target"], r.get("run"), r["checkpoints_per_sec"])
        if key in seen:          # a run copied into two folders counts once
            continue
        seen.add(key)
        points[r["target"]].append((cfg["started_at"], r["checkpoints_per_sec"]))
lines = ["| hour (UTC) | agentos runs | agentos median /s | pgredis runs | pgredis median /s |", "|---|---:|---:|---:|---:|"]
hours = sorted({t[:13] for pts in points.values() for t, _ in pts})
for h in hours:
    cells = []
    for target in ("agentos", "pgredis"):
        v = [x for t, x in points[target] if t[:13] == h]
        cells += [str(len(v)), f"{statistics.median(v):,.1f}" if v else "–"]
    lines.append(f"| {h.replace('T', ' ')}h | " + " | ".join(cells) + " |")
open(os.path.join(out, "table.md"), "w").write("\n".join(lines) + "\n")
fig, ax = plt.subplots(figsize=(10, 4.5))
for target, color in (("agentos", "tab:blue"), ("pgredis", "tab:orange")):
    from datetime import datetime
    xs = [datetime.fromisoformat(t) for t, _ in points[target]]
    ax.scatter(xs, [v for _, v in points[target]], s=8, color=color, label=target)
ax.set_ylabel("checkpoints/s (10k write, 10 workers)")
ax.set_title("Every 10k write run in bench/results by start time (all code versions)")
ax.legend()
fig.autofmt_xdate()
fig.savefig(os.path.join(out, "by_hour.png"), dpi=110, bbox_inches="tight")
print("\n".join(lines))
