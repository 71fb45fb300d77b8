"""Two or more settings of our server, side by side in one run (`bench checkpoints --compare`).

Owns: reading `KEY=V1,V2,...`, the arms' names and config overrides, and the summary's table of
the arms against the first one. Each round starts one fresh tree per value, so the arms alternate
and a machine that speeds up or slows down during the run touches them alike; odd rounds take the
values in the order given, even rounds in reverse, because the tree that runs first in a round
was seen to gain or lose 4-10% by its place alone (`2026-12-01-compare-commit-window*/`). The
table compares medians and counts the rounds each arm was ahead of the first, since a single pair
of runs on a shared machine swings by more than most changes are worth.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

import yaml

from bench.results import markdown_table


def parse_compare(spec: str) -> tuple[str, list[tuple[str, object]]]:
    """`storage.x=1,2` -> ("storage.x", [("1", 1), ("2", 2)]): each value as written and as YAML."""
    key, sep, raw = spec.partition("=")
    key = key.strip()
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not sep or not key or any(not part for part in key.split(".")):
        raise ValueError(f"--compare: KEY=V1,V2 expected, got {spec!r}")
    if len(values) < 2 or len(set(values)) != len(values):
        raise ValueError(f"--compare: two or more different values expected, got {raw!r}")
    return key, [(v, yaml.safe_load(v)) for v in values]


def override(key: str, value: object) -> dict:
    """A dotted key and its value as the nested config dict a server takes."""
    *parents, leaf = key.split(".")
    out: dict = {leaf: value}
    for part in reversed(parents):
        out = {part: out}
    return out


def arm_name(key: str, raw: str) -> str:
    return f"agentos {key}={raw}"


def compare_table(rows: list[dict]) -> str | None:
    """Per scale × mode and arm: median checkpoints/s and commit p99 over its rounds (and
    repeats), both as a ratio to the first arm, and in how many rounds it did more checkpoints/s
    than the first arm did in the same round."""
    arms = list(dict.fromkeys(r["target"] for r in rows if "round" in r))
    if len(arms) < 2:
        return None
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if "round" in r and r["checkpoints"]:
            by[(r["scale"], r["mode"], r["target"])].append(r)
    lines = []
    for scale, mode in dict.fromkeys((r["scale"], r["mode"]) for r in rows if "round" in r):
        first = by.get((scale, mode, arms[0]))
        if not first:
            continue
        base_tp = statistics.median(r["checkpoints_per_sec"] for r in first)
        base_p99 = statistics.median(r["commit_ms"]["p99"] for r in first)
        base_round = _per_round(first)
        for arm in arms:
            mine = by.get((scale, mode, arm))
            if not mine:
                continue
            tp = statistics.median(r["checkpoints_per_sec"] for r in mine)
            p99 = statistics.median(r["commit_ms"]["p99"] for r in mine)
            rounds = _per_round(mine)
            ahead = "–" if arm == arms[0] else \
                f"{sum(1 for k, v in rounds.items() if k in base_round and v > base_round[k])} of {len(rounds)}"
            lines.append([scale, mode, arm, len(rounds), round(tp, 1), round(tp / base_tp, 3) if base_tp else None,
                          p99, round(p99 / base_p99, 3) if base_p99 else None, ahead])
    return markdown_table(["scale", "mode", "arm", "rounds", "median checkpoints/s", "vs first",
                           "median commit p99 ms", "p99 vs first", "rounds ahead of the first"], lines)


def _per_round(rows: list[dict]) -> dict[int, float]:
    by: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        by[r["round"]].append(r["checkpoints_per_sec"])
    return {k: statistics.median(v) for k, v in by.items()}
