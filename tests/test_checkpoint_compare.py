"""`bench checkpoints --compare KEY=V1,V2`: our server under each value, side by side.

The table's arithmetic runs on synthetic rows; the command runs end to end on real process
trees (two tiny runs, `storage.durability` local against none, whose answers say which tree
served them).
"""
from __future__ import annotations

import json

import pytest

from bench import checkpoints
from bench.checkpoint_compare import compare_table, override, parse_compare
from bench.checkpoint_report import summary_markdown, window_report


def row(arm: str, rnd: int, per_sec: float, p99: float, mode: str = "write") -> dict:
    summary = {"p50": p99 / 3, "p95": p99 / 2, "p99": p99, "mean": p99 / 3, "max": p99, "n": 10}
    return {"target": arm, "scale": "10k", "mode": mode, "run": 1, "round": rnd, "checkpoints": 1000,
            "duration_secs": 1000 / per_sec, "checkpoints_per_sec": per_sec, "commit_ms": summary,
            "task_ms": summary, "read_ms": summary, "errors": {}, "errors_total": 0, "read_anomalies": 0,
            "reads": {}, "phase": "overwrite", "windows": window_report([0.01 * i for i in range(300)], [p99] * 300, 3.1)}


def test_values_are_read_as_yaml_and_bad_specs_are_refused():
    assert parse_compare("storage.commit_window_us=0, 2000") == ("storage.commit_window_us", [("0", 0), ("2000", 2000)])
    assert parse_compare("gateway.fast_checkpoints=true,false")[1] == [("true", True), ("false", False)]
    for bad in ("storage.x", "storage.x=1", "storage.x=1,1", "=1,2", "storage..x=1,2"):
        with pytest.raises(ValueError, match="--compare"):
            parse_compare(bad)
    assert override("storage.s3.bucket", "b") == {"storage": {"s3": {"bucket": "b"}}}


def test_the_side_by_side_table_compares_medians_and_counts_rounds_ahead():
    a, b = "agentos storage.x=1", "agentos storage.x=2"
    rows = [row(a, 1, 100.0, 4.0), row(b, 1, 120.0, 2.0),
            row(a, 2, 110.0, 4.0), row(b, 2, 100.0, 3.0),
            row(a, 3, 90.0, 6.0), row(b, 3, 130.0, 2.0)]
    table = compare_table(rows)
    assert f"| 10k | write | {a} | 3 | 100.0 | 1.00 | 4.00 | 1.00 | – |" in table
    assert f"| 10k | write | {b} | 3 | 120.0 | 1.20 | 2.00 | 0.50 | 2 of 3 |" in table
    text = summary_markdown(rows, {"bench": {"workers": 10, "repeat": 1},
                                   "compare": {"key": "storage.x", "values": ["1", "2"], "rounds": 3}})
    assert "## Side by side: storage.x" in text and table in text
    assert f"| {b} | 10k | write #3 | 1000 |" in text
    assert compare_table([r for r in rows if r["target"] == a]) is None   # one arm: nothing to compare


def test_compare_runs_a_fresh_tree_per_value_and_round(tmp_path):
    code = checkpoints.main(["--compare", "storage.durability=local,none", "--rounds", "2", "--scales", "3x2",
                             "--modes", "write", "--workers", "2", "--floor-iterations", "0",
                             "--no-log-batches", "--peer-tmp", str(tmp_path), "--results-root", str(tmp_path / "results"),
                             "--results-name", "cmp"])
    assert code == checkpoints.EXIT_OK
    (folder,) = (tmp_path / "results").iterdir()
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    local, none = "agentos storage.durability=local", "agentos storage.durability=none"
    # a tree per value and round, the order reversed in the second round
    assert [(r["target"], r["round"], r["checkpoints"], r["errors_total"]) for r in rows] == \
        [(local, 1, 6, 0), (none, 1, 6, 0), (none, 2, 6, 0), (local, 2, 6, 0)]
    config = json.loads((folder / "config.json").read_text())
    assert config["compare"] == {"key": "storage.durability", "values": ["local", "none"], "rounds": 2}
    # each tree answered with the durability it was started with
    assert config["targets"][local]["durability_acked"] == ["local"]
    assert config["targets"][none]["durability_acked"] == ["none"]
    summary = (folder / "summary.md").read_text()
    assert "## Side by side: storage.durability" in summary and f"| {none} | 2 |" in summary
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("bench-ckpt-")]   # trees removed


def test_compare_refuses_a_running_server_and_bad_specs():
    for argv in (["--compare", "storage.x=1,2", "--agentos-url", "http://127.0.0.1:1"],
                 ["--compare", "storage.x=1"], ["--compare", "storage.x=1,2", "--rounds", "0"]):
        with pytest.raises(SystemExit) as exc:
            checkpoints.main(argv)
        assert exc.value.code == 2
