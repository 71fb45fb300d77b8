"""Compaction: what no read needs leaves the log, the bucket and DuckDB.

Two things go, both only from sealed segments the store has loaded and the bucket has received:
- the journal records of flow runs closed before `storage.retention_secs` (then the store deletes
  their rows too);
- external checkpoints (BLOB records) older than their session's newest one: the only read of
  them is `GET …/checkpoints/latest`, which the store answers from its newest row and the payload
  file (storage/payload_compaction.py trims that file likewise). Their DuckDB rows stay, as
  small metadata.
A rewritten segment replaces the old one under the same name (start position), and one object
replaces the segment's objects in the bucket; a node restoring from the bucket simply finds a
shorter range there. The active segment is never touched, so nothing a sender waits for moves.
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from broker.protocol import Kind
from broker.sharding import STORE
from storage import records, segments

if TYPE_CHECKING:
    from storage.log_writer import LogWriter

MARK_FILE = "compacted"      # beside the segments: where the superseded-checkpoint pass has reached
NEWEST_PER_REQUEST = 2000    # sessions per question to the store (a bus message stays small)
SYNC_PIECE = 1 << 20         # a rewritten segment goes to disk in synced pieces of this size


def compact(data: bytes, drop: Callable[[int, bytes], bool]) -> tuple[bytes, int] | None:
    """The segment's bytes without the records `drop(kind, body)` picks; None if none would go."""
    kept: list[bytes] = []
    dropped = 0
    for offset, kind, _, body, end in records.scan(data):
        if drop(kind, body):
            dropped += 1
            continue
        kept.append(data[offset:end])
    if not dropped:
        return None
    return b"".join(kept), dropped


def runs_in(runs: set[str]) -> Callable[[int, bytes], bool]:
    """Picks the journal records of these flow runs."""
    return lambda kind, body: kind == records.RecordKind.FLOW and records.decode_body(body).get("run") in runs


def blob_sessions(data: bytes) -> set[str]:
    """The sessions with an external checkpoint (BLOB record) in these bytes."""
    return {str(records.decode_body(body).get("session")) for _, kind, _, body, _ in records.scan(data)
            if kind == records.RecordKind.BLOB}


def superseded(newest: dict[str, int]) -> Callable[[int, bytes], bool]:
    """Picks the BLOB records older than their session's newest loaded one (`newest`: session ->
    seq): `GET …/checkpoints/latest` is all that reads them, and it reads the newest."""
    def drop(kind: int, body: bytes) -> bool:
        if kind != records.RecordKind.BLOB:
            return False
        blob = records.decode_body(body)
        return int(blob.get("seq", 0)) < newest.get(str(blob.get("session")), -1)
    return drop


def replace_segment(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".compacting")
    with open(tmp, "wb") as f:
        # synced a piece at a time: writer/log's commit fsyncs share the disk and would otherwise
        # queue behind tens of megabytes
        view = memoryview(data)
        for at in range(0, len(data), SYNC_PIECE):
            f.write(view[at:at + SYNC_PIECE])
            f.flush()
            os.fdatasync(f.fileno())
        if not data:
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
    cutoff = time.time() - writer.config.storage.retention_secs
    reply = await writer.bus.request(STORE, Kind.STORE_QUERY, {"query": "expired_runs", "session": "",
                                                               "after": int(cutoff)}, timeout=30.0)
    if reply.body.get("error") or not reply.body["rows"]:
        return 0
    info = reply.body["rows"][0]
    runs = set(info["runs"])
    # A segment the store has not loaded, or the bucket not received, waits for a later pass.
    ready = min(int(info["loaded"].get(str(writer.index), 0)),
                writer.shipper.shipped if writer.shipper is not None else 1 << 62)
    dropped = 0
    if runs:
        for start, end, path in sealed_segments(writer.directory):
            if end > ready:
                break
            dropped += await _rewrite(writer, start, end, path, runs_in(runs))
        if dropped:
            await writer.bus.request(STORE, Kind.STORE_PURGE, {"runs": sorted(runs)}, timeout=60.0)
            writer.log.info("retention: dropped %d records of %d runs closed before the window", dropped, len(runs))
    return dropped + await _drop_superseded(writer, ready)


async def _drop_superseded(writer: "LogWriter", ready: int) -> int:
    """Superseded external checkpoints leave each sealed segment once, the first pass after it
    is loaded. Which segments had their turn is kept in the `compacted` file beside them, so a
    pass reads only new segments. A session that checkpoints again after its segment's turn
    leaves its then-newest record there: at most one per session and segment."""
    loop = asyncio.get_running_loop()
    mark = read_mark(writer.directory)
    dropped = 0
    for start, end, path in sealed_segments(writer.directory):
        if end <= mark:
            continue
        if end > ready:
            break
        sessions = sorted(await loop.run_in_executor(writer.io, lambda p=path: blob_sessions(p.read_bytes())))
        if sessions:
            newest: dict[str, int] = {}
            for i in range(0, len(sessions), NEWEST_PER_REQUEST):
                reply = await writer.bus.request(STORE, Kind.STORE_NEWEST_BLOBS,
                                                 {"sessions": sessions[i:i + NEWEST_PER_REQUEST]}, timeout=30.0)
                if reply.body.get("error"):
                    return dropped   # the store is busy or behind: a later pass goes on from the mark
                newest.update(reply.body["rows"][0] if reply.body["rows"] else {})
            dropped += await _rewrite(writer, start, end, path, superseded(newest))
        await loop.run_in_executor(writer.io, write_mark, writer.directory, end)
        if dropped:
            writer.log.info("compaction: dropped %d superseded checkpoints up to position %d", dropped, end)
    return dropped


async def _rewrite(writer: "LogWriter", start: int, end: int, path: Path,
                   drop: Callable[[int, bytes], bool]) -> int:
    """Rewrites one sealed segment (and its bucket objects) without what `drop` picks."""
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(writer.io, lambda: compact(path.read_bytes(), drop))
    if result is None:
        return 0
    data, count = result
    await loop.run_in_executor(writer.io, replace_segment, path, data)
    if writer.object_store is not None:
        await loop.run_in_executor(writer.io, _replace_objects, writer, start, end, data)
    return count


def read_mark(directory: Path) -> int:
    """Where the last superseded-checkpoint pass ended (0: none yet, or the file is unreadable)."""
    try:
        return int((directory / MARK_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def write_mark(directory: Path, position: int) -> None:
    tmp = directory / (MARK_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{position}\n")
        f.flush()
        os.fdatasync(f.fileno())
    os.replace(tmp, directory / MARK_FILE)
    segments.fsync_dir(directory)


def _replace_objects(writer: "LogWriter", start: int, end: int, data: bytes) -> None:
    key = writer.object_store.put_batch(writer.index, start, end, writer.config.cluster.epoch, data, "compaction")
    old = [b.key for b in writer.object_store.batches(writer.index, "compaction")
           if b.start >= start and b.end <= end and b.key != key]
    writer.object_store.delete(old)
