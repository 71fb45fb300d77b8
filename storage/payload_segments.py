"""Checkpoint payloads beside DuckDB: append-only segment files; rows hold (place, length).

Why not BLOB columns: a checkpoint is 2–64 KB, and DuckDB copies every blob through its buffer
pool on insert, so a bulk load of checkpoints costs most of writer/store's CPU and, under a small
`memory_limit`, cannot commit at all (a batch of blobs does not fit). Here a payload costs one
buffered write; DuckDB keeps only small fixed-size columns.

Why segments: superseded payloads are reclaimed one sealed segment at a time
(storage/payload_compaction.py), so each pass touches at most SEGMENT_ROWS rows however many
sessions the store holds — one file rewritten whole needed a join over every row (more than
DuckDB's 16 MB per file once there were a few hundred thousand sessions) and an UPDATE of
millions of rows. A place is `segment << SHIFT | offset`; segment 0 is also the single file of
older versions (`messages.payloads`, renamed on open).

Consistency with DuckDB: the loader appends a batch's payloads, `sync()`s them (fdatasync), then
commits the rows that point at them, so every committed row points at bytes on disk. A new
segment's file and directory entry are fsync'd before anything is appended to it. Bytes past
the last committed row of a segment (a crash between the two) are garbage: `open` cuts them off
and deletes segments no row names, and the records are loaded again from the log. A commit that
failed gives them back at once (`Appender.rewind`).

Two appenders write: the loader's and the compaction's, each to its own segment; every process
start begins new ones (the previous ones are sealed as they are, and compaction merges small
sealed segments).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from storage import freeing
from storage.segments import drop_behind, fsync_dir

SHIFT = 40                     # bits of a place that are the offset within its segment
SEGMENT_BYTES = 64 << 20       # an appender starts a new segment past this size (storage.segment_bytes)…
SEGMENT_ROWS = 16384           # …or this many payloads: bounds a compaction pass's DuckDB work
SYNC_CHUNK = 512 << 10
MAX_IOV = 1024                 # IOV_MAX on Linux
MAX_OPEN_READERS = 64
DIR_NAME = "payloads"
LEGACY_NAME = "messages.payloads"


def place(segment: int, offset: int) -> int:
    return (segment << SHIFT) + offset


def segment_of(at: int) -> int:
    return at >> SHIFT


class Appender:
    """Appends to one segment at a time and starts the next once it is full."""

    def __init__(self, segments: "PayloadSegments") -> None:
        self.segments = segments
        self.number = -1
        self.fd = -1
        self.size = 0                  # bytes appended to the current segment, pending included
        self.rows = 0
        self.pending: list[bytes] = []
        self.begun: list[int] = []     # segments begun since the last `mark()`
        # raises (ENOSPC) if writing so many bytes would take room the disk keeps (free_space.LoadFloor)
        self.floor: Callable[[int], None] | None = None

    def append(self, data: bytes) -> tuple[int, int]:
        """(place, length) of `data`, written on the next `sync()`."""
        if self.fd < 0 or self.size >= self.segments.segment_bytes or self.rows >= SEGMENT_ROWS:
            self._next_segment()
        at = place(self.number, self.size)
        self.pending.append(data)
        self.size += len(data)
        self.rows += 1
        return at, len(data)

    def sync(self) -> None:
        """Write what was appended and make it durable (before the rows naming it commit).

        At most SYNC_CHUNK per flush: the disk is shared with the logs, whose fdatasync otherwise
        queues behind megabytes of these bytes (10k checkpoints: commit p99 about 24.7 ms with
        one flush per batch, 16.5 ms in chunks). Each chunk goes out as one vectored write of the
        payloads themselves, without first joining them into one copy."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        at = self.size - sum(map(len, pending))
        chunk: list[bytes] = []
        size = 0
        for data in pending:
            chunk.append(data)
            size += len(data)
            if size >= SYNC_CHUNK or len(chunk) >= MAX_IOV:
                at = self._write(chunk, size, at)
                chunk, size = [], 0
        if chunk:
            self._write(chunk, size, at)

    def _write(self, parts: list[bytes], size: int, at: int) -> int:
        if self.floor is not None:
            self.floor(size)
        written = os.pwritev(self.fd, parts, at)
        if written < size:      # a short write (rare): the rest the plain way
            rest = memoryview(b"".join(parts))[written:]
            while rest:
                n = os.pwrite(self.fd, rest, at + written)
                rest, written = rest[n:], written + n
        os.fdatasync(self.fd)
        drop_behind(self.fd, at, at + size)   # read rarely (a latest the gateway does not hold): new pages reuse them
        return at + size

    def mark(self) -> tuple[int, int, int]:
        """Where a batch begins: `rewind` goes back here if its rows do not commit."""
        self.begun = []
        return self.number, self.size, self.rows

    def rewind(self, mark: tuple[int, int, int]) -> None:
        """After a failed commit: nothing appended since `mark` is named, and its bytes go. The
        mark's segment is cut back to the mark and the segments begun since are deleted (the one
        being written is emptied and written on). Kept as garbage, a batch's payloads outlived
        every retry on a disk the logs shared: each failed load that spanned segments left them,
        each retry had less room, and the store, stuck behind the log, never freed any (storage/
        free_space.py; payload compaction waits for `storage.payload_compaction_min_mb`)."""
        self.pending = []
        number, size, rows = mark
        begun, self.begun = self.begun, []
        if number == self.number and self.fd >= 0:
            self._cut(self.fd, size)
            self.size, self.rows = size, rows
            return
        if number >= 0:          # sealed when the batch filled it: back to the mark
            self.segments.cut(number, size)
        for other in begun:
            if other == self.number and self.fd >= 0:
                self._cut(self.fd, 0)
                self.size = self.rows = 0
            else:
                try:
                    self.segments.drop(other)
                except OSError:   # no row names it: `open` deletes it
                    pass

    @staticmethod
    def _cut(fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError:   # the bytes past `size` stay as garbage, written over by the next appends
            pass

    def _next_segment(self) -> None:
        self.sync()
        self.close()
        self.number, self.fd = self.segments.create()
        self.begun.append(self.number)
        self.size = self.rows = 0

    def close(self) -> None:
        if self.fd >= 0:
            self.sync()
            os.close(self.fd)
            self.segments.sealed(self.number, self.size)
            self.fd = -1


class PayloadSegments:
    """The segment files of one directory: appenders, reads by place, the sizes compaction weighs."""

    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.lock = threading.Lock()       # the maps below: loader, queries and compaction share them
        self.sizes: dict[int, int] = {}    # sealed segments (no appender writes to them): bytes
        self.next_number = 0
        self.readers: OrderedDict[int, int] = OrderedDict()   # segment -> read-only fd, least recent first
        self.loader = Appender(self)
        self.compactor = Appender(self)

    def path(self, number: int) -> Path:
        return self.dir / f"{number:08d}"

    def open(self, committed: dict[int, int], legacy: Path | None = None) -> list[str]:
        """Take stock of the directory: `committed` is, per segment, where its last committed row
        ends. `legacy`: an older version's single file, which becomes segment 0. Returns what an
        operator should know (stray bytes cut off, segments deleted or short)."""
        notes: list[str] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        if legacy is not None and legacy.exists() and not self.path(0).exists():
            os.rename(legacy, self.path(0))
            fsync_dir(self.dir)
            fsync_dir(legacy.parent)
            notes.append(f"{legacy.name} is now {DIR_NAME}/{self.path(0).name}")
        freeing.release_leftovers(self.dir)
        numbers = sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit())
        removed = False
        for number in numbers:
            path = self.path(number)
            end = committed.get(number)
            if end is None:          # begun, but no row committed into it (or compacted away)
                path.unlink()
                removed = True
                continue
            size = path.stat().st_size
            if size > end:
                with open(path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
                notes.append(f"dropped {size - end} bytes of payloads no committed row names from "
                             f"{DIR_NAME}/{path.name} (loaded again from the log)")
            elif size < end:
                notes.append(f"ERROR: {DIR_NAME}/{path.name} is {end - size} bytes short of what DuckDB's rows "
                             "name: those checkpoints cannot be read")
            self.sizes[number] = end
        for number in sorted(set(committed) - set(numbers)):
            notes.append(f"ERROR: {DIR_NAME}/{self.path(number).name} is missing: the checkpoints whose payloads "
                         "it held cannot be read")
        if removed:
            fsync_dir(self.dir)
        self.next_number = max([*numbers, *committed, -1]) + 1
        return notes

    def create(self) -> tuple[int, int]:
        """A new, empty segment for an appender: (number, fd), durable in the directory."""
        with self.lock:
            number = self.next_number
            self.next_number += 1
        fd = os.open(self.path(number), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fsync_dir(self.dir)
        except OSError:   # a full disk, say: no segment, and no file or descriptor left behind
            os.close(fd)
            self.path(number).unlink(missing_ok=True)
            raise
        return number, fd

    def sealed(self, number: int, size: int) -> None:
        with self.lock:
            self.sizes[number] = size

    def cut(self, number: int, size: int) -> None:
        """A sealed segment's bytes past `size` go (no row names them)."""
        with self.lock:
            if number not in self.sizes:
                return
            self.sizes[number] = size
        try:
            os.truncate(self.path(number), size)
        except OSError:   # garbage past every named place: `open` cuts it off
            pass

    def sealed_segments(self) -> dict[int, int]:
        """{number: bytes} of the segments no appender writes to."""
        with self.lock:
            return dict(self.sizes)

    @property
    def total_bytes(self) -> int:
        with self.lock:
            sealed = sum(self.sizes.values())
        return sealed + sum(a.size for a in (self.loader, self.compactor) if a.fd >= 0)

    def read(self, at: int, length: int) -> bytes:
        number, offset = segment_of(at), at - place(segment_of(at), 0)
        with self.lock:       # held across the read: no eviction closes the fd under it
            fd = self.readers.pop(number, None)
            if fd is None:
                fd = os.open(self.path(number), os.O_RDONLY)
                if len(self.readers) >= MAX_OPEN_READERS:
                    os.close(self.readers.popitem(last=False)[1])
            self.readers[number] = fd
            data = os.pread(fd, length, offset)
        if len(data) != length:
            raise OSError(f"{self.path(number)}: {length} bytes at {offset} expected, {len(data)} there")
        return data

    def drop(self, number: int) -> None:
        """Delete a sealed segment no row names any more."""
        with self.lock:
            fd = self.readers.pop(number, None)
            if fd is not None:
                os.close(fd)
            self.sizes.pop(number, None)
        try:
            freeing.release(self.path(number))     # a 64 MB file deleted at once holds up commits
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.loader.close()
        self.compactor.close()
        with self.lock:
            for fd in self.readers.values():
                os.close(fd)
            self.readers.clear()
