"""Zero-filled files for the log's next segment (see storage/segments.py for why zeroed).

Also a script, run by path so that it imports nothing of the package (a child's start costs
~10 ms instead of ~100): `python -S storage/zero_fill.py PATH SIZE PARENT_PID`.
"""
from __future__ import annotations

import os
import sys

ZERO_CHUNK = 1 << 20    # fdatasync'd at a time
ZERO_WRITE = 16 << 10   # bytes per write (see zero_file)


def zero_file(path: str | os.PathLike, size: int, wanted=None) -> None:
    """`path` as `size` zero bytes, written (not a hole, not unwritten extents) and fsync'd;
    `wanted()`, asked after each chunk, can stop it with an OSError.

    In small writes (ZERO_WRITE), because the page cache keeps the folio size a write created,
    and dirtying any byte of a folio later writes the whole folio back. With 1 MB writes of zeros,
    each 22 KB append + fdatasync into the segment wrote 47× its bytes to the disk, and a 220 KB one
    5.8×; with 16 KB writes 1.6× and 1.1×, the commits as fast; with 4 KB writes 1.1× / 1.0×, but
    220 KB commits took 0.23 ms at the median instead of 0.16 (Linux 6.18, ext4:
    bench/results/2026-12-01-zeroing-write-amplification/)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        zeros = bytes(ZERO_WRITE)
        done = 0
        while done < size:
            done += os.write(fd, zeros[:size - done])
            if done % ZERO_CHUNK == 0 or done == size:
                # A chunk at a time: 64 MB of dirty zeros flushed at once would queue ahead of the
                # log's own small writes and stall their fdatasync for tens of milliseconds.
                os.fdatasync(fd)
                if wanted is not None and not wanted():
                    raise OSError("the process that wanted it is gone")
    finally:
        os.close(fd)


def zero_file_apart(path: str | os.PathLike, size: int) -> None:
    """`zero_file` in a child process. On a thread of the writing process, each of its thousands
    of small writes took the GIL back from the process's event loop (the gateway's, when it is its
    own log), and each hand-over is a futex sleep and wakeup for one thread or the other."""
    import subprocess
    proc = subprocess.run([sys.executable, "-S", os.path.abspath(__file__), str(path), str(size), str(os.getpid())],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise OSError(f"zeroing {path} failed: {proc.stderr.decode(errors='replace').strip()[-300:]}")


def _main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -S zero_fill.py PATH SIZE PARENT_PID", file=sys.stderr)
        return 2
    parent = int(argv[2])
    try:
        zero_file(argv[0], int(argv[1]), lambda: os.getppid() == parent)
    except OSError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
