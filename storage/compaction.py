"""Compaction: what no read needs leaves the log, the bucket and DuckDB.

Three things go, all only from sealed segments the store has loaded and the bucket has received:
- the journal records of flow runs closed before `storage.retention_secs` (then the store deletes
  their rows too);
- external checkpoints (BLOB records) older than their session's newest one (each segment once
  after it is loaded, then again in turn, a few segments a pass): the only read of
  them is `GET …/checkpoints/latest`, which the store answers from its newest row and the payload
  segments (storage/payload_compaction.py trims those likewise). Then the store deletes their
  rows; the writer's largest position stays, as the store's progress;
- access rows (ACCESS records) of segments last written before `storage.retention_secs` (the
  file's modification time: every record in it is older), once per segment; writer/store
  deletes their rows by their time (`StoreDeletions.purge_access`);
- the records of closed sessions (storage/closed_compaction.py).
A rewritten segment replaces the old one under the same name (start position), and one object
replaces the segment's objects in the bucket; a node restoring from the bucket simply finds a
shorter range there. The active segment is never touched, so nothing a sender waits for moves.
"""
from __future__ import annotations

import asyncio
import bisect
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentos import metrics
from broker.protocol import Kind
from broker.requests import BusError
from broker.sharding import STORE
from storage import (bucket_mending, compaction_helper, compaction_reserve, freeing, records, segment_listing,
                     segment_rewrites, segments, write_failures)
from storage.s3 import S3Unavailable

if TYPE_CHECKING:
    from storage.log_writer import LogWriter

MARK_FILE = "compacted"      # beside the segments: where the superseded-checkpoint pass has reached
ACCESS_MARK_FILE = "access-expired"   # …and where the access-row retention pass has
REVISIT_MARK_FILE = "revisited"        # …and the segment the revisiting pass goes on from
REVISITS_PER_PASS = 4      # sealed segments a pass asks the store about again…
REVISIT_AFTER_PASSES = 10  # …once they were written this many compaction intervals ago
SEGMENTS_PER_QUERY = 8       # sealed segments the superseded-checkpoint pass asks the store about at once
MENDS_PER_REWRITE = 8        # damaged records in one segment mended from the bucket before its rewrite gives up


def store_refused(writer: "LogWriter", reply, what: str) -> bool:
    """True if writer/store answered an error. Said in the log: a store that cannot answer stops
    compaction, and the log then keeps every record it would have dropped."""
    error = reply.body.get("error")
    if error:
        writer.log.warning("compaction: writer/store could not answer %s (%s); the next pass asks again", what,
                           str(error)[:300])
    return bool(error)


def sealed_segments(directory: Path) -> list[tuple[int, int, Path]]:
    """(start, end, path) of every segment but the one being written; end = where the next starts."""
    return segment_listing.sealed(directory)


async def compaction_loop(writer: "LogWriter") -> None:
    """Every `storage.compaction_interval_secs`: drop closed runs past the retention window."""
    await _keep_reserve(writer)   # from the start, not the first pass: `agent-os status` shows it
    while True:
        await asyncio.sleep(writer.config.storage.compaction_interval_secs)
        try:
            await _pass_with_reserve(writer)
        except Exception as exc:  # never fatal: the next pass tries again
            # A full disk (a rewrite needs room for the segment's copy; the reserve, if any, went to
            # an earlier one), a bucket out of reach (an install goes there first) and writer/store
            # not answering (restarting, stalled: it names what to drop) stop a pass with nothing
            # wrong here: said without a traceback.
            if write_failures.disk_full(exc):
                writer.log.warning("compaction: no room on the disk for a segment's rewrite (%s); the next pass "
                                   "tries again", exc)
            elif isinstance(exc, S3Unavailable):
                writer.log.warning("compaction: the bucket is out of reach (%s); the next pass tries again", exc)
            elif isinstance(exc, BusError):
                writer.log.warning("compaction: writer/store did not answer (%s); the next pass asks again", exc)
            else:
                writer.log.exception("compaction pass failed")


async def _pass_with_reserve(writer: "LogWriter") -> None:
    """A pass; one the disk has no room for (a segment's rewrite, or only a mark's file) is run
    again at once with the log's compaction reserve given up (storage/compaction_reserve.py)."""
    loop = asyncio.get_running_loop()
    await _keep_reserve(writer)
    try:
        await compact_once(writer)
        return
    except Exception as exc:
        if not write_failures.disk_full(exc) or not compaction_reserve.held(writer.directory):
            raise
        freed = await loop.run_in_executor(writer.compaction_io, compaction_reserve.release, writer.directory)
        if not freed:
            raise
        metrics.compaction_reserve_bytes.labels(str(writer.index)).set(0)
        # its room is the pass's and the next ones': the log's appends leave it until it is made again
        writer.segments.floor.reserve(False, writer.segment_bytes)
        writer.log.warning("compaction: no room on the disk for the pass (%s); the log's compaction reserve (%s "
                           "bytes) goes to it, and it runs again", exc, f"{freed:,}")
    await compact_once(writer)   # a pass cut short asks again what it had asked: nothing is done twice


async def _keep_reserve(writer: "LogWriter") -> None:
    try:
        kept = await asyncio.get_running_loop().run_in_executor(writer.compaction_io, compaction_reserve.keep,
                                                                writer.directory, writer.segment_bytes,
                                                                writer.config.storage.min_free_bytes)
    except OSError as exc:   # never fatal: the next pass tries again
        writer.log.warning("compaction: could not make the log's compaction reserve (%s)", exc)
        kept = False
    metrics.compaction_reserve_bytes.labels(str(writer.index)).set(writer.segment_bytes if kept else 0)
    # made again, the log's appends have its room back; gone (writer/store took it), they leave it
    writer.segments.floor.reserve(kept, writer.segment_bytes)


async def compact_once(writer: "LogWriter") -> int:
    """One pass over the writer's sealed segments; returns how many records it dropped."""
    cutoff = time.time() - writer.config.storage.retention_secs
    reply = await writer.bus.request(STORE, Kind.STORE_QUERY, {"query": "expired_runs", "session": "",
                                                               "after": int(cutoff)}, timeout=30.0)
    if store_refused(writer, reply, "which runs have expired") or not reply.body["rows"]:
        return 0
    info = reply.body["rows"][0]
    # A segment the store has not loaded, or the bucket not received, waits for a later pass.
    ready = min(int(info["loaded"].get(str(writer.index), 0)),
                writer.shipper.shipped if writer.shipper is not None else 1 << 62)
    dropped = await _drop_superseded(writer, ready)
    dropped += await _revisit_superseded(writer)
    dropped += await _drop_expired_access(writer, ready, cutoff)
    from storage import closed_compaction   # it builds on this module's rewrites
    dropped += await closed_compaction.drop_closed(writer, ready)
    # Only segments the superseded-checkpoint pass is done with: that pass finds records by the
    # positions the store loaded them at, which a rewrite here would move.
    done = min(ready, read_mark(writer.directory))
    segments_done = [(start, end, path) for start, end, path in sealed_segments(writer.directory) if end <= done]
    reach = segments_done[-1][1] if segments_done else 0
    # A run goes whole or not at all: its rows leave the store once, and a run whose last records
    # are still in a later segment (or the one being written) waits for the pass that can reach them.
    spans = {str(run): (int(first), int(last)) for run, index, first, last in info["runs"]
             if int(index) == writer.index and int(last) < reach}
    runs = set(spans)
    if runs:
        purged = 0
        low, high = min(f for f, _ in spans.values()), max(last for _, last in spans.values())
        for start, end, path in segments_done:
            if end > low and start <= high:   # only segments that can hold their records are read
                purged += await rewrite_segment(writer, start, end, path, {"runs": sorted(runs)})
        metrics.compacted_records.labels("closed_run").inc(purged)
        # also when a pass before a crash had already rewritten the segments: the rows still go
        await writer.bus.request(STORE, Kind.STORE_PURGE, {"runs": sorted(runs)}, timeout=60.0)
        writer.log.info("retention: dropped %d records of %d runs closed before the window", purged, len(runs))
        dropped += purged
    return dropped


async def _drop_superseded(writer: "LogWriter", ready: int) -> int:
    """Superseded external checkpoints leave each sealed segment once, the first pass after it
    is loaded. Which segments had their turn is kept in the `compacted` file beside them, so a
    pass reads only new segments. A session that checkpoints again after its segment's turn
    leaves its then-newest record there: at most one per session and segment.

    The store names the records (it knows every checkpoint's session, seq and position), and
    the compaction helper checks each named record before cutting it, and the kernel copies
    what stays.
    The store is asked about up to SEGMENTS_PER_QUERY segments at once, and forgets their rows
    at once after all of them are rewritten: each question costs it a pass over every named
    session's checkpoints, whatever the range (bench/results/2026-12-02-compaction-profile-10k/).
    The mark moves after the forgetting, so a pass cut short in between asks again: the names
    then find other records at their offsets and drop nothing, and the rows go."""
    loop = asyncio.get_running_loop()
    mark = read_mark(writer.directory)
    todo = []
    for start, end, path in sealed_segments(writer.directory):
        if end <= mark:
            continue
        if end > ready:
            break
        todo.append((start, end, path))
    dropped = 0
    for at in range(0, len(todo), SEGMENTS_PER_QUERY):
        group = todo[at:at + SEGMENTS_PER_QUERY]
        low, high = group[0][0], group[-1][1]
        reply = await writer.bus.request(STORE, Kind.STORE_SUPERSEDED,
                                         {"writer": writer.index, "start": low, "end": high}, timeout=60.0)
        if store_refused(writer, reply, f"which checkpoints of {len(group)} segment(s) from "
                                        f"{group[0][2].name} are superseded"):
            break   # a later pass goes on from the mark
        # [position, session, seq] by position: each segment's names are a slice, found by bisection
        # (tens of thousands of rows: no per-row Python on the loop that serves the commits)
        rows = reply.body["rows"]
        positions = [row[0] for row in rows]
        for start, end, path in group:
            named = rows[bisect.bisect_left(positions, start):bisect.bisect_left(positions, end)]
            if not named:
                continue
            async with writer.segment_edits:
                result = await run_job(writer, {"op": "cut", "path": str(path), "named": named, "base": start,
                                                "length": end - start})
                count, skipped = int(result["count"]), int(result["skipped"])
                if count:
                    await install(writer, start, end, path)
            if skipped:
                writer.log.warning("compaction: %d positions the store named in %s are not checkpoints; kept",
                                   skipped, path.name)
            dropped += count
            metrics.compacted_records.labels("superseded_checkpoint").inc(count)
        if rows:
            # their rows go too, now that the log no longer has them (a failure leaves rows nobody reads)
            await writer.bus.request(STORE, Kind.STORE_FORGET, {"writer": writer.index, "start": low, "end": high,
                                                                "positions": positions}, timeout=60.0)
        await loop.run_in_executor(writer.compaction_io, write_mark, writer.directory, high)
        mark = high
    if dropped:
        writer.log.info("compaction: dropped %d superseded checkpoints from the log up to position %d", dropped, mark)
    return dropped


async def _revisit_superseded(writer: "LogWriter") -> int:
    """The first pass over a segment keeps each session's newest checkpoint as of then, so a
    session that checkpoints less often than compaction runs would keep every checkpoint in the
    log. So passes also go round the segments the first pass has had, once they are a few
    intervals old, REVISITS_PER_PASS at a time (the `revisited` mark says where to go on), ask
    the store which of their checkpoints are superseded now, and drop those. The first rewrite
    moved records off the positions the store knows, so here they are found by session and seq
    (bodies decoded on the I/O thread); a segment the store names nothing in is not even read."""
    loop = asyncio.get_running_loop()
    # Not the segments just written: a burst of checkpoints supersedes them again within seconds,
    # and its commits share the disk and this process with the rewrites.
    before = time.time() - REVISIT_AFTER_PASSES * writer.config.storage.compaction_interval_secs
    first_pass = read_mark(writer.directory)
    done = old_enough([seg for seg in sealed_segments(writer.directory) if seg[1] <= first_pass], before)
    if not done:
        return 0
    at = read_mark(writer.directory, REVISIT_MARK_FILE)
    turn = [seg for seg in done if seg[0] >= at] + [seg for seg in done if seg[0] < at]
    dropped = 0
    for start, end, path in turn[:REVISITS_PER_PASS]:
        reply = await writer.bus.request(STORE, Kind.STORE_SUPERSEDED,
                                         {"writer": writer.index, "start": start, "end": end}, timeout=60.0)
        if store_refused(writer, reply, f"which checkpoints of {path.name} are superseded now"):
            break   # a later pass goes on from the mark
        named = {(str(session), int(seq)) for _, session, seq in reply.body["rows"]}
        if named:
            count = await rewrite_segment(writer, start, end, path, {"checkpoints": sorted(named)})
            dropped += count
            metrics.compacted_records.labels("superseded_checkpoint").inc(count)
            await writer.bus.request(STORE, Kind.STORE_FORGET, {
                "writer": writer.index, "start": start, "end": end,
                "positions": [position for position, _, _ in reply.body["rows"]]}, timeout=60.0)
        await loop.run_in_executor(writer.compaction_io, write_mark, writer.directory, end, REVISIT_MARK_FILE)
    if dropped:
        writer.log.info("compaction: dropped %d superseded checkpoints from segments seen before", dropped)
    return dropped


def old_enough(sealed: list[tuple[int, int, Path]], before: float) -> list[tuple[int, int, Path]]:
    """The segments of `sealed` (in log order) last written before `before`. A segment is written
    after the one before it, and rewrites keep its time, so they are a prefix: found with a
    binary search, a few stats instead of one per segment on the writer's loop (a log has
    thousands of segments after a few days)."""
    lo, hi = 0, len(sealed)
    while lo < hi:
        mid = (lo + hi) // 2
        if sealed[mid][2].stat().st_mtime < before:
            lo = mid + 1
        else:
            hi = mid
    return sealed[:lo]


async def _drop_expired_access(writer: "LogWriter", ready: int, cutoff: float) -> int:
    """The access records of each sealed segment last written before `cutoff` leave it, in log
    order, once (the `access-expired` mark). By the file's modification time, not by decoding
    the records: a segment is written in order, so everything in it is older than its file
    (compaction's rewrites keep that time). Only segments the superseded-checkpoint pass is done
    with: it finds records by the positions the store loaded them at."""
    loop = asyncio.get_running_loop()
    mark = read_mark(writer.directory, ACCESS_MARK_FILE)
    done = min(ready, read_mark(writer.directory))
    dropped = 0
    for start, end, path in sealed_segments(writer.directory):
        if end <= mark:
            continue
        if end > done or path.stat().st_mtime >= cutoff:
            break
        count = await rewrite_segment(writer, start, end, path, {"kinds": [records.RecordKind.ACCESS]})
        await loop.run_in_executor(writer.compaction_io, write_mark, writer.directory, end, ACCESS_MARK_FILE)
        mark = end
        dropped += count
    if dropped:
        metrics.compacted_records.labels("expired_access").inc(dropped)
        writer.log.info("retention: dropped %d access records from the log up to position %d", dropped, mark)
    return dropped


async def rewrite_segment(writer: "LogWriter", start: int, end: int, path: Path, drop: dict) -> int:
    """Rewrites one sealed segment (and its bucket objects) without what `drop` picks (a rewrite
    job's drop: storage/segment_rewrites.py). A damaged record stops a rewrite: it is mended from
    the bucket's copy where there is one (storage/bucket_mending.py), else the segment keeps what
    it holds, said once."""
    job = {"op": "rewrite", "path": str(path), "drop": drop}
    async with writer.segment_edits:
        result = await run_job(writer, job)
        for _ in range(MENDS_PER_REWRITE):
            if "damaged_at" not in result or (await bucket_mending.mend_held(writer, start + result["damaged_at"]))[0] <= 0:
                break
            result = await run_job(writer, job)
        count = int(result["count"])
        if count:
            await install(writer, start, end, path)
    if "damaged_at" in result and (path.name, result["damaged_at"]) not in writer.damage_said:
        writer.damage_said.add((path.name, result["damaged_at"]))
        metrics.log_damaged.labels("kept").inc()
        writer.log.error("compaction: segment %s has a damaged record at position %d and is kept as it is: the "
                         "records this pass drops stay in it (`agent-os log check`)", path, start + result["damaged_at"])
    return count


async def run_job(writer: "LogWriter", job: dict) -> dict:
    """A segment rewrite done by the log's compaction helper (storage/compaction_helper.py)."""
    return await asyncio.get_running_loop().run_in_executor(writer.compaction_io, writer.rewriter.call, job)


async def install(writer: "LogWriter", start: int, end: int, path: Path) -> None:
    """The rewrite a job left beside segment `path` takes its place: the bucket first. A pass cut
    short in between (a stop, a crash) leaves the local segment as it was, so the next pass finds
    the same records and does both again; the other way round it would find nothing left to
    drop and the bucket would keep them."""
    loop = asyncio.get_running_loop()
    tmp = path.with_suffix(segment_rewrites.SUFFIX)
    if writer.object_store is not None:
        await loop.run_in_executor(writer.compaction_io, lambda: _replace_objects(writer, start, end, tmp.read_bytes()))
    trash = await loop.run_in_executor(writer.compaction_io, freeing.replace, tmp, path, False)
    if trash is not None:   # its discards' kernel time too is the helper's, not this process's
        try:
            await run_job(writer, {"op": "free", "path": str(trash)})
        except compaction_helper.HelperFailed:   # the segment is in place: free here rather than wait for a restart
            await loop.run_in_executor(writer.compaction_io, freeing.give_back_file, trash)


def read_mark(directory: Path, name: str = MARK_FILE) -> int:
    """Where the last pass of a kind ended (0: none yet, or the file is unreadable)."""
    try:
        return int((directory / name).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def write_mark(directory: Path, position: int, name: str = MARK_FILE) -> None:
    tmp = directory / (name + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{position}\n")
        f.flush()
        os.fdatasync(f.fileno())
    os.replace(tmp, directory / name)
    segments.fsync_dir(directory)


def _replace_objects(writer: "LogWriter", start: int, end: int, data: bytes) -> None:
    key = writer.object_store.put_batch(writer.index, start, end, writer.config.cluster.epoch, data, "compaction")
    old = [b.key for b in writer.object_store.batches(writer.index, "compaction")
           if b.start >= start and b.end <= end and b.key != key]
    writer.object_store.delete(old)
