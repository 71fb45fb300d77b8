"""Mending a damaged record in a log from the bucket's copy (with `storage.s3`).

A flipped byte or a bad block on this node's disk, inside records the bucket already holds:
writer/store's reader finds it where whole records must be (storage/damaged_records.py) and,
before passing over it, asks the log's writer to mend it (`log.mend`, once a position). The writer
takes the bucket's bytes for the same positions (a batch object holds exactly the bytes of the
range it covers), checks that they are whole records that start where the damage does and end
where the disk's next whole record starts, keeps the damaged bytes aside, writes the copy over
them and fdatasyncs. The reader then reads the records as if nothing had happened. Without a
bucket, or where its copy is not whole, the reader passes over the damage as before (an ERROR).

Owns: both ends of that exchange, and `agent-os log mend` (the same with the server stopped).
Never does: write anything the bucket does not hold whole, nor beyond what it holds (the newest
batches may not be shipped yet).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from agentos import metrics
from broker.protocol import Kind, Message
from broker.sharding import log_writer
from storage import damaged_records, records
from storage.s3 import ObjectStore, S3Unavailable
from storage.segment_listing import list_segments, locate

if TYPE_CHECKING:
    from broker.client import Bus
    from storage.log_writer import LogWriter

# How long writer/store asks (on its loader thread) before it passes over the damage: a writer
# restarting, or a bucket out of reach, may answer within it
ANSWER_SECS = 60.0
ASK_SECS = 10.0      # one ask: a LIST and a few GETs
WHOLE = "the record there is whole"
MENDS_PER_SEGMENT = 64   # `log mend`: damaged records in one segment before it gives up on it


def mend(directory: Path, store: ObjectStore, index: int, position: int, shipped: int) -> tuple[int, str]:
    """Write the bucket's copy of log `index` over the damaged bytes at `position` of its segment
    in `directory` (blocking: the bucket and the disk). (bytes written, the file the damaged bytes
    were kept in; or 0, why not)."""
    listing, at = locate(directory, position)
    if not listing:
        return 0, "the log has no segment"
    start, path = listing[at]
    nxt = listing[at + 1][0] if at + 1 < len(listing) else None
    stop = shipped if nxt is None else min(nxt, shipped)
    if not start <= position < stop:
        return 0, f"position {position} is not in a segment's part the bucket holds (it holds up to {shipped})"
    with open(path, "rb") as f:
        f.seek(position - start)
        local = f.read(min(damaged_records.LOOK_BYTES, stop - position))
    try:
        records.parse(local, 0)
        return 0, WHOLE      # mended by an earlier ask whose answer was lost, say
    except records.TornRecord:
        pass
    follows = records.next_whole(local, 0)
    upto = position + follows if follows is not None else stop   # else: damage to the segment's end
    chain = [b for b in store.chain(index, "mend") if b.start < upto and b.end > position]
    if (not chain or chain[0].start > position or chain[-1].end < upto
            or any(a.end != b.start for a, b in zip(chain, chain[1:]))):
        return 0, f"the bucket does not hold all of [{position}, {upto})"
    objects = [store.get(batch.key, "mend") for batch in chain]
    if len(chain) == 1 and (chain[0].start, chain[0].end) == (start, nxt):
        # One object for the whole segment: a compaction's rewrite, which this disk may not hold
        # yet (an install cut short between the bucket and the disk, which the next pass completes):
        # the same records less the dropped ones, at other offsets, so the bytes at the damage's
        # offsets may be other records. Those between its whole neighbours (by id) are the damaged
        # ones, unless the compaction dropped some.
        copy = _between_neighbours(path, position - start, upto - start if follows is not None else None, objects[0])
        if copy == b"":
            return 0, (f"the damaged records in [{position}, {upto}) are superseded checkpoints the bucket's "
                       "compacted copy of the segment no longer holds (a compaction drops them here too)")
        if copy is not None and follows is None and len(copy) <= upto - position:
            copy += bytes(upto - position - len(copy))    # the segment's zero tail after them
    elif sum(map(len, objects)) == chain[-1].end - chain[0].start:   # batch objects: exactly their ranges' bytes
        copy = b"".join(objects)[position - chain[0].start:upto - chain[0].start]
    else:
        copy = None
    if copy is None or len(copy) != upto - position or not _whole(copy, follows is not None):
        return 0, f"the bucket's copy of [{position}, {upto}) is not whole records either"
    fd = os.open(path, os.O_RDWR)
    try:
        damaged = os.pread(fd, upto - position, position - start)
        # to the segment's end: its zero tail is not kept
        kept = damaged_records.keep_aside(directory, path, position,
                                          damaged if follows is not None else damaged.rstrip(b"\0"))
        os.pwrite(fd, copy, position - start)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return len(copy), kept.name


def _whole(data: bytes, to_the_end: bool) -> bool:
    """`data` is whole records (to its end, or then zeros)."""
    last = 0
    for _, _, _, _, last in records.scan(data):
        pass
    return last > 0 and (last == len(data) if to_the_end else not data[last:].strip(b"\0"))


def _between_neighbours(path: Path, offset: int, upto: int | None, compacted: bytes) -> bytes | None:
    """The records of `compacted` (a segment's rewrite) between the record that ends at `offset`
    in segment file `path` and the one that starts at `upto` there (None: to the last one); None
    if either is not in it."""
    with open(path, "rb") as f:
        head = f.read(offset)
        following = b""
        if upto is not None:
            f.seek(upto)
            size = records.claimed_length(f.read(records.HEADER_BYTES), 0)
            f.seek(upto)
            following = f.read(size or 0)
    before = list(damaged_records.scan_all(head))      # past an earlier damage too
    if (before[-1][4] if before else 0) != offset:
        return None
    ids = {record_id: (at, end) for at, _, record_id, _, end in records.scan(compacted)}
    if before and before[-1][2] not in ids:
        return None
    low = ids[before[-1][2]][1] if before else 0
    if upto is None:
        return compacted[low:max((end for _, end in ids.values()), default=low)]
    try:
        after = records.parse(following, 0)[1]
    except records.TornRecord:
        return None
    return compacted[low:ids[after][0]] if after in ids else None


def mend_all(wal_root: Path, store: ObjectStore, out) -> int:
    """`agent-os log mend`, with the server stopped: every damaged record `log check` finds,
    mended with the bucket's copy, a line each; 1 if any is left (0 if none was found)."""
    from storage import log_inspect

    left = 0
    if not log_inspect.logs(wal_root):
        print(f"no logs under {wal_root}", file=out)
    for directory in log_inspect.logs(wal_root):
        index = int(directory.name)
        chain = store.chain(index, "mend")
        shipped = chain[-1].end if chain else 0
        listing = list_segments(directory)
        for at, (start, path) in enumerate(listing):
            sealed = at + 1 < len(listing)
            for _ in range(MENDS_PER_SEGMENT):
                check = log_inspect.check_segment(directory.name, start, path, sealed)
                if not check.damaged or not check.problem.startswith("damage"):
                    break          # whole, a torn tail (its writer clears it), or a bad body (no copy is better)
                position = start + check.data_bytes
                size, note = mend(directory, store, index, position, shipped)
                if size <= 0:
                    print(f"log {directory.name}: position {position}: not mended: {note}", file=out)
                    left += 1
                    break
                print(f"log {directory.name}: position {position}: mended {size:,} bytes with the bucket's copy "
                      f"(the damaged ones kept in {note})", file=out)
    return 1 if left else 0


async def on_mend(writer: "LogWriter", msg: Message) -> None:
    """A log writer's answer to `log.mend`; with its compaction's rewrites held off meanwhile (one
    installed between the bucket's copy and the disk's would make the two disagree)."""
    async with writer.segment_edits:
        size, note = await mend_held(writer, msg.body["position"])
    if note == WHOLE:
        writer.bus.reply(msg, Kind.LOG_MENDED, {"bytes": 0, "whole": True})
    elif size < 0:
        writer.bus.reply(msg, Kind.LOG_MENDED, {"bytes": 0, "why": note, "retry": True})
    else:
        writer.bus.reply(msg, Kind.LOG_MENDED, {"bytes": size, **({} if size else {"why": note})})


async def mend_held(writer: "LogWriter", position: int) -> tuple[int, str]:
    """`mend` in a log writer that holds `segment_edits`, said in its log: (bytes written, the
    kept file), (0, why not), or (-1, why) if the bucket is out of reach for now."""
    if writer.object_store is None or writer.shipper is None:
        return 0, "this log has no bucket"
    if position >= writer.shipper.shipped and position < writer.segments.end:
        # the shipper is behind (the bucket out of reach, say): it will hold it
        return -1, f"the bucket holds log {writer.index} up to {writer.shipper.shipped} only, for now"
    try:
        size, note = await asyncio.get_running_loop().run_in_executor(
            writer.compaction_io, mend, writer.directory, writer.object_store, writer.index, position,
            writer.shipper.shipped)
    except S3Unavailable as exc:
        writer.log.warning("log %s: cannot mend position %d now: %s", writer.directory, position, exc)
        return -1, str(exc)
    except OSError as exc:
        size, note = 0, str(exc)
    if size:
        metrics.log_damaged.labels("mended").inc()
        writer.log.warning("log %s: mended %d damaged bytes at position %d with the bucket's copy (the damaged "
                           "bytes are kept in %s)", writer.directory, size, position, note)
    elif note != WHOLE:
        writer.log.error("log %s: could not mend the damage at position %d from the bucket: %s",
                         writer.directory, position, note)
    return size, note


def asker(bus: "Bus", loop: asyncio.AbstractEventLoop, log: logging.Logger, stopping: threading.Event,
          writers: int) -> Callable[[int, int], bool | None]:
    """writer/store's `Store.mend`, on the loader thread: asks log `writer` to mend `position`
    and waits (what follows the damage loads after it, in order). True: mended; False: it cannot
    be, pass over it; None: the store is stopping, ask again after its restart. A writer that does
    not answer (restarting) or cannot reach the bucket is asked again for up to ANSWER_SECS. A log
    no writer owns now (one an earlier configuration wrote: `writers` is how many there are) is not."""
    def ask(writer: int, position: int) -> bool | None:
        if writer >= writers:
            log.error("log %d: no writer owns it now to mend position %d from the bucket", writer, position)
            return False

        async def request() -> tuple[bool, str | None]:
            """(mended, why to ask again)"""
            try:
                reply = await bus.request(log_writer(writer), Kind.LOG_MEND, {"position": position}, timeout=ASK_SECS)
            except Exception as exc:  # noqa: BLE001 — no answer: asked again
                return False, f"no answer ({str(exc) or type(exc).__name__})"
            mended = int(reply.body.get("bytes", 0)) > 0 or reply.body.get("whole") is True
            return mended, reply.body.get("why", "") if reply.body.get("retry") else None

        deadline = time.monotonic() + ANSWER_SECS
        while not stopping.is_set():
            if loop.is_closed():
                return None          # the process is going: asked again after its restart
            answer = asyncio.run_coroutine_threadsafe(request(), loop)
            while not stopping.is_set():
                try:
                    mended, retry = answer.result(0.5)
                    break
                except TimeoutError:
                    continue
            else:
                answer.cancel()
                return None
            if mended or retry is None:
                return mended
            if time.monotonic() > deadline:
                log.error("log %d: gave up mending position %d after %.0f s: %s", writer, position, ANSWER_SECS, retry)
                return False
            stopping.wait(1.0)
        return None
    return ask
