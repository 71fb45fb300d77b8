"""Two commits of our server side by side: run them in alternating fresh trees, then the table.

An A/B of code cannot be a `--compare` of one config key. `run` checks out each commit's gateway/
and storage/ in turn (the venv installs the checkout in editable mode, so the tree a run starts
runs that code) and runs `bench checkpoints` once per round and commit, into
`runs/<date>-r<round>-<rev>/`; odd rounds take the commits in the order given, even rounds in
reverse. It refuses a work tree with changes under those directories (a checkout would overwrite
them) and restores HEAD's copies at the end, also after a failure (checkouts without overlay: a
file one commit lacks is removed). Then, or alone, it reads those runs back and writes the
folder's table: median checkpoints/s and commit p99 per commit
(`bench.checkpoint_compare.compare_table`, the first commit named being the base), the server's
CPU per checkpoint, every run's row, and a plot of checkpoints/s per round.

    python -m bench.code_ab run FOLDER BEFORE AFTER [--rounds N] -- BENCH_CHECKPOINTS_ARGS...
    python -m bench.code_ab FOLDER BEFORE AFTER
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

from bench.checkpoint_compare import compare_table
from bench.results import markdown_table, plot_rounds

_RUN = re.compile(r"-r(\d+)-([0-9a-f]{7,40})$")
SWAPPED = ("gateway", "storage")     # what differs between the trees compared
ROOT = Path(__file__).resolve().parent.parent


def run_rounds(folder: Path, revs: list[str], rounds: int, bench_args: list[str],
               call: Callable[[list[str]], int] = subprocess.call) -> None:
    """Each round, each commit: check out its SWAPPED directories and run `bench checkpoints`."""
    status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *SWAPPED],
                            capture_output=True, text=True, check=True).stdout
    if status.strip():
        raise SystemExit(f"uncommitted changes under {', '.join(SWAPPED)}; commit or stash them first:\n{status}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "command.txt").write_text(shlex.join(["python", "-m", "bench.code_ab", "run", str(folder), *revs,
                                                    "--rounds", str(rounds), "--", *bench_args]) + "\n")
    try:
        for rnd in range(1, rounds + 1):
            for rev in (revs if rnd % 2 else revs[::-1]):
                _checked(call, ["git", "-C", str(ROOT), "checkout", "-q", "--no-overlay", rev, "--", *SWAPPED])
                _checked(call, [sys.executable, "-m", "bench.checkpoints", *bench_args, "--results-root",
                                str(folder / "runs"), "--results-name", f"r{rnd}-{rev}"])
    finally:
        call(["git", "-C", str(ROOT), "checkout", "-q", "--no-overlay", "HEAD", "--", *SWAPPED])


def _checked(call: Callable[[list[str]], int], argv: list[str]) -> None:
    code = call(argv)
    if code != 0:
        raise SystemExit(f"{shlex.join(argv)} exited with {code}")


def server_cpu_us(row: dict) -> float | None:
    """The server tree's CPU time over the run per checkpoint, in µs."""
    share = (row.get("cpu_percent_of_core") or {}).get("server")
    if share is None or not row.get("checkpoints"):
        return None
    return share / 100.0 * row["duration_secs"] / row["checkpoints"] * 1e6


def read_runs(folder: Path, revs: list[str]) -> list[dict]:
    rows = []
    for run in sorted((folder / "runs").iterdir()):
        match = _RUN.search(run.name)
        if match is None or match.group(2) not in revs or not (run / "rows.jsonl").exists():
            continue
        for line in (run / "rows.jsonl").read_text().splitlines():
            row = json.loads(line)
            row.update(round=int(match.group(1)), target=match.group(2), order=revs.index(match.group(2)))
            rows.append(row)
    rows.sort(key=lambda r: (r["order"], r["round"]))      # the first commit is compare_table's base
    return rows


def summary(rows: list[dict], revs: list[str]) -> str:
    cpu = []
    for scale, mode in dict.fromkeys((r["scale"], r["mode"]) for r in rows):
        for rev in revs:
            values = [v for r in rows if (r["scale"], r["mode"], r["target"]) == (scale, mode, rev)
                      for v in [server_cpu_us(r)] if v is not None]
            if values:
                cpu.append([scale, mode, rev, len(values), round(statistics.median(values)), min(map(round, values)),
                            max(map(round, values))])
    runs = [[r["round"], r["target"], r["scale"], r["mode"], r["checkpoints_per_sec"], r["commit_ms"]["p50"],
             r["commit_ms"]["p99"], round(server_cpu_us(r) or 0)] for r in sorted(rows, key=lambda r: r["round"])]
    return "\n\n".join([
        compare_table(rows) or "(fewer than two commits with runs)",
        markdown_table(["scale", "mode", "commit", "runs", "median server CPU µs per checkpoint", "min", "max"], cpu),
        markdown_table(["round", "commit", "scale", "mode", "checkpoints/s", "commit p50 ms", "commit p99 ms",
                        "server CPU µs per checkpoint"], runs)])


def plot(rows: list[dict], revs: list[str], path: Path) -> None:
    panels = [(f"{scale} · {mode}: checkpoints/s per round",
               {rev: [(r["round"], r["checkpoints_per_sec"]) for r in rows
                      if (r["scale"], r["mode"], r["target"]) == (scale, mode, rev)] for rev in revs})
              for scale, mode in dict.fromkeys((r["scale"], r["mode"]) for r in rows)]
    plot_rounds(path, panels, "checkpoints/s")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run"]:
        rest = args[1:]
        cut = rest.index("--") if "--" in rest else len(rest)
        parser = argparse.ArgumentParser(prog="python -m bench.code_ab run")
        parser.add_argument("folder", type=Path)
        parser.add_argument("revs", nargs=2, metavar="REV")
        parser.add_argument("--rounds", type=int, default=3, choices=range(1, 101), metavar="N")
        opts = parser.parse_args(rest[:cut])
        run_rounds(opts.folder, opts.revs, opts.rounds, rest[cut + 1:])
        args = [str(opts.folder), *opts.revs]
    if len(args) < 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    folder, revs = Path(args[0]), args[1:]
    rows = read_runs(folder, revs)
    if not rows:
        print(f"no runs of {', '.join(revs)} under {folder / 'runs'}", file=sys.stderr)
        return 1
    (folder / "table.md").write_text(summary(rows, revs) + "\n")
    plot(rows, revs, folder / "rounds.png")
    print((folder / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
