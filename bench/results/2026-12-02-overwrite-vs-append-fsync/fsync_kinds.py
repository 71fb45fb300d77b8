"""One durable write, three ways, in the directory given: a 4 KB append + fdatasync (the
benchmark's floor), an 11 KB append + fdatasync, and an 11 KB overwrite of a pre-zeroed file +
fdatasync (what the gateway's log does: its segments are zeroed ahead). Alternating blocks of
500, three times; p50 / p99 in ms."""
import os
import sys
import time

directory = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
N = 500


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def appends(size):
    path = os.path.join(directory, f"fsync-kinds-append-{size}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    buf, times = os.urandom(size), []
    try:
        for _ in range(N):
            t = time.perf_counter()
            os.write(fd, buf)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return times


def overwrites(size):
    path = os.path.join(directory, "fsync-kinds-prezeroed")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    zeros = bytes(1 << 20)
    for at in range(0, N * size + (1 << 20), 1 << 20):
        os.pwrite(fd, zeros, at)
    os.fsync(fd)
    buf, times, at = os.urandom(size), [], 0
    try:
        for _ in range(N):
            t = time.perf_counter()
            os.pwrite(fd, buf, at)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
            at += size
    finally:
        os.close(fd)
        os.unlink(path)
    return times


results = {"append 4096": [], "append 11264": [], "overwrite pre-zeroed 11264": []}
for _ in range(3):
    results["append 4096"] += appends(4096)
    results["append 11264"] += appends(11264)
    results["overwrite pre-zeroed 11264"] += overwrites(11264)
for name, times in results.items():
    print(f"{name}: n={len(times)} p50 {pct(times, 0.5):.3f} ms p99 {pct(times, 0.99):.3f} ms")
