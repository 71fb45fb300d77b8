"""Which acknowledged checkpoints a stopped server's write-ahead log still holds (the chaos check).

Compaction drops a session's checkpoints older than its newest, so an acknowledged one is lost
only if it is gone and nothing newer of its session is there in its place.
"""
from __future__ import annotations

import collections
from pathlib import Path

from storage import records
from storage.records import RecordKind
from storage.segments import SegmentReader


def checkpoints_in_log(data_dir: Path) -> dict[str, set[str]]:
    """(session -> keys) of every checkpoint in the write-ahead logs: read after the server stopped."""
    found: dict[str, set[str]] = collections.defaultdict(set)
    for wal in sorted((data_dir / "wal").iterdir()):
        reader = SegmentReader(wal, 0)
        while batch := reader.read(8 << 20):
            for _, kind, _, body, _ in batch:
                if kind == RecordKind.BLOB:
                    rec = records.decode_body(body)
                    found[rec["session"]].add(rec["key"])
    return found


def lost_from_log(acked: dict[str, list[int]], in_log: dict[str, set[str]]) -> list[tuple[str, int]]:
    """Acknowledged checkpoints `v<n>` neither in the log nor superseded there by a newer one of
    their session (compaction drops those: only a session's latest can be read)."""
    lost = []
    for session, numbers in acked.items():
        there = in_log.get(session, set())
        newest = max((int(k[1:]) for k in there if k[:1] == "v" and k[1:].isdigit()), default=-1)
        lost += [(session, n) for n in numbers if f"v{n}" not in there and newest <= n]
    return lost
