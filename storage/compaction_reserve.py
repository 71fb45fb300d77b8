"""A log's compaction reserve: room set aside on its disk for one segment's rewrite.

A compaction pass frees space by writing a sealed segment anew without the records it drops
(superseded checkpoints, closed runs, expired access rows) and then removing the old one — so
it needs room for the copy first. A disk filled by the log itself (a session checkpointing
faster than retention lets go) left no such room: every pass failed with ENOSPC, and the disk
stayed full, every durable write refused with 507, until someone freed space by hand, though
most of what filled it was records compaction would drop. So each log keeps a file of one
segment's size (`compaction.reserve`, allocated, not written: no I/O), and a pass that finds the
disk full — at a segment's rewrite, or only at the few bytes of its mark's file — releases it and
runs again; the rewrites' installs then free the old segments, and the disk is back to the log's
writes — all but the reserve's room: until the reserve comes back, the log's appends leave that
much free (storage/free_space.py; also when writer/store took it), for the passes after (under load, the writes still arriving
took it, and every later pass failed for want of room, as before there was a reserve). The
reserve comes back at a later pass, once the disk has room for it and as much again (it never
takes the last room the log's writes need). CockroachDB keeps an "emergency ballast"
file for the same reason.

Owns: the reserve file's life. Never does: decide when a pass (storage/compaction.py) or
writer/store (storage/store.py) needs it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from storage import free_space, write_failures
from storage.freeing import fsync_dir

log = logging.getLogger("agent-os.storage")

NAME = "compaction.reserve"


def keep(directory: Path, size: int, min_free_bytes: int = 0) -> bool:
    """The reserve exists (made now if it was missing and the disk has room for it twice over,
    above the log's floor of free space: storage/free_space.py)."""
    path = directory / NAME
    try:
        if path.stat().st_size >= size:
            return True
    except FileNotFoundError:
        pass
    disk = os.statvfs(directory)
    floor = free_space.margin(min_free_bytes, size, disk.f_blocks * disk.f_frsize)
    if disk.f_bavail * disk.f_frsize < 2 * size + floor:
        return False
    tmp = directory / (NAME + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(directory)
    except OSError as exc:   # the room went between the look and the allocation: a later pass
        tmp.unlink(missing_ok=True)
        log.debug("log %s: no compaction reserve yet (%s)", directory, exc)
        return False
    return True


def held(directory: Path) -> bool:
    """Whether the log has its reserve (a look, no I/O to speak of: on the event loop)."""
    return (directory / NAME).exists()


def release_to_store(wal_root: Path, db_dir: Path, exc: BaseException, log_: logging.Logger) -> int:
    """writer/store could not load a batch for want of room (its copy of the checkpoints it keeps):
    the reserve of every log on its disk goes to it. Compaction drops only what the store has
    loaded, so a store stuck on a full disk (the logs on the same one, and it behind them when it
    filled) kept every pass from dropping anything, and no pass failed for want of room to take a
    reserve itself."""
    if not write_failures.disk_full(exc):
        return 0
    try:
        device = db_dir.stat().st_dev
    except OSError:
        return 0
    freed = sum(release(directory) for directory in wal_root.glob("[0-9]*")
                if directory.is_dir() and directory.stat().st_dev == device)
    if freed:
        log_.warning("no room on the disk to load the log; the logs' compaction reserves (%s bytes) go to it",
                     f"{freed:,}")
    return freed


def release(directory: Path) -> int:
    """Give the reserve's room to the work that needs it; the bytes freed (0: there was none)."""
    path = directory / NAME
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    fsync_dir(directory)
    return size


def volumes(storage_dir: str | Path) -> dict[str, dict]:
    """Free and total bytes, and the device, of the filesystems the tree writes to: `data`
    (storage.dir: DuckDB) and `wal` (storage.dir/wal: the logs; the same one unless a volume is
    mounted there). For the metrics and `agent-os status`."""
    out = {}
    for volume, path in (("data", Path(storage_dir)), ("wal", Path(storage_dir, "wal"))):
        try:
            disk, device = os.statvfs(path), path.stat().st_dev
        except OSError:
            continue
        out[volume] = {"free_bytes": disk.f_bavail * disk.f_frsize, "total_bytes": disk.f_blocks * disk.f_frsize,
                       "device": device}
    return out
