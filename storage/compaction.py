"""Retention: closed runs past `storage.retention_secs` leave the log, the bucket and DuckDB.

A compaction pass of a log writer asks the store which runs ended before the retention window,
then rewrites each sealed segment that the store has loaded and the bucket has received, keeping
every record except the journal records of those runs. The rewritten segment replaces the old
one under the same name (start position), and one object replaces the segment's objects in the
bucket; a node restoring from the bucket simply finds a shorter range there. Last, the store
deletes the runs' rows. The active segment is never touched, so nothing a sender waits for moves.
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from broker.protocol import Kind
from broker.sharding import STORE
from storage import records, segments

if TYPE_CHECKING:
    from storage.log_writer import LogWriter


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


async def compaction_loop(writer: "LogWriter") -> None:
    """Every `storage.compaction_interval_secs`: drop closed runs past the retention window."""
    while True:
        await asyncio.sleep(writer.config.storage.compaction_interval_secs)
        try:
            await compact_once(writer)
        except Exception:  # never fatal: the next pass tries again
            writer.log.exception("compaction pass failed")


async def compact_once(writer: "LogWriter") -> int:
    """One pass over the writer's sealed segments; returns how many records it dropped."""
    loop = asyncio.get_running_loop()
    cutoff = time.time() - writer.config.storage.retention_secs
    reply = await writer.bus.request(STORE, Kind.STORE_QUERY, {"query": "expired_runs", "session": "",
                                                               "after": int(cutoff)}, timeout=30.0)
    if reply.body.get("error") or not reply.body["rows"]:
        return 0
    info = reply.body["rows"][0]
    runs = set(info["runs"])
    if not runs:
        return 0
    loaded = int(info["loaded"].get(str(writer.index), 0))
    shipped = writer.shipper.shipped if writer.shipper is not None else None
    dropped = 0
    for start, end, path in sealed_segments(writer.directory):
        if end > loaded or (shipped is not None and end > shipped):
            break  # not loaded by the store or not in the bucket yet: a later pass
        result = await loop.run_in_executor(writer.io, lambda p=path: compact(p.read_bytes(), runs))
        if result is None:
            continue
        data, count = result
        await loop.run_in_executor(writer.io, replace_segment, path, data)
        if writer.object_store is not None:
            await loop.run_in_executor(writer.io, _replace_objects, writer, start, end, data)
        dropped += count
    if dropped:
        await writer.bus.request(STORE, Kind.STORE_PURGE, {"runs": sorted(runs)}, timeout=60.0)
        writer.log.info("retention: dropped %d records of %d runs closed before the window", dropped, len(runs))
    return dropped


def _replace_objects(writer: "LogWriter", start: int, end: int, data: bytes) -> None:
    key = writer.object_store.put_batch(writer.index, start, end, writer.config.cluster.epoch, data, "compaction")
    old = [b.key for b in writer.object_store.batches(writer.index, "compaction")
           if b.start >= start and b.end <= end and b.key != key]
    writer.object_store.delete(old)
