"""Retention: closed runs past `storage.retention_secs` leave the log, the bucket and DuckDB.

A compaction pass of a log writer asks the store which runs ended before the retention window,
then rewrites each sealed segment that the store has loaded and the bucket has received, keeping
every record except the journal records of those runs. The rewritten segment replaces the old
one under the same name (start position), and one object replaces the segment's objects in the
bucket; a node restoring from the bucket simply finds a shorter range there. Last, the store
deletes the runs' rows. The active segment is never touched, so nothing a sender waits for moves.
"""
from __future__ import annotations

import os
from pathlib import Path

from storage import records, segments


def compact(data: bytes, drop_runs: set[str]) -> tuple[bytes, int] | None:
    """The segment's bytes without the FLOW records of `drop_runs`; None if nothing would go."""
    kept: list[bytes] = []
    dropped = 0
    for offset, kind, _, body, end in records.scan(data):
        if kind == records.RecordKind.FLOW and records.decode_body(body).get("run") in drop_runs:
            dropped += 1
            continue
        kept.append(data[offset:end])
    if not dropped:
        return None
    return b"".join(kept), dropped


def replace_segment(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".compacting")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fdatasync(f.fileno())
    os.replace(tmp, path)
    segments.fsync_dir(path.parent)


def sealed_segments(directory: Path) -> list[tuple[int, int, Path]]:
    """(start, end, path) of every segment but the one being written; end = where the next starts."""
    segs = segments.list_segments(directory)
    return [(start, segs[i + 1][0], path) for i, (start, path) in enumerate(segs[:-1])]
