"""How fast this machine runs our kind of Python at the moment: a fixed workload, timed.

Owns: one number per results folder that says how fast the VM's CPUs were during the run. The same
server code did 10,431 checkpoints/s at 07:00 and ~3,200/s at 22:30 on this VM
(bench/results/2026-12-01-morning-code-ab/), and neither its disk floor nor its wakeup round trip
told the two hours apart. The workload is roughly what a checkpoint PUT costs in Python without
I/O: a 22 KB record packed with msgpack and its CRC32C, a small JSON answer, some dict and string
work. Never does: anything concurrent (one thread, one process).
"""
from __future__ import annotations

import statistics
import time

import crc32c
import msgpack
import orjson

PAYLOAD = bytes(range(256)) * 88      # 22,528 bytes


def _one(i: int) -> int:
    body = msgpack.packb({"session": f"s{i}", "tenant": "t", "key": f"k{i}", "seq": i, "payload": PAYLOAD,
                          "at": 1.0})
    crc = crc32c.crc32c(body)
    answer = orjson.dumps({"session_id": f"s{i}", "key": f"k{i}", "seq": i, "durability": "local"})
    head = {}
    for n in range(20):
        head[f"header-{n}"] = f"value {n} {i}".split(" ")[1]
    return crc + len(answer) + len(head)


def python_workload(iterations: int = 2000, trials: int = 5) -> dict:
    """Microseconds per iteration of the workload: the median and the fastest of `trials` timings."""
    if iterations < 1 or trials < 1:
        raise ValueError("iterations and trials must be positive")
    took = []
    for _ in range(trials):
        started = time.perf_counter()
        for i in range(iterations):
            _one(i)
        took.append((time.perf_counter() - started) * 1e6 / iterations)
    return {"iterations": iterations, "trials": trials, "p50_us": round(statistics.median(took), 2),
            "min_us": round(min(took), 2)}


def section(cpu: dict) -> list[str]:
    """The "CPU speed" section of a summary, lines, for a `python_workload` result."""
    return ["", "## CPU speed", "",
            f"A fixed Python workload (a 22 KB record packed and checksummed, a JSON answer, some dict "
            f"work; bench/cpu_speed.py), {cpu['trials']} × {cpu['iterations']} iterations: "
            f"{cpu['p50_us']:.1f} µs per iteration (fastest trial {cpu['min_us']:.1f}). This VM's "
            "speed changes by the hour; compare runs' rates only beside this number."]
