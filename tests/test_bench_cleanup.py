"""A benchmark run leaves neither processes nor data behind.

Every 10k-checkpoint run used to leave about 1 GB of its tree's log and DuckDB files in /tmp
(a 100k run about 12 GB) until the disk filled. This runs the checkpoint benchmark's real
agentos target (the whole process tree) on a tiny workload inside tmp_path. What the tree's log
said during the run stays in the run's row (bench/server_log.py) when the log itself is gone.
"""
from __future__ import annotations

import contextlib

import pytest

from bench import checkpoints
from bench.checkpoint_workload import BenchConfig
from bench.server_proc import pid_alive

pytestmark = pytest.mark.timeout(90)


def warn(log_path: str, when: str) -> None:
    with open(log_path, "a") as log:
        log.write(f"2026-12-03 22:00:00,000 agent-os.test WARNING written {when}\n")


def test_the_checkpoint_benchmark_removes_its_trees_data_and_processes(tmp_path):
    cfg = BenchConfig(scales=("3x4",), modes=("write",), workers=2, op_timeout_secs=10)
    seen: dict = {}

    @contextlib.contextmanager
    def target():
        overrides = checkpoints._overrides(["storage.segment_bytes=1048576"])
        with checkpoints.agentos_started(cfg, str(tmp_path), "local", overrides=overrides) as started:
            seen["dirs"] = [p.name for p in tmp_path.iterdir()]
            seen["pids"] = started.server_pids
            warn(started.log_path, "before the run")   # not the run's to keep
            opened = started.open_worker

            async def open_worker():   # a warning lands in the tree's log during the run's first commit
                worker = await opened()
                commit = worker.commit

                async def commit_and_warn(agent, task, payload):
                    if not agent.startswith("bench-warmup") and not seen.get("warned"):
                        seen["warned"] = True
                        warn(started.log_path, "during the run")
                    await commit(agent, task, payload)
                worker.commit = commit_and_warn
                return worker
            started.open_worker = open_worker
            yield started

    rows, _ = checkpoints.run_benchmark(cfg, [target], progress=lambda s: None)
    (row,) = rows
    assert row["checkpoints"] == 12 and not row["errors"]
    # the row keeps what its tree logged during the run (a slow disk may add lines of the tree's own)
    assert [line for line in row["server_log"] if "agent-os.test" in line] == [
        "2026-12-03 22:00:00,000 agent-os.test WARNING written during the run"]
    # what the tree held on disk after the run: at least its zeroed 1 MiB segment, as configured
    assert 1.0 <= row["disk_mb"] < 64
    assert [d for d in seen["dirs"] if d.startswith("bench-ckpt-")], "the tree ran in a directory of its own"
    assert list(tmp_path.iterdir()) == []
    assert seen["pids"] and not [p for p in seen["pids"] if pid_alive(p)]
