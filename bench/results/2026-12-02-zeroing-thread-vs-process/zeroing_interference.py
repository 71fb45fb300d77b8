"""A commit's write + fdatasync while the next log segment is zeroed: on a thread of the same
process (what the log does), in another process, and with nothing zeroed.

Overwrites 21 KB at a time into a pre-zeroed file and fdatasyncs it (what the log does per batch)
in alternating blocks: quiet (2,000 commits), then for as long as a thread of this process runs
storage.segments.zero_file on a 64 MB file, then for as long as a child process does the same.

    .venv/bin/python bench/results/2026-12-02-zeroing-thread-vs-process/zeroing_interference.py DIR [BLOCKS]
"""
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
from storage.segments import zero_file  # noqa: E402

root = sys.argv[1]
blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SIZE, LOG, SPARE = 21 << 10, 256 << 20, 64 << 20
log_path, spare_path = os.path.join(root, "zi-log"), os.path.join(root, "zi-spare")
zero_file(log_path, LOG)
fd = os.open(log_path, os.O_WRONLY)
payload = os.urandom(SIZE)
at = 0
arms = {"quiet": [], "zeroing thread": [], "zeroing process": []}
took = {"zeroing thread": [], "zeroing process": []}


class ZeroProcess:
    def __init__(self):
        self.p = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[3]); "
                                   "from storage.segments import zero_file; zero_file(sys.argv[1], int(sys.argv[2]))",
                                   spare_path, str(SPARE), ROOT])

    def is_alive(self):
        return self.p.poll() is None


def commits(out: list, until) -> None:
    global at
    while not until():
        t = time.perf_counter()
        os.pwrite(fd, payload, at)
        os.fdatasync(fd)
        out.append((time.perf_counter() - t) * 1000)
        at = (at + SIZE) % (LOG - SIZE)


for _ in range(blocks):
    n0 = len(arms["quiet"])
    commits(arms["quiet"], lambda: len(arms["quiet"]) - n0 >= 2000)
    for arm in ("zeroing thread", "zeroing process"):
        t0 = time.perf_counter()
        if arm == "zeroing thread":
            z = threading.Thread(target=zero_file, args=(spare_path, SPARE))
            z.start()
        else:
            z = ZeroProcess()
        commits(arms[arm], lambda: not z.is_alive())
        took[arm].append(time.perf_counter() - t0)
        os.unlink(spare_path)
os.close(fd)
os.unlink(log_path)
print(f"{'':16s} {'commits':>8s} {'per s':>7s} {'p50 ms':>7s} {'p99 ms':>7s} {'p99.9':>7s} {'mean':>7s}  zeroing 64 MB took")
for arm, xs in arms.items():
    xs.sort()
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
    rate = len(xs) / (sum(xs) / 1000)
    secs = ", ".join(f"{s:.2f}" for s in took.get(arm, [])) or "–"
    print(f"{arm:16s} {len(xs):8d} {rate:7.0f} {q(0.5):7.3f} {q(0.99):7.3f} {q(0.999):7.3f} {statistics.fmean(xs):7.3f}  {secs} s")
