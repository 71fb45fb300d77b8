"""Giving a big file's blocks back a piece at a time.

On a filesystem mounted with `discard` (this machine's ext4 is) deleting a file discards all of
its blocks at once: deleting a 64 MB file took 25-34 ms here, and a 4 KB write + fdatasync
running beside it waited up to 20 ms (59 once), against 5 ms at worst with no deletion.
Truncated 4 MB at a time with 2 ms between the pieces, the slowest was 3.8-6.0 ms in two runs of
three, 10.4 in the third (bench/results/2026-12-02-discard-stalls/). Compaction replaces whole
64 MB log segments and writer/store drops whole payload segments, both while commits flush to the
same disk, so they free through here.

A file being freed is renamed (or, for a replaced file, hard-linked) to `<name>.free` first: no
listing of segments counts it, and one left by a crash is freed at the next open. So is a
compaction's rewrite that a crash kept from taking its segment's place (`<segment>.compacting`,
storage/segment_rewrites.py): the next pass writes it anew, and a segment no pass comes back to
would keep it, up to a segment's size, for good.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("agent-os.storage")
SUFFIX = ".free"
UNINSTALLED = ".compacting"
STEP = 4 << 20          # bytes given back per truncation…
PAUSE_SECS = 0.002      # …with this pause between two


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(tmp: Path, path: Path, give_back: bool = True) -> Path | None:
    """`os.replace(tmp, path)` made durable (the directory fsync'd), the old file's blocks then
    given back a piece at a time — or, with `give_back` false, left to the caller to give back
    (`give_back_file`): returns the file holding them, None if they went at once."""
    trash = path.with_name(path.name + SUFFIX)
    try:
        trash.unlink(missing_ok=True)
        os.link(path, trash)
    except OSError:          # no hard links here: the old file goes at once
        trash = None
    os.replace(tmp, path)
    fsync_dir(path.parent)
    if trash is not None and give_back:
        _give_back(trash)
        return None
    return trash


def give_back_file(trash: Path) -> None:
    """Give back the blocks of a file `replace` left being freed, and delete it."""
    if not trash.name.endswith(SUFFIX):
        raise ValueError(f"{trash} is not a file being freed (its name ends in {SUFFIX})")
    _give_back(trash)


def release(path: Path) -> None:
    """Delete `path`, giving its blocks back a piece at a time."""
    trash = path.with_name(path.name + SUFFIX)
    os.replace(path, trash)
    fsync_dir(path.parent)
    _give_back(trash)


def release_leftovers(directory: Path) -> None:
    """Free what a crash left being freed, and the rewrites it left uninstalled. Only for the
    directory's owner, at its open: nothing is being freed or rewritten there yet."""
    for trash in [*directory.glob("*" + SUFFIX), *directory.glob("*" + UNINSTALLED)]:
        _give_back(trash)


def _give_back(trash: Path) -> None:
    try:
        fd = os.open(trash, os.O_WRONLY)
        try:
            size = os.fstat(fd).st_size
            while size > STEP:
                size -= STEP
                os.ftruncate(fd, size)
                time.sleep(PAUSE_SECS)
        finally:
            os.close(fd)
        trash.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:   # it only holds space: say so, the next open tries again
        log.warning("could not free %s (%s)", trash, exc)
