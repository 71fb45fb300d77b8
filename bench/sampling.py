"""Sampling a process tree while a benchmark point runs: peak memory and CPU seconds.

Memory is read from /proc/PID/smaps_rollup (RSS, and Private_Dirty, what each process really
costs: shared interpreter pages are not counted again per process). CPU is utime + stime.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Iterable

from agentos.status import proc_memory, tree_memory
from bench.server_proc import cpu_seconds

PidsFn = Callable[[], Iterable[int]]


def machine_busy_secs() -> float:
    """CPU seconds all cores spent busy (not idle, not iowait) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def written_bytes(pid: int) -> int:
    """Bytes the process caused to be written to storage (/proc/PID/io write_bytes; 0 if gone)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("write_bytes:")), 0)
    except (OSError, ValueError):
        return 0


def disk_counters(path: str) -> dict | None:
    """The block device under `path`, from /proc/diskstats: writes, MB written, cache flushes and
    the ms the device spent on each (None where the file or its flush fields are missing)."""
    dev = os.stat(path).st_dev
    key = (os.major(dev), os.minor(dev))
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                if (int(fields[0]), int(fields[1])) == key and len(fields) >= 20:
                    return {"device": fields[2], "writes": int(fields[7]), "write_mb": int(fields[9]) * 512 / 1e6,
                            "write_ms": int(fields[10]), "flushes": int(fields[18]), "flush_ms": int(fields[19])}
    except OSError:
        pass
    return None


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
