"""Damaged records in a log: bytes that do not parse where whole records must be.

A crash tears only the batch being written: after the last whole record, part of one record,
then zeros. Anything else is damage (a flipped byte, a bad block): whole records follow the bytes
that do not parse. Before 2026-12-05 every reader stopped at such bytes without a word — writer/
store skipped the rest of a sealed segment and stopped for good in the last one, a writer's
recovery cleared whole records as a "torn tail", a segment's rewrite kept what came before — so a
single flipped byte could take acknowledged records with it. Here: finding the next whole record
past the damage (storage/records.next_whole), and keeping what a recovery clears when whole
records follow it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

from storage import records
from storage.freeing import fsync_dir

log = logging.getLogger("agent-os.storage")

# How far past a damaged record a reader looks for the next whole one (past that, the rest of a
# sealed segment is given up: a damage that long is not a flipped byte). The look is a Python loop
# on writer/store's loader thread, ~0.1 µs a byte.
LOOK_BYTES = 4 << 20
# `torn` stops at the last byte that is not zero: a whole record after a damaged one may end in
# zeros of its own (a payload's), so a recovery's look goes this far past it.
ZEROS_A_RECORD_MAY_END_WITH = 64 << 10
SECTOR_BYTES = 512   # the least a disk writes whole


def look_past(path: Path, start: int, position: int, nxt: int | None, limit: int | None) -> int | None:
    """Where a reader stopped at `position` in segment `path` (starting at `start`; the next one
    at `nxt`, None for the last, whose data is known whole up to `limit`) goes on, or None if the
    segment's data simply ends there (zeros to its end)."""
    at = position - start
    with open(path, "rb") as f:
        f.seek(at)
        data = f.read(LOOK_BYTES if nxt is not None else min(LOOK_BYTES, limit - position))
    if not data or (nxt is not None and not data.strip(b"\0")):
        return None        # the zero tail of a sealed segment (or its end of file)
    follows = records.next_whole(data, 0)
    if follows is not None:
        return start + at + follows
    # the rest of a sealed segment is given up; in the last, the next read looks on
    return nxt if nxt is not None else position + len(data)


def skipping(directory: Path, position: int, past: int) -> None:
    log.error("log %s: the record at position %d is damaged (it does not parse, or fails its checksum) "
              "inside data known whole; skipping %d bytes to position %d", directory, position,
              past - position, past)


def all_on_disk(data: bytes, at: int) -> bool:
    """Whether the record at `at` (which fails to parse) reached the disk whole: it claims a length
    that fits, and no sector of it holds only zeros. A disk writes a sector whole or not at all,
    and a segment is zeros ahead of its records, so a write torn by a crash leaves at least one
    sector of its record as zeros; a record all there that fails its checksum is damaged — and,
    written before the crash, it may have been acknowledged. (One whose own bytes fill a sector
    with zeros looks torn, as every record did before.)"""
    claimed = records.claimed_length(data, at)
    if claimed is None or at + claimed > len(data):
        return False
    end = at + claimed
    edge = at
    while edge < end:
        upto = min(end, (edge // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if not data[edge:upto].strip(b"\0"):
            return False
        edge = upto
    return True


def keep_before_clearing(directory: Path, path: Path, start: int, data: bytes, good: int, torn: int) -> bool:
    """A recovery is about to clear `torn` bytes after the last whole record (at `good` in
    segment `path`, whose bytes are `data`): if whole records follow them (damage, or a batch
    whose later pages reached the disk before its earlier ones), or the record there is all on
    the disk (damage), records that were acknowledged may be among them, so the bytes are kept
    beside the segment first, and said. Returns whether they were (False: a torn write)."""
    look = data[good:good + min(torn, LOOK_BYTES) + ZEROS_A_RECORD_MAY_END_WITH]
    follows = records.next_whole(look, 0)
    if follows is None and torn <= LOOK_BYTES:
        if not all_on_disk(data, good):
            return False
        claimed = records.claimed_length(data, good)
        kept = keep_aside(directory, path, start + good, data[good:good + max(claimed, torn)])
        log.error("log %s: the last record, at position %d, is all on the disk (a torn write leaves a sector of "
                  "it zeros) but fails its checksum: a damaged record, which may have been acknowledged. Its "
                  "%d bytes are kept in %s before they are cleared from the log", directory, start + good,
                  max(claimed, torn), kept)
        return True
    upto = good + torn        # every byte not zero; a last record's own zero bytes too:
    if follows is not None:
        for _, _, _, _, end in records.scan(data, good + follows):
            upto = max(upto, end)
    kept = keep_aside(directory, path, start + good, data[good:upto])
    log.error("log %s: the record at position %d does not parse and %s follow it: a damaged record, or a "
              "batch torn out of order. Its %d bytes from there are kept in %s before they are cleared "
              "from the log", directory, start + good,
              f"whole records (the first at {start + good + follows})" if follows is not None
              else f"{torn} bytes of data", upto - good, kept)
    return True


def keep_aside(directory: Path, path: Path, position: int, data: bytes) -> Path:
    """`data`, the bytes from `position` in segment `path`, in a file beside it (synced): what a
    recovery clears or a mend writes over stays for `agent-os log check` to list."""
    kept = path.with_name(f"{path.name}.damaged-{position}")
    with open(kept, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)
    return kept


def scan_all(data: bytes) -> Iterator[tuple[int, int, bytes, bytes, int]]:
    """records.scan of a segment's bytes that goes on past damaged stretches (up to LOOK_BYTES
    each) to the next whole record, and ends at zeros or the end, as the log's readers do."""
    offset = 0
    while True:
        last = offset
        for record in records.scan(data, offset):
            yield record
            last = record[4]
        look = data[last:last + LOOK_BYTES]
        follows = records.next_whole(look, 0) if look.strip(b"\0") else None
        if follows is None:
            return
        offset = last + follows
