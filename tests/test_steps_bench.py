"""The step benchmark's own arithmetic: how a closed loop counts work in its window, and how the
summary sets s3 against local over a sweep of client counts (unit tests, no server)."""
from __future__ import annotations

import asyncio
import types

from bench.results import ResultsDir
from bench.steps import closed_loop
from bench.steps_report import write_report


def test_closed_loop_counts_each_operation_by_its_share_of_the_window():
    async def op(index: int, n: int) -> None:
        await asyncio.sleep(0.02 + 0.01 * index)   # clients out of step, so edges cut operations

    ended, latencies, errors, window, work = asyncio.run(closed_loop(op, 4, 0.05, 0.4))
    assert errors == 0 and window == 0.4 and len(latencies) == ended > 0
    # An operation contributes its share inside the window: one that straddles either edge counts
    # for less than one (begun in the warm-up) or more than none (ended after the window).
    assert ended - 4 < work < ended + 4
    assert work != ended   # the edges were cut, so some operation counted for part


def _row(durability: str, clients: int, steps: float, per_put: float | None = None) -> dict:
    return {"system": "agent-os", "scenario": "sync_steps", "clients": clients, "durability": durability,
            "unit": "steps/s", "ops_per_sec": steps, "p50_ms": 1.0, "p99_ms": 2.0, "step_p50_ms": 0.1,
            "step_p99_ms": 0.2, "server_cpu_percent": 100.0, "worker_cpu_percent": 50.0, "fsyncs_per_sec": 60.0,
            "puts_per_sec": 40.0 if per_put else None, "per_put": per_put, "s3_cpu_percent": 20.0 if per_put else None}


def test_summary_sets_s3_against_local_at_each_client_count_and_peak_against_peak(tmp_path):
    results = ResultsDir("sweep", tmp_path)
    rows = [_row("local", 512, 3000.0), _row("local", 1024, 2800.0),
            _row("s3", 512, 1800.0, 45.0), _row("s3", 1024, 2520.0, 60.0)]
    args = types.SimpleNamespace(durability="local,s3", workers=2, warmup=3.0, duration=10.0, runs=1)
    write_report(results, rows, args, {"sync_steps": 1772}, {"sync_steps": 2700})
    text = (results.path / "summary.md").read_text()
    assert "| sync_steps | 512 | 3,000.0 | 1,800.0 | 60% | 45.0 |" in text
    assert "| sync_steps | 1024 | 2,800.0 | 2,520.0 | 90% | 60.0 |" in text
    assert "peak against peak: s3 2,520.0 at c=1024 (60.0 per PUT), local 3,000.0 at c=512: 84%." in text
    assert (results.path / "steps.png").stat().st_size > 0
