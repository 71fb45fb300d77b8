"""Checkpoint payloads beside DuckDB: one append-only file, rows hold (offset, length).

Why not BLOB columns: a checkpoint is 2–64 KB, and DuckDB copies every blob through its buffer
pool on insert, so a bulk load of checkpoints costs most of writer/store's CPU and, under a small
`memory_limit`, cannot commit at all (a batch of blobs does not fit). Here a payload costs one
buffered write; DuckDB keeps only small fixed-size columns.

Consistency with DuckDB: the loader appends a batch's payloads, `sync()`s the file (fdatasync),
then commits the rows that point into it. So every committed row points at bytes on disk. Bytes
past the last committed row (a crash between the two) are garbage; `open(end)` cuts them off,
and the records are loaded again from the log, appending their payloads anew.

The file only grows; storage/payload_compaction.py rewrites it without the superseded payloads.
"""
from __future__ import annotations

import os
from pathlib import Path

SYNC_CHUNK = 512 << 10
MAX_IOV = 1024                 # IOV_MAX on Linux


class PayloadFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.end = 0
        self.pending: list[bytes] = []

    def open(self, committed_end: int) -> int:
        """Open for appending after `committed_end` (the largest offset+length the rows name).
        Returns how many stray bytes past it were cut off; negative: the file was short (lost
        or cut by hand) — the missing range reads as zeros, so the caller must say so loudly."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        size = os.fstat(self.fd).st_size
        if size != committed_end:
            os.ftruncate(self.fd, committed_end)
            os.fsync(self.fd)
        self.end = committed_end
        return size - committed_end

    def append(self, data: bytes) -> tuple[int, int]:
        """(offset, length) of `data`, written on the next `sync()`."""
        offset = self.end
        self.pending.append(data)
        self.end += len(data)
        return offset, len(data)

    def sync(self) -> None:
        """Write what was appended and make it durable (before the rows naming it commit).

        At most SYNC_CHUNK per flush: the disk is shared with writer/log, whose fdatasync
        otherwise queues behind megabytes of these bytes (10k checkpoints: commit p99 about
        24.7 ms with one flush per batch, 16.5 ms in chunks). Each chunk goes out as one
        vectored write of the payloads themselves, without first joining them into one copy."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        at = self.end - sum(map(len, pending))
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
        written = os.pwritev(self.fd, parts, at)
        if written < size:      # a short write (rare): the rest the plain way
            rest = memoryview(b"".join(parts))[written:]
            while rest:
                n = os.pwrite(self.fd, rest, at + written)
                rest, written = rest[n:], written + n
        os.fdatasync(self.fd)
        return at + size

    def rewind(self, end: int) -> None:
        """After a failed commit: the next appends overwrite from `end` again."""
        self.pending = []
        self.end = end

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise OSError(f"{self.path}: {length} bytes at {offset} expected, {len(data)} there")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
