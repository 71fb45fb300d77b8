"""A log's floor of free space: appends stop a margin before the disk is full.

Where the logs share a disk with DuckDB (the default layout), freeing it takes room: writer/store
copies each checkpoint it keeps out of the log as it loads it, and compaction drops only what the
store has loaded, writing each segment anew without it. A log that wrote until the disk was full
left the store, then behind by seconds of writes, no room to load them, so no pass could drop
anything: the disk stayed full, every durable write 507, until someone freed space by hand — in
every by-hand run, on 12 and 128 MiB disks (bench/RECORD.md, forty-sixth session). The logs'
compaction reserves (storage/compaction_reserve.py) were not enough: the store that took them
lost that room to the writes still arriving. Stopping the log's appends while fewer than `storage.min_free_bytes`
are free (Elasticsearch's flood stage) keeps that room for the store and compaction; they free
what the log's superseded checkpoints took, and the appends go on.

The margin, by default the smaller of two log segments and a twentieth of the volume, has to
hold what the store is behind when the disk fills (its copies of the checkpoints it keeps) and a
segment's rewrite. A log on a volume of its own (`storage.dir/wal`) needs no margin: its
compaction reserve frees it; `storage.min_free_bytes: 0` turns the floor off.

Zeroing a spare segment ahead of use (storage/spares.py) and making the compaction reserve
(storage/compaction_reserve.py) leave the margin too: either would otherwise take the room back.

Owns: whether the log's disk has room for an append. Never does: free anything.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

AUTO = -1
CHECK_SECS = 0.05        # free space is read at least this often while appends go on…
SLACK_SHARE = 4          # …and again once a quarter of what was free above the margin has been written
VOLUME_SHARE = 20        # the automatic margin: at most a twentieth of the volume


class FreeSpaceFloor:
    """Refuses an append (ENOSPC, as a full disk would) while the log's volume has fewer than the
    margin's bytes free. Reads the volume's free space at most every CHECK_SECS while it is far
    above the margin (an append costs no system call), at every append near it."""

    def __init__(self, directory: Path, min_free_bytes: int, segment_bytes: int, clock=time.monotonic,
                 statvfs=os.statvfs) -> None:
        self.directory = directory
        self.setting = min_free_bytes
        self.segment_bytes = segment_bytes
        self.clock = clock
        self.statvfs = statvfs
        self.checked_at = float("-inf")
        self.slack = 0           # bytes that may be appended before the next reading
        self.margin = 0
        self.free = None         # bytes free at the last reading (None: unknown)

    @property
    def enabled(self) -> bool:
        return self.setting != 0

    def check(self, length: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if length <= self.slack and now - self.checked_at < CHECK_SECS:
            self.slack -= length
            return
        self._read(now)
        # before the refusal: a refused append leaves no slack for the next to pass unread
        self.slack = (max(self.free - length - self.margin, 0) // SLACK_SHARE if self.free is not None
                      else self.segment_bytes)
        if self.free is not None and self.free - length < self.margin:
            raise OSError(errno.ENOSPC, f"fewer than {self.margin:,} bytes would be left free on the log's disk "
                                        f"(storage.min_free_bytes)")

    def leaves_margin(self, length: int) -> bool:
        """Whether `length` more bytes on the volume (a spare segment zeroed ahead of use) leave the
        margin free. Reads the volume now; any thread."""
        free, floor = self._volume() if self.enabled else (None, 0)
        return free is None or free - length >= floor

    def _read(self, now: float) -> None:
        self.checked_at = now
        self.free, self.margin = self._volume()

    def _volume(self) -> tuple[int | None, int]:
        """(bytes free, the margin) on the log's volume now; (None, 0) if it cannot tell: the
        write itself will then say if the disk is full."""
        try:
            disk = self.statvfs(self.directory)
        except OSError:
            return None, 0
        return disk.f_bavail * disk.f_frsize, margin(self.setting, self.segment_bytes, disk.f_blocks * disk.f_frsize)


def margin(setting: int, segment_bytes: int, volume_bytes: int) -> int:
    """The bytes a log leaves free on a volume of `volume_bytes` (for `agent-os status` too)."""
    return setting if setting >= 0 else min(2 * segment_bytes, volume_bytes // VOLUME_SHARE)
