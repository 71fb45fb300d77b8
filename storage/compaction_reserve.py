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
writes. The reserve comes back at a later pass, once the disk
has room for it and as much again (it never takes the last room the log's writes need).
CockroachDB keeps an "emergency ballast" file for the same reason.

Owns: the reserve file's life. Never does: decide when a pass needs it (storage/compaction.py).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from storage.freeing import fsync_dir

log = logging.getLogger("agent-os.storage")

NAME = "compaction.reserve"


def keep(directory: Path, size: int) -> bool:
    """The reserve exists (made now if it was missing and the disk has room for it twice over)."""
    path = directory / NAME
    try:
        if path.stat().st_size >= size:
            return True
    except FileNotFoundError:
        pass
    disk = os.statvfs(directory)
    if disk.f_bavail * disk.f_frsize < 2 * size:
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


def release(directory: Path) -> int:
    """Give the reserve's room to a compaction pass; the bytes freed (0: there was none)."""
    path = directory / NAME
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    fsync_dir(directory)
    return size
