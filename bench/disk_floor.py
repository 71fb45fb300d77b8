"""The disk's own fsync floor: what one durable 4 KB append costs with nothing else in the way.

Owns: a loop of `os.write` (append, 4 KB) + `os.fdatasync` on a scratch file in the directory
under test, its latency percentiles, and which device that directory lives on. Never does:
anything concurrent, O_DIRECT, or preallocation — it is the QD=1 `fio --fsync=1` number of the
reference article, the floor under every checkpoint commit on that disk.

An *append* makes fdatasync also flush the file size (a journal commit on ext4/xfs); PostgreSQL's
WAL overwrites pre-zeroed 16 MB segments and skips that, so its per-commit floor can be a little
lower than this one. The number is a floor for our log (which appends), an estimate for theirs.

    python -m bench.disk_floor [DIRECTORY] [-n 2000]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from time import perf_counter

from bench.stats import percentile

DEFAULT_ITERATIONS = 2000
BLOCK_BYTES = 4096


def device_of(path: str | os.PathLike) -> dict:
    """`st_dev` of a path plus what `df` says it is mounted from (source and mount point)."""
    info: dict = {"path": str(path), "st_dev": os.stat(path).st_dev}
    try:
        out = subprocess.run(["df", "-P", str(path)], capture_output=True, text=True,
                             timeout=10, check=True).stdout.splitlines()
        fields = out[-1].split()
        info["source"], info["mount"] = fields[0], fields[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass  # df is a nicety for the report; st_dev is the real check
    return info


def fsync_floor(directory: str | os.PathLike, n: int = DEFAULT_ITERATIONS,
                block_bytes: int = BLOCK_BYTES) -> dict:
    """Append `block_bytes` and fdatasync, `n` times, in a scratch file inside `directory`."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    block = os.urandom(block_bytes)
    fd, name = tempfile.mkstemp(prefix=".fsync-floor-", dir=directory)
    latencies: list[float] = []
    try:
        os.close(fd)
        fd = os.open(name, os.O_WRONLY | os.O_APPEND)
        try:
            for _ in range(n):
                t0 = perf_counter()
                os.write(fd, block)
                os.fdatasync(fd)
                latencies.append((perf_counter() - t0) * 1000)
        finally:
            os.close(fd)
    finally:
        os.unlink(name)
    ordered = sorted(latencies)
    return {
        "directory": str(directory),
        "device": device_of(directory),
        "n": n,
        "block_bytes": block_bytes,
        "p50_ms": round(percentile(ordered, 50), 4),
        "p99_ms": round(percentile(ordered, 99), 4),
        "mean_ms": round(math.fsum(ordered) / n, 4),
        "max_ms": round(ordered[-1], 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.disk_floor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("directory", nargs="?", default=tempfile.gettempdir(),
                        help="a directory on the disk under test (default: %(default)s)")
    parser.add_argument("-n", type=int, default=DEFAULT_ITERATIONS,
                        help="appends, one fdatasync each (default: %(default)s)")
    args = parser.parse_args(argv)
    if not Path(args.directory).is_dir():
        parser.error(f"not a directory: {args.directory}")
    print(json.dumps(fsync_floor(args.directory, args.n), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
