"""`agent-os log check --bucket`: the bucket's copy of the logs, read back whole.

With `storage.s3`, the bucket is the copy a node rebuilds its logs from when its disk is gone
(storage/bucket_restore.py) and the one `log mend` takes damaged records from. A node learns that
an object there is damaged only when it needs it. This reads every object of every log in the
bucket, as a restore would, and says whether each is whole records (storage/bucket_restore.py
`whole_part`) and whether the chain of objects covers each log from its start without a gap —
a scrub an operator can run on a schedule, beside a running server (it only reads).

Owns: the check and its report. Never does: write to the bucket or the disk.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TextIO

from storage import bucket_restore
from storage.s3 import BatchObject, ObjectStore, S3Unavailable

FETCHERS = 8


def problems_of(store: ObjectStore, index: int, out: TextIO) -> int:
    """Check log `index`'s objects; print a line per problem and a summary; the problems' count."""
    chain = store.chain(index, "check")
    if not chain:
        print(f"log {index}: no objects", file=out)
        return 0
    problems = []
    if chain[0].start != 0:
        problems.append(f"gap: positions [0, {chain[0].start:,}) are in no object")
    problems += [f"gap: positions [{a.end:,}, {b.start:,}) are in no object"
                 for a, b in zip(chain, chain[1:]) if b.start > a.end]
    total = 0
    with ThreadPoolExecutor(FETCHERS, thread_name_prefix="bucket-check") as fetchers:
        for batch, result in zip(chain, fetchers.map(lambda b: _read(store, index, b), chain)):
            size, problem = result
            total += size
            if problem is not None:
                problems.append(f"damaged: {batch.key}: {problem}")
    print(f"log {index}: {len(chain):,} objects, {total:,} bytes, positions 0-{chain[-1].end:,}", file=out)
    for line in problems:
        print(f"  {line}", file=out)
    return len(problems)


def _read(store: ObjectStore, index: int, batch: BatchObject) -> tuple[int, str | None]:
    try:
        data, problem = bucket_restore.fetch_whole(store, batch, "check")
    except S3Unavailable:
        # a compaction may have replaced it since the listing (the server runs on): not a problem
        if batch.key not in {b.key for b in store.batches(index, "check")}:
            return 0, None
        raise
    return len(data), problem


def print_check(store: ObjectStore, out: TextIO) -> int:
    """Every log in the bucket; exit status 1 if an object is damaged or a log has a gap."""
    logs = store.logs()
    if not logs:
        print(f"no logs in the bucket {store.bucket!r} (prefix {store.prefix!r})", file=out)
        return 0
    bad = sum(problems_of(store, index, out) for index in logs)
    print(f"damaged: {bad} problem(s) in the bucket's copy (a node rebuilt from it would pass over the damaged "
          "records, with an ERROR each)" if bad else "ok: every object whole records, every log without a gap",
          file=out)
    return 1 if bad else 0
