"""Segment files of one log: append, fsync, rotate, recover a torn tail, read back.

A log is a directory of segment files named by the global byte position where each starts
(`00000000000000000000.seg`), so a record's position is stable across rotation and the
store can resume from a position. A new segment's file and directory entry are fsync'd
before anything is acknowledged from it. Opening a log scans its last segment and truncates
a torn tail back to the last whole record.

Blocking calls only: the writer runs them on its I/O thread, never on an event loop.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from storage import records

log = logging.getLogger("agent-os.storage")
SUFFIX = ".seg"


def segment_name(position: int) -> str:
    return f"{position:020d}{SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    out = []
    for path in directory.glob(f"*{SUFFIX}"):
        try:
            out.append((int(path.name[:-len(SUFFIX)]), path))
        except ValueError:
            continue
    return sorted(out)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Recovery:
    segments: int
    end: int
    records_in_last: int
    truncated_bytes: int


class SegmentLog:
    """The writing end. Not thread-safe: one I/O thread owns it."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fd = -1
        self.start = 0      # position of the current segment's first byte
        self.size = 0       # bytes in the current segment
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
        torn = len(data) - good
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if torn:
            os.ftruncate(self.fd, good)
            os.fsync(self.fd)
            log.warning("log %s: truncated a torn tail of %d bytes at position %d", self.directory, torn,
                        self.start + good)
        self.size = good
        return Recovery(len(segments), self.start + good, count, torn)

    def _create(self, position: int) -> None:
        path = self.directory / segment_name(position)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.fsync(fd)
        fsync_dir(self.directory)
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.start, self.size = fd, position, 0

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
        for seg_start, path in list_segments(self.directory):
            size = path.stat().st_size
            if seg_start + size <= start or seg_start >= end:
                continue
            with open(path, "rb") as f:
                f.seek(max(0, start - seg_start))
                out.append(f.read(min(end, seg_start + size) - max(start, seg_start)))
        return b"".join(out)

    def write(self, data: bytes, sync: bool) -> int:
        """Append whole frames; fdatasync if asked. Returns the end position after them."""
        if self.size and self.size + len(data) > self.segment_bytes:
            if sync:
                os.fdatasync(self.fd)
            self._create(self.end)
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
            if sync:
                os.fdatasync(self.fd)
        except OSError:
            # Leave the segment ending on a whole record (a full disk may have taken half a frame).
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass
            raise
        self.size += len(data)
        return self.end

    def close(self) -> None:
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
        ids.extend(record_id for _, _, record_id, _, _ in records.scan(path.read_bytes()))
    return ids


class SegmentReader:
    """The reading end, for the store: every whole record from a position, across segments."""

    def __init__(self, directory: Path, position: int) -> None:
        self.directory = directory
        self.position = position

    def read(self, max_bytes: int) -> list[tuple[int, int, bytes, bytes, int]]:
        """(position, kind, id, body, next position) of whole records from the current position."""
        segments = list_segments(self.directory)
        out = []
        for index, (start, path) in enumerate(segments):
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
            with open(path, "rb") as f:
                f.seek(self.position - start)
                data = f.read(max_bytes)
            consumed = 0
            for offset, kind, record_id, body, end in records.scan(data):
                out.append((self.position + offset, kind, record_id, body, self.position + end))
                consumed = end
            self.position += consumed
            if out or nxt is None or consumed < len(data):
                return out
            # This segment is exhausted and a newer one exists: move on.
            self.position = nxt
        return out
