"""A log's spare segments: files zeroed to the segment size ahead of use (storage/segments.py).

A rotation renames a spare into the new segment. The next one is zeroed on a thread once the
current segment is half full; with a count above one (`storage.spare_segments`), writer/log also
asks for more while its log is idle (`refill`), so a burst of up to that many segments of records
rotates into files zeroed before it began instead of writing a segment of zeros for every
segment of records while its commits wait on the same disk (PostgreSQL keeps recycled WAL
files ready for the same reason). A spare is zeroed under a temporary name (`spare.zeroing`)
and renamed when whole, so a file by a spare's name is always ready; one thread zeroes at a time.

A zeroing started because the log was idle is held while the log is busy again (between 1 MB
chunks, until the log has been idle IDLE_SECS or its spare is needed by a rotation or as the next
one ahead): its writes and fdatasyncs would otherwise go on competing with the commits of the
burst that interrupted it — a segment's zeroing takes about half a second on this disk, and the
benchmark's runs began while one was under way.

A burst of LONG_BURST_SECS or more that takes the last spare has the next one zeroed at once,
not from half-way through the new segment: a zeroing took longer than writing half a segment,
so such a burst waited at nearly every rotation (35-36 batches over 100 ms in a 100k write run).
A shorter burst usually ends before it needs one, and its gap zeroes it held: zeroing at once
after every burst cost the 10k runs (bench/results/2026-12-03-spare-at-rotation-*). A rotation
that finds no spare ready still waits for the one being zeroed: beginning a plain segment
instead (the file's size in every fdatasync) did 0.94× the checkpoints/s at 1.76× the commit
p99 at 10k mixed (bench/results/2026-12-03-spares-plain-10k-ab/).
"""
from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from agentos import cpu_layout, metrics

log = logging.getLogger("agent-os.storage")
SPARE = "spare.zero"
ZEROING = "spare.zeroing"
ZERO_CHUNK = 1 << 20    # fdatasync'd at a time
ZERO_WRITE = 16 << 10   # bytes per write (see zero_file)
HOLD_SECS = 0.02        # a held zeroing looks this often whether it may go on
IDLE_SECS = 0.25        # no batch this long: the log is idle, its spares may be zeroed
LONG_BURST_SECS = 2.0   # a burst this long that took the last spare has the next zeroed at once


def spare_names(count: int) -> list[str]:
    """The names of a log's spares: `spare.zero` first (the only one when the count is 1)."""
    return [SPARE] + [f"spare.{i}.zero" for i in range(1, count)]


def zero_file(path: Path, size: int, cancel: threading.Event | None = None,
              hold: Callable[[], bool] | None = None) -> bool:
    """`path` as `size` zero bytes, written (not a hole, not unwritten extents) and fsync'd.

    In small writes (ZERO_WRITE), because the page cache keeps the folio size a write created,
    and dirtying any byte of a folio later writes the whole folio back. With 1 MB writes of zeros,
    each 22 KB append + fdatasync into the segment wrote 47× its bytes to the disk, and a 220 KB one
    5.8×; with 16 KB writes 1.6× and 1.1×, the commits as fast; with 4 KB writes 1.1× / 1.0×, but
    220 KB commits took 0.23 ms at the median instead of 0.16 (Linux 6.18, ext4:
    bench/results/2026-12-01-zeroing-write-amplification/). Between chunks it pauses while `hold()`
    is true. False if `cancel` was set first (the file is then partial)."""
    cancel = cancel or threading.Event()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        zeros = bytes(ZERO_WRITE)
        done = 0
        while done < size:
            if done % ZERO_CHUNK == 0:
                while hold is not None and hold() and not cancel.is_set():
                    cancel.wait(HOLD_SECS)
                if cancel.is_set():
                    return False
            done += os.write(fd, zeros[:size - done])
            if done % ZERO_CHUNK == 0 or done == size:
                # A chunk at a time: 64 MB of dirty zeros flushed at once would queue ahead of the
                # log's own small writes and stall their fdatasync for tens of milliseconds.
                os.fdatasync(fd)
    finally:
        os.close(fd)
    return True


def _zeroed(when: str) -> None:
    # Straight to the counter, not through metrics.inc: this runs on the zeroing thread, and a
    # segment's zeroing is rare enough for the counter's own lock.
    metrics.log_segments_zeroed.labels(when).inc()


class Spares:
    """The spares of one log directory; `count` 0: none (segments are not zeroed)."""

    def __init__(self, directory: Path, segment_bytes: int, count: int,
                 room: Callable[[int], bool] = lambda _: True) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.room = room     # whether the disk takes that many bytes more above the log's floor
        self.paths = [directory / name for name in spare_names(count)] if count > 0 else []
        self.partial = directory / ZEROING
        self.thread: threading.Thread | None = None
        self.cancel = threading.Event()      # closing: a spare being zeroed is given up
        self.needed = threading.Event()      # the spare being zeroed is wanted next: no longer held
        keep = {path.name for path in self.paths}
        for path in directory.glob("spare.*"):
            # a partial spare (a crash while zeroing), spares past the count, or any when not zeroing
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def ready(self) -> Path | None:
        """A spare zeroed to the segment size (one of another size, from another setting, goes)."""
        for path in self.paths:
            try:
                if path.stat().st_size == self.segment_bytes:
                    return path
                path.unlink(missing_ok=True)
            except FileNotFoundError:
                continue
        return None

    def take(self, dest: Path, when: str = "at_rotation") -> None:
        """Rename a ready spare to `dest`: the one being zeroed if none is ready (no longer held),
        or one zeroed now (counted under `when`). OSError if the disk cannot hold it (the partial
        file is the caller's to drop)."""
        spare = self.ready()
        if spare is None and self.zeroing():
            self.wait()
            spare = self.ready()
        if spare is None:
            self._check_room()
            zero_file(self.partial, self.segment_bytes)
            spare = self.partial
            _zeroed(when)
        os.replace(spare, dest)

    def drop_partial(self) -> None:
        self.partial.unlink(missing_ok=True)

    def zeroing(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def refill(self, busy: Callable[[], bool] | None = None) -> bool:
        """Start zeroing one more spare if any is missing and none is being zeroed; held while
        `busy()` (the log is writing again) unless the spare is needed first."""
        return (bool(self.paths) and not self.zeroing() and self.room(self.segment_bytes)
                and self.zero_next("idle", busy))

    def zero_next(self, when: str = "ahead", busy: Callable[[], bool] | None = None) -> bool:
        """Zero the first missing spare on a thread (one at a time); `when` labels it in
        `agentos_log_segments_zeroed_total`. Asked for while one is being zeroed (and perhaps
        held), that one is needed: it is no longer held."""
        if self.zeroing():
            self.needed.set()
            return False
        target = next((path for path in self.paths if not path.exists()), None)
        if target is None:
            return False
        self.needed.clear()
        hold = None if busy is None else (lambda: busy() and not self.needed.is_set())

        def zero() -> None:
            cpu_layout.background_thread()
            try:
                self._check_room()
                if zero_file(self.partial, self.segment_bytes, self.cancel, hold):
                    os.replace(self.partial, target)
                    _zeroed(when)
                else:
                    self.drop_partial()
            except OSError as exc:
                self.drop_partial()
                log.warning("log %s: could not zero the next segment (%s); it will be zeroed when needed",
                            self.directory, exc)
        self.thread = threading.Thread(target=zero, name="wal-spare", daemon=True)
        self.thread.start()
        return True

    def _check_room(self) -> None:
        if not self.room(self.segment_bytes):
            raise OSError(errno.ENOSPC, "a zeroed segment would take the room the log keeps free (storage.min_free_bytes, "
                                        "what writer/store has yet to load, a missing compaction reserve)")

    def wait(self) -> None:
        """Until the spare being zeroed, if any, is ready (no longer held)."""
        self.needed.set()
        if self.thread is not None:
            self.thread.join()

    def close(self) -> None:
        """A spare half zeroed is dropped, not finished on the way out."""
        if self.thread is not None:
            self.cancel.set()
            self.thread.join()
            self.thread = None
