"""Sampling a process tree while a benchmark point runs: peak memory and CPU seconds.

Memory is read from /proc/PID/smaps_rollup (RSS, and Private_Dirty, what each process really
costs: shared interpreter pages are not counted again per process). CPU is utime + stime.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable

from agentos.status import proc_memory, tree_memory
from bench.server_proc import cpu_seconds

PidsFn = Callable[[], Iterable[int]]


def memory_by_process(server) -> dict[str, dict[str, int]]:
    """{name: {pid, rss_kib, private_kib, ...}} for every live process of a ServerProcess's tree."""
    return {name: {"pid": pid, **proc_memory(pid)} for name, pid in server.pids().items()}


def tree_cpu(pids: Iterable[int]) -> dict[int, float]:
    return {pid: cpu_seconds(pid) for pid in pids}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two samples (a process that restarted counts from zero)."""
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())


class PeakMemory:
    """Samples the tree's memory on a thread while a point runs; keeps the peak and the last."""

    def __init__(self, pids: PidsFn, every_secs: float = 0.5) -> None:
        self.pids = pids
        self.every = every_secs
        self.peak = {"rss_kib": 0, "private_dirty_kib": 0, "private_kib": 0, "pss_kib": 0}
        self.last = dict(self.peak)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-memory", daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            try:
                now = tree_memory(list(self.pids()))
            except (OSError, ValueError, KeyError):
                now = None
            if now:
                self.last = now
                for key in self.peak:
                    self.peak[key] = max(self.peak[key], now[key])
            if self._stop.wait(self.every):
                return
