"""Which segment files a log directory holds: listed once per change of the directory.

A log keeps a file per `storage.segment_bytes` of its history (compaction shrinks them, nothing
removes them), and its readers ask for the listing on every call: writer/store's loader once per
read, compaction several times a pass on the log writer's loop. A directory listing grows with
the files: 228 ms for 30,000 segments here, paid by every read of the newest record and, while
reads stopped at each segment's end, N times by a store catching up over N segments
(bench/results/2026-12-02-segment-count/). The directory's modification time changes with every file
created, renamed or removed in it (a segment's own writes do not touch it), so a listing stays
good while that time stays the same. Not quite: file times are only as fine as the kernel's clock
tick (a few milliseconds; whole seconds on some filesystems), so a file created in the same tick
as the listing saw would leave the time unchanged. A listing taken within RACY_NS of the time it
saw is therefore not kept — as git does not trust a "racily clean" index entry.

Not for directories on network filesystems, whose clients may cache a directory's attributes.
"""
from __future__ import annotations

import bisect
import os
import time
from operator import itemgetter
from pathlib import Path

SUFFIX = ".seg"
RACY_NS = 50_000_000                 # a listing this close to the directory's time is not kept…
COARSE_RACY_NS = 2_000_000_000       # …or this close, where times look whole seconds (coarse clocks)

# directory -> (its modification time when listed, the listing, its start positions, its entries
# by file name, whether it may be reused as it is)
_listings: dict[str, tuple[int, list[tuple[int, Path]], list[int], dict[str, tuple[int, Path]], bool]] = {}
_sealed: dict[str, tuple[list, list[tuple[int, int, Path]]]] = {}   # directory -> (the listing, its sealed segments)


def segment_name(position: int) -> str:
    return f"{position:020d}{SUFFIX}"


def scan(directory: Path, known: dict[str, tuple[int, Path]] | None = None,
         by_name: dict[str, tuple[int, Path]] | None = None) -> list[tuple[int, Path]]:
    """(start position, path) of every segment in `directory`, oldest first, read from the disk.
    `known`: entries of an earlier listing by file name, reused (a Path costs more to make than
    the rest of a listing: 30,000 of them took half of its 280 ms); `by_name` is filled likewise."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    known = known or {}
    out = []
    for name in names:
        entry = known.get(name)
        if entry is None:
            if not name.endswith(SUFFIX):
                continue
            try:
                entry = (int(name[:-len(SUFFIX)]), directory / name)
            except ValueError:
                continue
        out.append(entry)
        if by_name is not None:
            by_name[name] = entry
    out.sort(key=itemgetter(0))
    return out


def _listing(directory: Path) -> tuple[list[tuple[int, Path]], list[int]]:
    now = time.time_ns()      # before the stat: a change after it is stamped at least this late
    key = os.fspath(directory)
    try:
        mtime = os.stat(key).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        _listings.pop(key, None)
        return [], []
    known = _listings.get(key)
    if known is not None and known[0] == mtime and known[4]:
        return known[1], known[2]
    by_name: dict[str, tuple[int, Path]] = {}
    listing = scan(directory, known[3] if known is not None else None, by_name)
    starts = [start for start, _ in listing]
    racy = COARSE_RACY_NS if mtime % 1_000_000_000 == 0 else RACY_NS
    # kept even when racy (not to be reused as it is then): its paths serve the next listing
    _listings[key] = (mtime, listing, starts, by_name, now - mtime > racy)
    return listing, starts


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(start position, path) of every segment in `directory`, oldest first."""
    return list(_listing(directory)[0])


def newest_start(directory: Path) -> int | None:
    """Where the newest segment in `directory` begins (None: it holds none)."""
    listing, _ = _listing(directory)
    return listing[-1][0] if listing else None


def locate(directory: Path, position: int) -> tuple[list[tuple[int, Path]], int]:
    """The listing and the index of the segment holding `position` (0 if it precedes the first).
    The listing is shared with later calls: read it, never change it. For a reader that looks at
    a segment or two per call (a slice of 30,000 per call was most of a catch-up's time)."""
    listing, starts = _listing(directory)
    return listing, max(0, bisect.bisect_right(starts, position) - 1)


def segments_from(directory: Path, position: int) -> list[tuple[int, Path]]:
    """The segments from the one holding `position` on (all of them if it precedes the first)."""
    listing, index = locate(directory, position)
    return listing[index:]


def sealed(directory: Path) -> list[tuple[int, int, Path]]:
    """(start, end, path) of every segment but the last (the one being written); end = where the
    next starts. Made once per listing: compaction asks for it several times a pass, on the log
    writer's loop, and 30,000 new tuples took 69 ms there (their garbage collections included)."""
    listing, _ = _listing(directory)
    key = os.fspath(directory)
    known = _sealed.get(key)
    if known is None or known[0] is not listing:
        known = (listing, [(start, listing[i + 1][0], path) for i, (start, path) in enumerate(listing[:-1])])
        _sealed[key] = known
    return list(known[1])


def forget(directory: Path) -> None:
    """Drop what is known of `directory`: the next call lists it again (benchmarks compare with that)."""
    _listings.pop(os.fspath(directory), None)
