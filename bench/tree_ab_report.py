"""The table and plot of a `bench/tree_ab.sh` folder: per scenario, each arm's ops/s round by
round, the ratio of the medians and in how many rounds the second arm was ahead.

    python -m bench.tree_ab_report OUT_DIR "TITLE" [--before NAME] [--after NAME]

Writes OUT_DIR/summary.md (the title, a Conditions section to complete, the table) and
OUT_DIR/rounds.png; the Reading is the author's to write.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.results import markdown_table, plot_rounds

ARMS = ("before", "after")


def read_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines() if line.strip()]


def table(rows: list[dict], names: dict[str, str]) -> str:
    out = []
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        by_arm = {arm: {r["round"]: r for r in rows if r["scenario"] == scenario and r["arm"] == arm} for arm in ARMS}
        before, after = by_arm["before"], by_arm["after"]
        if not before or not after:
            continue
        ops = {arm: statistics.median(r["ops_per_sec"] for r in by_arm[arm].values()) for arm in ARMS}
        p50 = {arm: statistics.median(r["p50_ms"] or 0 for r in by_arm[arm].values()) for arm in ARMS}
        ahead = sum(1 for k, r in after.items() if k in before and r["ops_per_sec"] > before[k]["ops_per_sec"])
        out.append([scenario, " / ".join(f"{before[k]['ops_per_sec']:,.0f}" for k in sorted(before)),
                    " / ".join(f"{after[k]['ops_per_sec']:,.0f}" for k in sorted(after)),
                    f"{ops['after'] / ops['before']:.2f}×" if ops["before"] else "–",
                    f"{p50['before']:.2f} → {p50['after']:.2f}", f"{ahead} of {len(after)}"])
    return markdown_table(["scenario", f"{names['before']} ops/s (rounds)", f"{names['after']} ops/s",
                           f"{names['after']} / {names['before']} (medians)", "p50 ms (medians)",
                           f"rounds {names['after']} ahead"], out)


def plot(rows: list[dict], names: dict[str, str], path: Path) -> None:
    panels = [(f"{scenario}: ops/s per round",
               {names[arm]: [(r["round"], r["ops_per_sec"]) for r in rows if r["scenario"] == scenario and r["arm"] == arm]
                for arm in ARMS})
              for scenario in dict.fromkeys(r["scenario"] for r in rows)]
    plot_rounds(path, panels, "ops/s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tree_ab_report", description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("title")
    p.add_argument("--before", default="before")
    p.add_argument("--after", default="after")
    args = p.parse_args(argv)
    names = {"before": args.before, "after": args.after}
    rows = read_rows(args.folder)
    (args.folder / "summary.md").write_text(f"# {args.title}\n\n## Conditions\n\n{table(rows, names)}\n")
    plot(rows, names, args.folder / "rounds.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
