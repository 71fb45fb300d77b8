"""Sampling a process tree while a benchmark point runs: peak memory and CPU seconds, and what
the tree, the machine and the disk did over a measured window.

Memory is read from /proc/PID/smaps_rollup (RSS, and Private_Dirty, what each process really
costs: shared interpreter pages are not counted again per process). CPU is utime + stime.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from agentos.status import proc_memory, tree_memory
from bench import fsync_window
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


def disk_counters(path: str, diskstats: str = "/proc/diskstats") -> dict | None:
    """The block device under `path`, from /proc/diskstats: writes, MB written, discards, MB
    discarded, cache flushes and the ms the device spent on each (None where the file or its
    flush fields are missing). A request's ms count from when it was queued to its completion, so
    a long `write_ms` against few writes means they waited, in the queue or in the device."""
    dev = os.stat(path).st_dev
    key = (os.major(dev), os.minor(dev))
    try:
        with open(diskstats) as f:
            for line in f:
                fields = line.split()
                if (int(fields[0]), int(fields[1])) == key and len(fields) >= 20:
                    return {"device": fields[2], "writes": int(fields[7]), "write_mb": int(fields[9]) * 512 / 1e6,
                            "write_ms": int(fields[10]), "discards": int(fields[14]),
                            "discard_mb": int(fields[16]) * 512 / 1e6, "discard_ms": int(fields[17]),
                            "flushes": int(fields[18]), "flush_ms": int(fields[19])}
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


def named_pids(pids_fn) -> dict[str, int]:
    """A tree's processes by name, from a function giving {name: pid} or just pids."""
    pids = pids_fn()
    return dict(pids) if isinstance(pids, dict) else {str(pid): pid for pid in pids}


def window_sample(url: str, pids_fn, data_dir: Path) -> dict:
    """One end of a measured window: the tree's CPU and written bytes by process, the machine's
    busy CPU, the disk's counters, and (our tree) the log's fdatasync histogram."""
    named = named_pids(pids_fn)
    return {"at": time.monotonic(), "names": named, "cpu": tree_cpu(named.values()),
            "written": {pid: written_bytes(pid) for pid in named.values()}, "busy": machine_busy_secs(),
            "disk": disk_counters(str(data_dir)), "fsyncs": fsync_window.snapshot(url)}


def window_between(first: dict | None, last: dict) -> dict:
    """What the tree and the machine did between two samples: CPU in % of one core, MB each
    process wrote, and the disk's writes and cache flushes (whoever made them)."""
    if first is None:
        return {"server_cpu_percent": None, "log_fsync": None}
    secs = max(1e-6, last["at"] - first["at"])

    def pct(cpu_secs: float) -> float:
        return round(100.0 * cpu_secs / secs, 1)
    by_process = {name: pct(max(0.0, last["cpu"].get(pid, 0.0) - first["cpu"].get(pid, 0.0)))
                  for name, pid in last["names"].items()}
    written = {name: round((last["written"].get(pid, 0) - first["written"].get(pid, 0)) / 1e6, 1)
               for name, pid in last["names"].items()}
    disk = None
    if first["disk"] and last["disk"]:
        disk = {k: round(last["disk"][k] - first["disk"][k], 1) for k in first["disk"] if k != "device"}
        disk["device"] = last["disk"]["device"]
    return {"server_cpu_percent": pct(cpu_delta(first["cpu"], last["cpu"])),
            "server_written_mb_by_process": {k: v for k, v in sorted(written.items()) if v > 0},
            "disk": disk,
            "server_cpu_by_process": {k: v for k, v in sorted(by_process.items()) if v >= 0.5},
            "machine_busy_percent": pct(last["busy"] - first["busy"]),
            "log_fsync": fsync_window.delta(first["fsyncs"], last["fsyncs"])}
