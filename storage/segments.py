"""Segment files of one log: append, fsync, rotate, recover a torn tail, read back.

A log is a directory of segment files named by the global byte position where each starts
(`00000000000000000000.seg`), so a record's position is stable across rotation and the
store can resume from a position (their listing: storage/segment_listing.py). A new segment's
file and directory entry are fsync'd before anything is acknowledged from it. Opening a log
scans its last segment and clears a torn tail back to the last whole record.

Segments are pre-zeroed to their full size when created (as PostgreSQL does with its WAL): an
append then overwrites allocated blocks without changing the file's size, so its fdatasync
flushes only those blocks: no inode write for the new size, and on a journaled ext4 no journal
commit, which also carries every other file's pending data (DuckDB's, the payload file's).
Measured on this disk with a second process appending and syncing 2 MB every 60 ms (four
alternating runs of 400 writes): a 100 KB pwrite + fdatasync at the end of a file took p50
0.63-0.70 ms / p99 4.3-4.8 ms, the same into a zeroed file 0.38-0.46 / 1.2-2.3 ms. So a segment's data
ends at its first non-whole record, not at the file's size: zero bytes never parse as one.
`storage.zero_segments: false` (`preallocate=False`) appends to plain files instead, for
filesystems where an overwrite saves nothing (copy-on-write ones).
The next segment is zeroed ahead of time on a background thread, once the current one is half
full (not at start, where it would compete with the first commits for the disk), and with
`storage.spare_segments` above one, more of them while the log is idle: storage/spares.py.

Blocking calls only. writer/log calls `SegmentLog.write` on its event loop's thread (the loop has
nothing else to do while a batch is written; the gateway's own log does the same for a batch a
client waits on) and everything else on its I/O thread, one at a time.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from storage import damaged_records, freeing, records
from storage.free_space import FreeSpaceFloor
from storage.freeing import fsync_dir   # the log's own, and its readers' (re-exported)
from storage.spares import IDLE_SECS, LONG_BURST_SECS, Spares
from storage.segment_listing import list_segments, locate, segment_name, segments_from

log = logging.getLogger("agent-os.storage")
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024   # buffers per pwritev
FIRST_READ = 64 << 10   # a read first looks this far: past the data a zeroed tail costs one small read


def whole_records(f, offset: int, max_bytes: int, keep: bool = True, buffer: bytearray | None = None):
    """(records, bytes consumed, at_end) of the whole records in open file `f` from `offset`,
    reading at most about `max_bytes`. Records are (offset from `offset`, kind, id, body, next
    offset); at_end says nothing whole follows (a zeroed tail, a torn record, the file's end)
    as opposed to the read limit cutting a record. Reads go into `buffer` when it is large
    enough (the records returned are copies, so the caller may reuse it at once)."""
    out: list = []
    consumed = 0
    want = min(max_bytes, FIRST_READ)
    while True:
        f.seek(offset + consumed)
        if buffer is not None and want <= len(buffer):
            view = memoryview(buffer)
            data = view[:f.readinto(view[:want])]
        else:
            data = f.read(want)
        got = 0
        for off, kind, record_id, body, end in records.scan(data):
            if keep:
                out.append((consumed + off, kind, record_id, body, consumed + end))
            got = end
        consumed += got
        if len(data) < want:
            return out, consumed, True          # the file ends here
        if consumed >= max_bytes:
            return out, consumed, False
        if got == len(data):
            # The read ended on a record's end, and the file goes on: read on. Taken for the
            # data's end, it made a reader skip the rest of a sealed segment (found by
            # bench/session_reads.py: one read in about as many as a record's bytes ends so).
            want = min(want * 8, max_bytes - consumed)
            continue
        needed = records.claimed_length(data, got)
        if needed is None:
            return out, consumed, True         # zeros or garbage: the data ends here
        if got + needed <= len(data):
            return out, consumed, True         # a record that claims to fit yet did not parse: torn
        want = min(max(want * 8, needed), max(max_bytes - consumed, needed))


@dataclass
class Recovery:
    segments: int
    end: int
    records_in_last: int
    truncated_bytes: int


class SegmentLog:
    """The writing end. Not thread-safe: one thread at a time."""

    def __init__(self, directory: Path, segment_bytes: int, preallocate: bool = True, spares: int = 1,
                 min_free_bytes: int = 0) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.preallocate = preallocate
        self.floor = FreeSpaceFloor(directory, min_free_bytes, segment_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        freeing.release_leftovers(self.directory)
        self.spares = Spares(directory, segment_bytes, spares if preallocate else 0, self.floor.leaves_margin)
        self.fd = -1
        self.start = 0      # position of the current segment's first byte
        self.size = 0       # bytes of records in the current segment
        self.spare_started = False   # the next segment's zeroing has begun (or it was there already)
        self.rotations = 0           # segments sealed since open: a log that never fills one needs one spare
        self.last_phases = (0.0, 0.0, 0.0, 0.0)   # the last write's seconds: rotating, writing, syncing, on CPU
        # When the last write began (writer/log's idle clock too), and when the writes began that
        # had no IDLE_SECS between them since (a burst).
        self.busy_since = self.last_write_at = time.monotonic()
        self.recovery = self._open()

    @property
    def end(self) -> int:
        return self.start + self.size

    def _open(self) -> Recovery:
        segments = list_segments(self.directory)
        if not segments:
            self._create(0)
            return Recovery(0, 0, 0, 0)
        self.start, path = segments[-1]
        data = path.read_bytes()
        good, count = 0, 0
        for _, _, _, _, nxt in records.scan(data):
            count += 1
            good = nxt
        torn = len(data.rstrip(b"\0")) - good if len(data) > good else 0
        torn = max(torn, 0)
        self.fd = os.open(path, os.O_WRONLY)
        # A writer killed between a batch's write and its fdatasync left that batch whole in the
        # page cache: it is found above and counts as the log's, so make it durable before anyone
        # is told where the log ends.
        os.fdatasync(self.fd)
        if torn:
            damaged = damaged_records.keep_before_clearing(self.directory, path, self.start, data, good, torn)
            # Zeros, not a shorter file: the segment stays allocated, and a later shorter record
            # never leaves a stale tail that could read as whole.
            os.pwrite(self.fd, bytes(torn), good)
            os.fsync(self.fd)
            log.warning("log %s: truncated %s of %d bytes at position %d", self.directory,
                        "the damaged tail" if damaged else "a torn tail", torn, self.start + good)
        self.size = good
        return Recovery(len(segments), self.start + good, count, torn)

    def _create(self, position: int) -> None:
        path = self.directory / segment_name(position)
        if self.preallocate:
            try:
                self.spares.take(path, "at_rotation" if self.fd >= 0 else "at_open")
            except OSError as exc:
                # No room for a whole zeroed segment (a full disk): append to a plain file instead,
                # which fails only when the disk cannot take the records themselves.
                self.spares.drop_partial()
                log.warning("log %s: could not zero a %d-byte segment (%s); appending to a plain one",
                            self.directory, self.segment_bytes, exc.strerror)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.fsync(fd)
        fsync_dir(self.directory)
        if self.fd >= 0:
            os.close(self.fd)
            self.rotations += 1
        self.fd, self.start, self.size = fd, position, 0
        self.spare_started = False
        if (self.preallocate and self.rotations and self.spares.ready() is None
                and self.last_write_at - self.busy_since >= LONG_BURST_SECS):
            # A long burst took the last spare: the next one is zeroed from now, not from half-way
            # through this segment, or it waits at every rotation from here on (a zeroing took
            # longer than writing half a segment). A short one ends first, and its gap zeroes them.
            self._prepare_spare()

    def _prepare_spare(self) -> None:
        """Zero the next segment's file now, off the writing thread, so a rotation only renames it."""
        self.spare_started = True
        if self.spares.ready() is None:
            self.spares.zero_next()

    def refill(self, busy: Callable[[], bool] | None = None) -> bool:
        """Zero one more spare (up to `spares`) while nothing is written: writer/log's idle call,
        held while `busy()`. Only once a segment has filled since open: a quiet log (a test's, a
        new server's) keeps the one spare it needs instead of zeroing several segments it may
        never reach."""
        return self.fd >= 0 and self.rotations > 0 and self.spares.refill(busy)

    def jump_to(self, position: int) -> None:
        """Continue the log at a later position (a range compacted away in the bucket)."""
        if position > self.end:
            if self.size:
                os.fdatasync(self.fd)
                self._create(position)
            else:
                os.close(self.fd)
                os.unlink(self.directory / segment_name(self.start))
                self.fd = -1
                self._create(position)

    def read_range(self, start: int, end: int) -> bytes:
        """The bytes of [start, end) from the local segments (to ship what the bucket lacks)."""
        out = []
        segs = segments_from(self.directory, start)
        for index, (seg_start, path) in enumerate(segs):
            # A sealed segment's data ends where the next begins; the rest of its file is zeros.
            seg_end = seg_start + path.stat().st_size
            if index + 1 < len(segs):
                seg_end = min(seg_end, segs[index + 1][0])
            if seg_end <= start or seg_start >= end:
                continue
            with open(path, "rb") as f:
                f.seek(max(0, start - seg_start))
                out.append(f.read(min(end, seg_end) - max(start, seg_start)))
        return b"".join(out)

    def write(self, data: bytes | list[bytes], sync: bool) -> int:
        """Append whole frames (bytes, or a list of frames written as they are, without joining
        them first); fdatasync if asked. Returns the end position after them."""
        length = len(data) if isinstance(data, bytes) else sum(map(len, data))
        self.floor.check(length)   # before anything is written: a refused batch leaves no trace
        began, cpu = time.monotonic(), time.thread_time()
        if began - self.last_write_at >= IDLE_SECS:
            self.busy_since = began
        self.last_write_at = began
        if self.size and self.size + length > self.segment_bytes:
            if sync:
                os.fdatasync(self.fd)
            self._create(self.end)
        rotated = time.monotonic()
        at = self.size
        try:
            if isinstance(data, list) and 0 < len(data) <= IOV_MAX:
                at += os.pwritev(self.fd, data, at)
                data = b"".join(data)[at - self.size:] if at - self.size < length else b""   # a short write
            elif isinstance(data, list):
                data = b"".join(data)
            view = memoryview(data)
            while view:
                written = os.pwrite(self.fd, view, at)
                view = view[written:]
                at += written
            wrote = time.monotonic()
            if sync:
                os.fdatasync(self.fd)
        except OSError:
            # Leave the segment ending on a whole record (a full disk may have taken half a frame).
            try:
                os.pwrite(self.fd, bytes(at - self.size), self.size)
            except OSError:
                pass
            raise
        self.size += length
        synced = time.monotonic()
        self.last_phases = (rotated - began, wrote - rotated, synced - wrote, time.thread_time() - cpu)
        if self.preallocate and not self.spare_started and self.size * 2 >= self.segment_bytes:
            self._prepare_spare()
        return self.end

    def close(self) -> None:
        self.spares.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def recent_ids(directory: Path, max_bytes: int) -> list[bytes]:
    """Ids of the records in the last `max_bytes` of the log, oldest first (for de-duplication)."""
    ids: list[bytes] = []
    budget = max_bytes
    chosen = []
    for start, path in reversed(list_segments(directory)):
        chosen.append(path)
        budget -= path.stat().st_size
        if budget <= 0:
            break
    for path in reversed(chosen):
        ids.extend(record_id for _, _, record_id, _, _ in damaged_records.scan_all(path.read_bytes()))
    return ids


def log_end(directory: Path, hint: int = 0) -> int:
    """Where the log's records end on disk now; `hint`, a record boundary at or before the end
    (what a reader has read), saves scanning from the last segment's start."""
    segs = segments_from(directory, hint)
    if not segs:
        return 0
    start, path = segs[-1]
    offset = hint - start if hint >= start else 0
    with open(path, "rb") as f:
        _, consumed, _ = whole_records(f, offset, 1 << 62, keep=False)
    return start + offset + consumed


PAGE = 4096
FOLIO_MAX = 2 << 20    # the largest folio the page cache builds: a drop starts this far back


def drop_behind(fd: int, begin: int, end: int) -> None:
    """What lies before `end` leaves the page cache: read and durable, nobody reads it again soon.
    On a VM whose free memory goes back to the host, a page cache that only grows takes every
    new page cold: zeroing a spare segment into new pages took 220-630 ms of CPU, into pages a
    dropped segment had just freed 30-44 ms (2026-12-03, Firecracker with free page reporting).
    The kernel drops only whole folios inside the range, so it starts at a FOLIO_MAX boundary
    before `begin` (a folio the last read ended in goes now) and ends at the page `end` is in."""
    low, high = begin // FOLIO_MAX * FOLIO_MAX, end // PAGE * PAGE
    if high > low:
        try:
            os.posix_fadvise(fd, low, high - low, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass   # advice only


class SegmentReader:
    """The reading end, for the store: every whole record from a position, across segments. What it
    has read leaves the page cache (`drop_behind`): the store reads each record once."""

    def __init__(self, directory: Path, position: int, mend: Callable[[int], bool | None] | None = None) -> None:
        self.directory = directory
        self.position = position
        self.damaged = 0     # damaged stretches passed over (storage/damaged_records.py)
        # Asked to mend the damage at a position from the bucket's copy (storage/bucket_mending.py)
        # before passing over it: True once mended, False if it cannot be, None to be asked again later.
        self.mend = mend
        self.mend_asked: set[int] = set()
        self.mended = 0
        # One buffer for every read: a fresh one of megabytes per batch came from new pages each
        # time (writer/store took ~6 page faults and ~20 µs of system time per checkpoint so).
        self.buffer = bytearray()

    def read(self, max_bytes: int, limit: int | None = None) -> list[tuple[int, int, bytes, bytes, int]]:
        """(position, kind, id, body, next position) of whole records from the current position,
        about `max_bytes` of them, across as many segments as that takes (a read that stopped at
        each segment's end came back short: writer/store then waited its batch interval, so
        catching up over compacted or small segments went at one segment a second), none ending
        past `limit` if given. A writer writes a batch before its fdatasync, so a file can hold
        whole records that are not durable yet, and that a failed fdatasync zeroes back or a
        crash loses: the store reads only up to the end its writers reported durable."""
        segments, index = locate(self.directory, self.position)
        out: list = []
        remaining = max_bytes
        for index in range(index, len(segments)):
            start, path = segments[index]
            nxt = segments[index + 1][0] if index + 1 < len(segments) else None
            if nxt is not None and nxt <= self.position:
                continue
            if start > self.position:
                # The position fell between segments (a rotation): continue at this one.
                self.position = start
            size = path.stat().st_size
            if nxt is None and self.position > start + size:
                # The writer truncated a torn tail we had already read (it was never acknowledged):
                # carry on from where the log now ends, or we would skip what is written next.
                log.warning("log %s ends at %d, before the reader's position %d; continuing from its end",
                            self.directory, start + size, self.position)
                self.position = start + size
            budget = remaining if limit is None else min(remaining, limit - self.position)
            if budget <= 0:
                break
            if len(self.buffer) < budget:
                self.buffer = bytearray(budget)
            with open(path, "rb") as f:
                found, consumed, at_end = whole_records(f, self.position - start, budget, buffer=self.buffer)
                if limit is not None and found and self.position + found[-1][4] > limit:
                    # whole_records may return one record past its budget: that one is not durable yet
                    found = [r for r in found if self.position + r[4] <= limit]
                    consumed, at_end = (found[-1][4] if found else 0), False
                drop_behind(f.fileno(), self.position - start, self.position - start + consumed)
            out += [(self.position + off, kind, record_id, body, self.position + end)
                    for off, kind, record_id, body, end in found]
            self.position += consumed
            remaining -= consumed
            if at_end and (nxt is not None or (limit is not None and self.position < limit)):
                # Nothing whole follows, yet this is data known whole: a sealed segment's records
                # run to its zero tail, and the writer said its log is whole up to `limit`.
                past = damaged_records.look_past(path, start, self.position, nxt, limit)
                if past is not None and self.position not in self.mend_asked and self.mend is not None:
                    mended = self.mend(self.position)
                    if mended is None:
                        break      # asked again by a later read (one after a restart)
                    self.mend_asked.add(self.position)   # once: a mend that did not take is not asked again
                    if mended:
                        self.mended += 1
                        break      # the next read takes the bucket's copy from here
                if past is not None:
                    damaged_records.skipping(self.directory, self.position, past)
                    self.damaged += 1
                    if nxt is None or past < nxt:
                        self.position = past
                        break      # the next read goes on from there
            if nxt is None or not at_end:
                break      # the log's end, or the budget ended inside this segment
            # This segment is exhausted and a newer one exists: move on.
            self.position = nxt
        return out
