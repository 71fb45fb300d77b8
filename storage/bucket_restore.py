"""Rebuilding a log from the bucket: what a node's disk lacks (an empty disk after a failover).

Owns: fetching a log's batch objects past a position, in parallel, checking that each is whole
records, and writing them into the segments in order. Never does: decide what to restore
(writer/log compares the chain with its disk) or ship anything.

A batch object holds exactly the log's bytes of the range its key names; a compaction's object
(one for a whole segment) holds that segment's records less the dropped ones, then zeros or
nothing. So an object must read as whole records (length, CRC32C, kind) followed only by zeros,
within its range. One that does not was damaged on its way (read again, up to GETS_PER_OBJECT
times) or in the bucket: then it is still written, as it is and at its positions, so every record
around the damage stays readable and the readers pass over the damaged ones as they do over
damage on the disk (storage/damaged_records.py) — but an ERROR names the object and where, since
this disk was to be the copy that replaces a lost one.
"""
from __future__ import annotations

import collections
import logging
from concurrent.futures import Future, ThreadPoolExecutor

from agentos import metrics
from storage import records
from storage.s3 import BatchObject, ObjectStore
from storage.segments import SegmentLog

log = logging.getLogger("agent-os.storage")

FETCHERS = 8         # GETs in flight while a node rebuilds its log from the bucket
GETS_PER_OBJECT = 3  # reads of an object that is not whole records before it is written as it is


def restore(segments: SegmentLog, store: ObjectStore, chain: list, local_end: int) -> int:
    """Write the bucket's objects past `local_end` into `segments`, in order, and fsync; returns how
    many objects that took. They are fetched FETCHERS at a time (one by one, 260 objects took 3.1 s
    of a 4.7 s takeover), with at most twice that many held in memory. S3Unavailable is the
    caller's to retry: what was written stays, and a retry goes on from the log's end."""
    wanted = [batch for batch in chain if batch.end > local_end]
    ahead: collections.deque = collections.deque()
    fetchers = ThreadPoolExecutor(FETCHERS, thread_name_prefix="wal-restore")
    try:
        for batch in wanted:
            ahead.append((batch, fetchers.submit(fetch_whole, store, batch)))
            if len(ahead) >= 2 * FETCHERS:
                _write_one(segments, *ahead.popleft())
        while ahead:
            _write_one(segments, *ahead.popleft())
    finally:
        fetchers.shutdown(cancel_futures=True)   # a GET failed: the rest wait for the retry
    segments.write(b"", sync=True)
    return len(wanted)


def whole_part(data: bytes, batch: BatchObject) -> tuple[int, str | None]:
    """Where the whole records of `data` end, and why `data` is not what object `batch` must hold
    (None: it is): whole records, then only zeros, no longer than its range."""
    span = batch.end - batch.start
    end = 0
    for _, _, _, _, end in records.scan(data):
        pass
    if len(data) > span:
        return end, f"it is {len(data):,} bytes, more than the {span:,} of its range"
    if data[end:].strip(b"\0"):
        return end, f"the bytes at position {batch.start + end:,} are not a whole record"
    return end, None


def fetch_whole(store: ObjectStore, batch: BatchObject, purpose: str = "recovery") -> tuple[bytes, str | None]:
    """The object's records (without a zero tail: the log goes on at the next object's start),
    read again while they are not whole (a body damaged on its way); or all its bytes, with why
    they are not whole, if they never were."""
    for attempt in range(1, GETS_PER_OBJECT + 1):
        data = store.get(batch.key, purpose)
        end, problem = whole_part(data, batch)
        if problem is None:
            if attempt > 1:
                log.warning("restore: object %s read whole at its read %d", batch.key, attempt)
            return data[:end], None
    return data, problem


def _write_one(segments: SegmentLog, batch: BatchObject, fetched: Future) -> None:
    data, problem = fetched.result()
    if problem is not None:
        metrics.log_damaged.labels("restored").inc()
        log.error("restore: the bucket's object %s is damaged (%s, in %d reads); written as it is, so the "
                  "records around the damage stay readable and the readers pass over the damaged ones",
                  batch.key, problem, GETS_PER_OBJECT)
        data = data[:batch.end - batch.start]
    if batch.start > segments.end:
        segments.jump_to(batch.start)   # a range compacted away in the bucket
    skip = segments.end - batch.start
    segments.write(data[skip:], sync=False)
