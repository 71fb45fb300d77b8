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

The margin, by default the smaller of two log segments and a twentieth of the volume, holds a
segment's rewrite. What the store is behind is kept free on top of it: its copies of the
checkpoints it keeps take up to that much as it loads, and on a small disk the store can be behind
by the whole disk when it fills (12 MiB, by hand: 11 MB behind, the disk never freed itself). The
store tells the logs how many bytes of them it has yet to load (`log.loaded`,
storage/store_notices.py), and each adds what the disk lost since (the logs' appends, all of
them, that the store has not heard of yet). A store that stops loading (stuck, or killed) so stops
the appends while half the room left is still free, and the store has that half when it loads
again. A log on a volume of its own (`storage.dir/wal`) needs no room for the store's copies, and
its compaction reserve frees it; `storage.min_free_bytes: 0` turns the floor off (the store's
part too). writer/store's own copies leave the margin itself (LoadFloor).

Zeroing a spare segment ahead of use (storage/spares.py) and making the compaction reserve
(storage/compaction_reserve.py) leave the margin too: either would otherwise take the room back.
A compaction reserve a pass took is kept free, even with the floor off, until it is made again.

Owns: whether the log's disk has room for an append, and writer/store's payloads for a write.
Never does: free anything.
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
        self.store_shares_volume = False    # writer/store's files are on this volume (count_store)
        self.store_told_behind = 0          # bytes of the logs writer/store had yet to load when it last said…
        self.free_when_told: int | None = None   # …and the bytes free on the volume then (None: not told)
        self.reserve_held = False
        self.reserve_missing = 0   # the compaction reserve's bytes while it is not there (reserve())

    def count_store(self, store_dir: Path) -> None:
        """Keep room for what writer/store, with its files in `store_dir`, has yet to load, if they
        are on this log's volume."""
        self.store_shares_volume = _device(Path(store_dir)) == _device(Path(self.directory))

    def store_told(self, behind: int, counted: int | None = None, end: int = 0) -> None:
        """writer/store has `behind` bytes of the logs to load, having taken this log to end at
        `counted`; it ends at `end`: what lies between, the store had not heard of yet."""
        if self.store_shares_volume:
            free = self._volume()[0]
            if free is not None:
                unheard = max(end - counted, 0) if counted is not None else 0
                self.store_told_behind, self.free_when_told = behind + unheard, free
                self.slack = 0   # read again at the next append: the room kept may have grown

    def store_behind(self, free: int | None) -> int:
        """Bytes writer/store has yet to load of the logs on this volume, `free` bytes free now:
        what it said, and what the disk lost since (0 with the floor off)."""
        if not self.enabled or self.free_when_told is None or free is None:
            return 0
        return self.store_told_behind + max(self.free_when_told - free, 0)

    def reserve(self, held: bool, size: int) -> None:
        """Whether the log's compaction reserve (`size` bytes) is there. From when one that was
        there goes (a pass, or writer/store, took it) until it is made again its room is kept free
        instead: appends took it, and the next pass had no room for a rewrite, the disk full for
        good. One never made (a disk too small for it) keeps nothing."""
        if held or self.reserve_held:
            self.reserve_missing = 0 if held else size
        self.reserve_held = held
        self.slack = 0

    @property
    def enabled(self) -> bool:
        return self.setting != 0

    def check(self, length: int) -> None:
        """Raises ENOSPC if appending `length` bytes leaves too little free."""
        if not self.enabled and not self.reserve_missing:
            return
        now = self.clock()
        if length <= self.slack and now - self.checked_at < CHECK_SECS:
            self.slack -= length
            return
        self._read(now)
        behind = self.store_behind(self.free - length if self.free is not None else None)
        # before the refusal: a refused append leaves no slack for the next to pass unread. An
        # appended byte takes one from what is free and, while the store is counted, adds one to
        # what it is behind: the headroom goes twice as fast.
        kept = self.margin + behind + self.reserve_missing
        self.slack = (max(self.free - length - kept, 0) // (SLACK_SHARE * (2 if behind else 1))
                      if self.free is not None else self.segment_bytes)
        if self.free is not None and self.free - length < kept:
            parts = [f"storage.min_free_bytes {self.margin:,}" if self.margin else "",
                     f"what writer/store has yet to load {behind:,}" if behind else "",
                     f"the missing compaction reserve {self.reserve_missing:,}" if self.reserve_missing else ""]
            raise OSError(errno.ENOSPC, f"fewer than {kept:,} bytes would be left free on the log's disk "
                                        f"({', '.join(p for p in parts if p)})")

    def leaves_margin(self, length: int) -> bool:
        """Whether `length` more bytes on the volume (a spare segment zeroed ahead of use) leave the
        margin, the room writer/store needs and a missing compaction reserve's free. Reads the
        volume now; any thread."""
        if not self.enabled and not self.reserve_missing:
            return True
        free, floor = self._volume()
        behind = self.store_behind(free - length if free is not None else None)
        return free is None or free - length >= floor + behind + self.reserve_missing

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


class LoadFloor:
    """writer/store's part of the floor: where its files share a volume with the logs, its copies
    of the checkpoints it loads leave the logs' margin free. The logs stop at the margin plus what
    the store has yet to load, so the copies may take what the store is behind, never the margin:
    that room is a segment's rewrite, the compaction that drops the superseded checkpoints the
    store has loaded. A store that took it, on a disk something else had filled besides (a test
    left 2 MiB for a 2.9 MB load), left compaction no room for any rewrite, and with the log's
    superseded half not dropped it had none to load the rest in: each waited on the other, the
    disk full for good (under load, 2 of 8 runs). Held to the margin, the store loads what fits,
    compaction frees the log's superseded records behind it, and the store loads the rest."""

    def __init__(self, store_dir: Path, wal_root: Path, min_free_bytes: int, segment_bytes: int,
                 statvfs=os.statvfs) -> None:
        self.store_dir = store_dir
        self.wal_root = wal_root
        self.setting = min_free_bytes
        self.segment_bytes = segment_bytes
        self.statvfs = statvfs

    def check(self, length: int) -> None:
        """Raises ENOSPC if writing `length` bytes to the store's files leaves the logs' volume
        fewer than their margin's bytes free."""
        if self.setting == 0 or _device(self.store_dir) != _device(self.wal_root):
            return
        try:
            disk = self.statvfs(self.store_dir)
        except OSError:   # cannot tell: the write itself says if the disk is full
            return
        free = disk.f_bavail * disk.f_frsize
        kept = margin(self.setting, self.segment_bytes, disk.f_blocks * disk.f_frsize)
        if free - length < kept:
            raise OSError(errno.ENOSPC, f"fewer than {kept:,} bytes would be left free on the disk writer/store "
                                        "shares with the logs (their margin, storage.min_free_bytes: room for "
                                        "compaction's rewrites)")


def _device(path: Path) -> int | None:
    """The device of `path`, or of its nearest ancestor there is (the store's directory may not be yet)."""
    for place in (path, *path.parents):
        try:
            return os.stat(place).st_dev
        except OSError:
            continue
    return None


def margin(setting: int, segment_bytes: int, volume_bytes: int) -> int:
    """The bytes a log leaves free on a volume of `volume_bytes` (for `agent-os status` too)."""
    return setting if setting >= 0 else min(2 * segment_bytes, volume_bytes // VOLUME_SHARE)
