"""Zeroed segment files: how one is zeroed, and a reserve of them made while the log is idle.

Owns: `zero_file`, and per log up to `storage.reserve_segments` files `reserve-<n>.zero` beside its
segments, each a whole segment of zeros, written by one background thread that works only while
the log has written nothing for IDLE_SECS, and only for a log that fills segments (it has rotated
since it was opened, or had more than one segment then): a log that never fills one would hold the
reserve's disk for nothing. Never does: write while the log is busy, or touch a segment.

Why a reserve: a segment is zeroed before the log writes into it (storage/segments.py), and the
next one is zeroed while the current one fills. During a burst that zeroing competes with the log's
own commits for the disk. 10k checkpoint runs in write mode, three alternating rounds each: with
64 MB segments 12-15% of the log's fdatasyncs took over 0.5 ms and the runs did 8,821-12,843
checkpoints/s; with 512 MB segments, so that no segment was zeroed during a run, 0-1% and
12,527-13,586/s. Zeroing with O_DIRECT instead (no page cache, no flush per chunk) left 8-16% slow:
it is the disk, not the GIL. A rotation takes a reserve file when there is one (a rename), so a
burst that fits in the reserve zeroes nothing while it runs; a longer one falls back to zeroing
the next segment beside it, as without a reserve.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger("agent-os.storage")
ZERO_CHUNK = 1 << 20    # fdatasync'd at a time
ZERO_WRITE = 16 << 10   # bytes per write (see zero_file)
IDLE_SECS = 0.05        # the log wrote nothing this long: the reserve may use the disk
RETRY_SECS = 30.0       # after a failure (a full disk)
FULL_CHECK_SECS = 1.0
PARTIAL = "reserve.partial"


def zero_file(path: Path, size: int, before_chunk: Callable[[], bool] | None = None) -> bool:
    """`path` as `size` zero bytes, written (not a hole, not unwritten extents) and fsync'd.

    In small writes (ZERO_WRITE), because the page cache keeps the folio size a write created,
    and dirtying any byte of a folio later writes the whole folio back. With 1 MB writes of zeros,
    each 22 KB append + fdatasync into the segment wrote 47× its bytes to the disk, and a 220 KB one
    5.8× (Linux 6.18, ext4: /proc/self/io write_bytes over 300 of each); with 16 KB writes 1.6× and
    1.1×, and the commits were as fast. 4 KB writes: 1.1× / 1.0×, but 220 KB commits took 0.21 ms
    at the median instead of 0.15.

    `before_chunk`, if given, is asked before each ZERO_CHUNK: False stops (returns False, the
    file left partial), so a background zeroer can give the disk back (storage/segment_reserve.py)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        zeros = bytes(ZERO_WRITE)
        done = 0
        while done < size:
            if before_chunk is not None and done % ZERO_CHUNK == 0 and not before_chunk():
                return False
            done += os.write(fd, zeros[:size - done])
            if done % ZERO_CHUNK == 0 or done == size:
                # A chunk at a time: 64 MB of dirty zeros flushed at once would queue ahead of the
                # log's own small writes and stall their fdatasync for tens of milliseconds.
                os.fdatasync(fd)
    finally:
        os.close(fd)
    return True


class SegmentReserve:
    def __init__(self, directory: Path, segment_bytes: int, count: int, idle_secs: float = IDLE_SECS) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.count = count
        self.idle_secs = idle_secs
        self.last_write = time.monotonic()   # set by the log on every write
        self.stopping = threading.Event()
        self.armed = threading.Event()       # set by the log: it fills segments, so keep a reserve
        (directory / PARTIAL).unlink(missing_ok=True)   # a zeroing cut short by a stop or a crash
        for path in directory.glob("reserve-*.zero"):
            if path.stat().st_size != segment_bytes:       # another segment size: of no use
                path.unlink()
        self.serial = max((int(p.name[8:-5]) for p in self._ready()), default=0)
        self.thread = threading.Thread(target=self._run, name="wal-reserve", daemon=True)
        self.thread.start()

    def _ready(self) -> list[Path]:
        return sorted(self.directory.glob("reserve-*.zero"), key=lambda p: int(p.name[8:-5]))

    def take(self) -> Path | None:
        """A whole zeroed file for the caller to rename into place, or None."""
        ready = self._ready()
        return ready[0] if ready else None

    def arm(self) -> None:
        self.armed.set()

    def close(self) -> None:
        self.stopping.set()
        self.armed.set()
        self.thread.join()

    def _idle(self) -> bool:
        return time.monotonic() - self.last_write >= self.idle_secs

    def _wait_for_idle(self) -> bool:
        """True once the log is idle; False if stopping."""
        while not self._idle():
            if self.stopping.wait(self.idle_secs):
                return False
        return not self.stopping.is_set()

    def _run(self) -> None:
        self.armed.wait()
        while not self.stopping.is_set():
            if len(self._ready()) >= self.count:
                self.stopping.wait(FULL_CHECK_SECS)   # a rotation takes one: refill within this
                continue
            partial = self.directory / PARTIAL
            try:
                if not zero_file(partial, self.segment_bytes, self._wait_for_idle):
                    continue          # stopping: the partial file goes at the next start
                self.serial += 1
                os.replace(partial, self.directory / f"reserve-{self.serial}.zero")
            except OSError as exc:
                partial.unlink(missing_ok=True)
                log.warning("log %s: could not zero a reserve segment (%s); trying again in %.0f s", self.directory,
                            exc.strerror, RETRY_SECS)
                self.stopping.wait(RETRY_SECS)
