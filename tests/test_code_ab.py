"""`python -m bench.code_ab`: alternating runs of two commits, and the table of a folder of such runs."""
from __future__ import annotations

import json

import pytest

from bench import code_ab


def _run(folder, rnd: int, rev: str, per_sec: float, server_pct: float) -> None:
    run = folder / "runs" / f"2026-12-01-r{rnd}-{rev}"
    run.mkdir(parents=True)
    stats = {"p50": 2.0, "p99": 6.0, "p95": 4.0, "mean": 2.5, "max": 9.0, "n": 10000}
    row = {"target": "agentos", "scale": "10k", "mode": "write", "run": 1, "checkpoints": 10000,
           "duration_secs": 10000 / per_sec, "checkpoints_per_sec": per_sec, "commit_ms": stats,
           "cpu_percent_of_core": {"server": server_pct, "client": 40.0}}
    (run / "rows.jsonl").write_text(json.dumps(row) + "\n")


def test_the_table_puts_the_first_commit_named_first_and_counts_rounds_and_cpu(tmp_path):
    for rnd, (before, after) in enumerate([(4000.0, 4400.0), (4200.0, 4100.0), (3900.0, 4300.0)], start=1):
        _run(tmp_path, rnd, "bbbbbbb", before, 100.0)
        _run(tmp_path, rnd, "aaaaaaa", after, 90.0)
    (tmp_path / "runs" / "2026-12-01-r9-ccccccc").mkdir()       # another commit's run: not read
    assert code_ab.main([str(tmp_path), "bbbbbbb", "aaaaaaa"]) == 0
    table = (tmp_path / "table.md").read_text()
    lines = [line for line in table.splitlines() if "| aaaaaaa |" in line]
    # median 4,300 against 4,000: 1.075×, ahead in rounds 1 and 3
    assert "4,300.0" in lines[0] and "1.07" in lines[0] and "2 of 3" in lines[0]
    # server CPU: 100% of a core over 2.5 s (median run) for 10,000 checkpoints = 250 µs
    cpu = [line for line in table.splitlines() if line.startswith("| 10k | write | bbbbbbb | 3 |")]
    assert "| 10k | write | bbbbbbb | 3 | 250 | 238 | 256 |" in cpu
    assert (tmp_path / "rounds.png").stat().st_size > 0
    assert code_ab.main([str(tmp_path), "ddddddd", "eeeeeee"]) == 1


def test_run_alternates_the_commits_and_restores_head_even_when_a_run_fails(tmp_path, monkeypatch):
    calls = []

    def call(argv):
        calls.append(argv)
        return 1 if argv[-1] == "r2-bbbbbbb" else 0      # the second round's first run fails

    monkeypatch.setattr(code_ab.subprocess, "run", lambda *a, **k: type("P", (), {"stdout": ""})())
    with pytest.raises(SystemExit, match="exited with 1"):
        code_ab.run_rounds(tmp_path, ["aaaaaaa", "bbbbbbb"], 3, ["--scales", "10k"], call=call)
    checkouts = [argv[6] for argv in calls if "checkout" in argv]
    names = [argv[-1] for argv in calls if "bench.checkpoints" in argv]
    assert names == ["r1-aaaaaaa", "r1-bbbbbbb", "r2-bbbbbbb"]         # odd rounds in order, even reversed
    assert checkouts == ["aaaaaaa", "bbbbbbb", "bbbbbbb", "HEAD"]       # HEAD's copies back after the failure
    assert all(argv[-3:-2] == [str(tmp_path / "runs")] or "checkout" in argv for argv in calls)
    assert "--scales 10k" in (tmp_path / "command.txt").read_text()


def test_run_refuses_a_tree_with_changes_it_would_overwrite(tmp_path, monkeypatch):
    monkeypatch.setattr(code_ab.subprocess, "run", lambda *a, **k: type("P", (), {"stdout": " M gateway/app.py\n"})())
    calls = []
    with pytest.raises(SystemExit, match="uncommitted changes"):
        code_ab.run_rounds(tmp_path, ["aaaaaaa", "bbbbbbb"], 1, [], call=calls.append)
    assert calls == []
