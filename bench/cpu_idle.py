"""How fast a sleeping process wakes on this machine, and a way to make it wake faster.

Owns: the wakeup round trip (two processes passing a byte back and forth over pipes; each pass
wakes a process that slept, on whichever CPU the scheduler picks), and holding a CPU idle-latency
limit through /dev/cpu_dma_latency (the kernel's PM QoS request: while the file stays open, idle
CPUs only enter idle states that wake within the limit; 0 keeps them polling).

Why a benchmark cares: on some virtual machines an idle vCPU halts into the host, and waking it
costs tens of microseconds (measured here on 2026-12-01: 73-93 µs for the round trip across
CPUs, 10 µs on one CPU, 10-14 µs with the limit at 0). Every hop between a client, a server and
its disk pays that, so the same code measured a day apart can differ by 2×. A run records its
round trip; `--cpu-latency-us` holds the same limit for every target of a run alike, as a
latency-tuned host (tuned's latency-performance profile) would.

    python -m bench.cpu_idle [-n 5000] [--cpu-latency-us 0]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import sys
from time import perf_counter
from typing import Iterator

from bench.stats import percentile

QOS_DEVICE = "/dev/cpu_dma_latency"


@contextlib.contextmanager
def idle_latency_limit(us: int | None, device: str = QOS_DEVICE) -> Iterator[int | None]:
    """Hold idle CPUs to wake within `us` microseconds for the block (None: leave them be)."""
    if us is None:
        yield None
        return
    if us < 0:
        raise ValueError(f"an idle-latency limit is >= 0 µs, got {us}")
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as exc:
        raise RuntimeError(f"cannot hold a CPU idle-latency limit: {device}: {exc.strerror} "
                           "(it needs root and a kernel with PM QoS)") from exc
    try:
        os.write(fd, struct.pack("i", us))   # the request lasts as long as the file is open
        yield us
    finally:
        os.close(fd)


def wakeup_round_trip(n: int = 5000) -> dict:
    """Round trips of one byte between this process and a forked child over two pipes, µs."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child only echoes, then leaves without running any of the parent's cleanup
        try:
            for _ in range(n):
                os.read(to_child, 1)
                os.write(from_child, b"x")
        finally:
            os._exit(0)
    took: list[float] = []
    try:
        for _ in range(n):
            t0 = perf_counter()
            os.write(from_parent, b"x")
            os.read(to_parent, 1)
            took.append((perf_counter() - t0) * 1e6)
    finally:
        for fd in (to_child, from_parent, to_parent, from_child):
            os.close(fd)
        os.waitpid(pid, 0)
    took.sort()
    return {"n": n, "p50_us": round(percentile(took, 50), 1), "p99_us": round(percentile(took, 99), 1),
            "mean_us": round(sum(took) / n, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_idle", description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("--cpu-latency-us", type=int, help="hold this idle-latency limit while measuring")
    args = p.parse_args(argv)
    with idle_latency_limit(args.cpu_latency_us):
        print(json.dumps({"cpu_latency_us": args.cpu_latency_us, **wakeup_round_trip(args.n)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
