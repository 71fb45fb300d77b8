"""The checkpoint bench's warm-up burst: MB of checkpoints on agents of their own before the first
measured run, then a rest; none of it in any run's rows."""
from __future__ import annotations

import asyncio
import time

from bench.checkpoint_report import summary_markdown
from bench.checkpoint_workload import WARM_BURST_PREFIX, BenchConfig, run_target, warm_up_burst


class FakeClient:
    def __init__(self, log: list) -> None:
        self.log = log

    async def commit(self, agent: str, task: int, payload: bytes) -> None:
        self.log.append(("commit", agent, task, len(payload), time.monotonic()))
        await asyncio.sleep(0)

    async def read_latest(self, agent: str):
        self.log.append(("read", agent, None, 0, time.monotonic()))
        return None

    async def close(self) -> None:
        pass


class FakeTarget:
    name = "fake"

    def __init__(self) -> None:
        self.log: list = []

    async def open_worker(self) -> FakeClient:
        return FakeClient(self.log)

    def describe(self) -> dict:
        return {}


def test_the_burst_writes_its_megabytes_from_every_worker_then_rests():
    log: list = []
    cfg = BenchConfig(workers=3, warm_up_mb=2, warm_up_idle_secs=0.2)
    started = time.monotonic()
    written, errors = asyncio.run(warm_up_burst([FakeClient(log) for _ in range(3)], cfg))
    assert errors == 0
    assert written == sum(entry[3] for entry in log) >= 2 << 20
    assert written < (2 << 20) + 3 * 21 * 40 * 1024      # each worker stops after the agent it is on
    assert all(entry[1].startswith(WARM_BURST_PREFIX) for entry in log)
    # each agent's tasks in order, as an agent commits them
    tasks_of = {}
    for _, agent, task, _, _ in log:
        tasks_of.setdefault(agent, []).append(task)
    assert all(tasks == list(range(len(tasks))) for tasks in tasks_of.values())
    assert time.monotonic() - log[-1][4] >= 0.2 - 0.01 and time.monotonic() - started >= 0.2


def test_no_burst_by_default_and_the_measured_runs_come_after_it():
    target = FakeTarget()
    rows = asyncio.run(run_target(target, BenchConfig(scales=("4x2",), modes=("write",), workers=2,
                                                       log_batches=False), progress=lambda line: None))
    assert not any(entry[1].startswith(WARM_BURST_PREFIX) for entry in target.log)
    assert rows[0]["checkpoints"] == 8

    target = FakeTarget()
    cfg = BenchConfig(scales=("4x2",), modes=("write",), workers=2, log_batches=False, warm_up_mb=1,
                      warm_up_idle_secs=0.0)
    rows = asyncio.run(run_target(target, cfg, progress=lambda line: None))
    burst = [i for i, entry in enumerate(target.log) if entry[1].startswith(WARM_BURST_PREFIX)]
    measured = [i for i, entry in enumerate(target.log) if entry[1].startswith(cfg.agent_prefix)]
    assert burst and measured and max(burst) < min(measured)
    assert rows[0]["checkpoints"] == 8 and rows[0]["commit_ms"]["n"] == 8      # the burst is in no row
    summary = summary_markdown(rows, {"bench": {"workers": 2, "repeat": 1, "warm_up_mb": 1,
                                                "warm_up_idle_secs": 0.0}})
    assert "a warm-up burst of 1 MB" in summary
