"""A sealed log segment written anew without some of its records: the work of a compaction pass
that reads and checks records, done by a helper process (storage/compaction_helper.py).

Each job is plain data (a dict, msgpack on the helper's pipe) and leaves the rewritten segment
beside the old one as `<segment>.compacting`, synced and with the old file's modification time,
or nothing when no record goes. Installing it (the bucket first, then the local file through
storage/freeing.py) is the pass's own step, in the process that owns the log.

Jobs:
- `{"op": "cut", "path", "named": [[position, session, seq], …], "base", "length"}`: the BLOB
  records the store named by position (`base` is the segment's start; its records take its first
  `length` bytes); answers `{"count", "skipped"}`;
- `{"op": "rewrite", "path", "drop": {…}}`: every record the drop picks, one of
  `{"kinds": [kind, …]}`, `{"runs": [run, …]}` (journal records of flow runs),
  `{"checkpoints": [[session, seq], …]}` (BLOB records), `{"closed": {session: closed at}}` (a
  closed session's records from before its close); answers `{"count"}`, with `"damaged_at"` (an
  offset) and count 0 when bytes that are not whole records stop the scan there;
- `{"op": "free", "path"}`: the blocks of a replaced segment given back a piece at a time
  (storage/freeing.py; only a file named `*.free`); answers `{}`.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import msgpack

from storage import freeing, records, segments
from storage.session_closing import SESSION_KINDS

SYNC_PIECE = 1 << 20   # a rewritten segment goes to disk in synced pieces: commits share the disk
HEAD_BYTES = 512       # read of a named record to find its session and seq (they come before its payload)
FEW_NAMES = 8          # closed sessions a body is searched for by name before it is decoded
SUFFIX = freeing.UNINSTALLED   # what a crash leaves of it is freed at the log's next open


class BadJob(ValueError):
    """A job that is not one of the kinds above, or whose fields are not what they must be."""


class Damaged(ValueError):
    """A damaged record stops a segment's scan at `offset`, before its data ends: rewritten, the
    segment would lose every record after it."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"a damaged record at offset {offset}")
        self.offset = offset


def run(job: dict) -> dict:
    """Do one job; BadJob if it cannot be one."""
    if not isinstance(job, dict) or not isinstance(job.get("path"), str):
        raise BadJob("a job is a map with a 'path'")
    path = Path(job["path"])
    if job.get("op") == "cut":
        try:
            base, length = int(job["base"]), int(job["length"])
            named = [(int(p) - base, str(session), int(seq)) for p, session, seq in job["named"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BadJob(f"a cut needs 'named' [[position, session, seq], …], 'base' and 'length' ({exc})") from None
        count, skipped = cut_records(path, named, length)
        return {"count": count, "skipped": skipped}
    if job.get("op") == "rewrite":
        try:
            return {"count": rewrite(path, picker(job.get("drop")))}
        except Damaged as exc:
            return {"count": 0, "damaged_at": exc.offset}
    if job.get("op") == "free":
        try:
            freeing.give_back_file(path)
        except ValueError as exc:
            raise BadJob(str(exc)) from None
        return {}
    raise BadJob(f"unknown job {job.get('op')!r}")


def picker(drop: object) -> Callable[[int, bytes], bool]:
    """The predicate (kind, body) -> bool a rewrite's `drop` describes."""
    if not isinstance(drop, dict) or len(drop) != 1:
        raise BadJob("'drop' is a map of one of: kinds, runs, checkpoints, closed")
    (what, value), = drop.items()
    try:
        if what == "kinds":
            return kinds_in({int(k) for k in value})
        if what == "runs":
            return runs_in({str(r) for r in value})
        if what == "checkpoints":
            return checkpoints_in({(str(s), int(q)) for s, q in value})
        if what == "closed":
            return records_of({str(s): float(t) for s, t in value.items()})
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadJob(f"'drop' {what}: {exc}") from None
    raise BadJob(f"unknown drop {what!r}")


def kinds_in(kinds: set[int]) -> Callable[[int, bytes], bool]:
    return lambda kind, body: kind in kinds


def runs_in(runs: set[str]) -> Callable[[int, bytes], bool]:
    """Picks the journal records of these flow runs."""
    return lambda kind, body: kind == records.RecordKind.FLOW and records.decode_body(body).get("run") in runs


def checkpoints_in(named: set[tuple[str, int]]) -> Callable[[int, bytes], bool]:
    """Picks the external checkpoints (BLOB records) whose (session, seq) is named."""
    def drop(kind: int, body: bytes) -> bool:
        if kind != records.RecordKind.BLOB:
            return False
        decoded = records.decode_body(body)
        return (decoded.get("session"), decoded.get("seq")) in named
    return drop


def records_of(closed: dict[str, float]) -> Callable[[int, bytes], bool]:
    """Picks the records of these sessions written no later than each one's close."""
    # A body holding one of a few names has its bytes: most records are passed over undecoded.
    # With many names, looking for each costs more than decoding.
    needles = [s.encode() for s in closed] if len(closed) <= FEW_NAMES else []

    def drop(kind: int, body: bytes) -> bool:
        if kind not in SESSION_KINDS or (needles and not any(n in body for n in needles)):
            return False
        decoded = records.decode_body(body)
        closed_at = closed.get(decoded.get("session"))
        return closed_at is not None and float(decoded.get("at", 0.0)) <= closed_at
    return drop


def compact(data: bytes, drop: Callable[[int, bytes], bool]) -> tuple[bytes, int] | None:
    """The segment's bytes without the records `drop(kind, body)` picks; None if none would go.
    Damaged if a damaged record stops the scan before the segment's data ends."""
    kept: list[bytes] = []
    dropped = 0
    last = 0
    for offset, kind, _, body, end in records.scan(data):
        last = end
        if drop(kind, body):
            dropped += 1
            continue
        kept.append(data[offset:end])
    if data[last:].strip(b"\0"):
        raise Damaged(last)
    if not dropped:
        return None
    return b"".join(kept), dropped


def rewrite(path: Path, drop: Callable[[int, bytes], bool]) -> int:
    """`<path>.compacting` without what `drop` picks; returns how many records that was (0: no file)."""
    result = compact(path.read_bytes(), drop)
    if result is None:
        return 0
    data, count = result
    written = os.stat(path)
    tmp = path.with_suffix(SUFFIX)
    with _removed_if_failed(tmp), open(tmp, "wb") as f:
        view = memoryview(data)
        for at in range(0, len(data), SYNC_PIECE):
            f.write(view[at:at + SYNC_PIECE])
            f.flush()
            os.fdatasync(f.fileno())
            segments.drop_behind(f.fileno(), at, at + SYNC_PIECE)   # as in cut_records
        if not data:
            os.fdatasync(f.fileno())
    # the file keeps its modification time (when its records were written): the access-row
    # retention goes by it
    os.utime(tmp, ns=(written.st_atime_ns, written.st_mtime_ns))
    return count


def cut_records(path: Path, named: list[tuple[int, str, int]], length: int) -> tuple[int, int]:
    """`<path>.compacting` without the BLOB records `named` (offset, session, seq; by offset) of
    segment `path`, whose records take its first `length` bytes (the rest of a sealed segment is
    zeros); returns (records dropped, names skipped). A name is only a hint: unless that very
    checkpoint (its session and seq) starts at its offset, in a frame that fits the segment, it is
    skipped — say the segment was rewritten before a crash let the mark advance, and other records
    now sit there. The kept ranges are copied file to file by the kernel (`copy_file_range`).

    Of a named record only its head is read (`blob_end`), and nothing ahead of what is asked:
    most of a segment is superseded checkpoints, and the store has dropped the segment's pages
    (storage/segments.drop_behind), so checking each whole record read the whole segment back
    from disk. During the cuts of passes every 5 s beside 10k mixed runs the disk read 323 MB/s,
    and commits over 5 ms came 9x as often as outside passes. Over four such passes the helper read
    941 MB with 4 KB heads and the usual readahead, 459 MB with 512-byte heads and none: a page per
    named head, and the kept records themselves (2026-12-03)."""
    src = os.open(path, os.O_RDONLY)
    try:
        size = min(os.fstat(src).st_size, length)
        # No readahead: the heads are kilobytes apart, and the kept records too (read ahead at
        # 8 MB, the copy read most of what it had cut)
        os.posix_fadvise(src, 0, 0, os.POSIX_FADV_RANDOM)
        cut: list[tuple[int, int]] = []
        skipped = 0
        for offset, session, seq in sorted(named):
            end = blob_end(src, size, offset, session, seq)
            if end is None or (cut and offset < cut[-1][1]):
                skipped += 1
                continue
            cut.append((offset, end))
        if not cut:
            return 0, skipped
        tmp = path.with_suffix(SUFFIX)
        with _removed_if_failed(tmp):   # a partial copy (a full disk) holds no space
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                at = unsynced = 0
                for keep_from, keep_to in zip([0] + [e for _, e in cut], [s for s, _ in cut] + [size]):
                    left = keep_to - keep_from
                    while left > 0:
                        n = os.copy_file_range(src, dst, left, keep_from, at)
                        if n <= 0:
                            raise OSError(f"copy_file_range copied nothing from {path} at {keep_from}")
                        keep_from, at, left, unsynced = keep_from + n, at + n, left - n, unsynced + n
                        if unsynced >= SYNC_PIECE:
                            os.fdatasync(dst)
                            segments.drop_behind(dst, at - unsynced, at)   # nobody reads it soon
                            unsynced = 0
                os.fdatasync(dst)
                segments.drop_behind(dst, at - unsynced, at)
            finally:
                os.close(dst)
        written = os.fstat(src)
        os.utime(tmp, ns=(written.st_atime_ns, written.st_mtime_ns))   # as in rewrite()
        return len(cut), skipped
    finally:
        os.close(src)


@contextmanager
def _removed_if_failed(tmp: Path) -> Iterator[None]:
    """A rewrite that fails part way leaves no partial `.compacting` behind: on a full disk (the
    usual failure) it held space the log's commits wait for, and compaction is what frees it."""
    try:
        yield
    except BaseException:
        if tmp.exists():
            freeing.release(tmp)
        raise


def blob_end(fd: int, size: int, offset: int, session: str, seq: int) -> int | None:
    """Where the BLOB record of (session, seq) at `offset` of a segment's first `size` bytes
    ends; None if it does not start there. Read: its head, where the body names its session and
    seq before its payload (`encode_body` keeps the order they were given in, and the writers
    give them so); a body that does not is read whole and checked, checksum too."""
    if offset < 0 or offset + records.HEADER_BYTES > size:
        return None
    head = os.pread(fd, HEAD_BYTES, offset)
    if len(head) < records.HEADER_BYTES:
        return None
    length = int.from_bytes(head[:4], "little")
    if head[8] != records.RecordKind.BLOB or not 2 <= length <= records.MAX_RECORD_BYTES \
            or offset + 8 + length > size:
        return None
    names = head_names(head[:8 + length])
    if names is None:
        try:
            _, _, body, _ = records.parse(os.pread(fd, 8 + length, offset), 0)
            blob = records.decode_body(body)
        except (records.TornRecord, ValueError, TypeError, msgpack.ExtraData):
            return None
        names = (blob.get("session"), blob.get("seq"))
    return offset + 8 + length if names == (session, seq) else None


def head_names(head: bytes) -> tuple[object, object] | None:
    """(session, seq) of a BLOB frame whose first bytes are `head`, if those name both; None if
    they do not (or do not decode as a map's first entries)."""
    found = records.head_fields(head[records.HEADER_BYTES + head[9]:], ("session", "seq"))
    return (found["session"], found["seq"]) if len(found) == 2 else None


class InProcess:
    """Runs jobs in this process: for tests of a pass's logic (the server uses the helper)."""

    def call(self, job: dict) -> dict:
        return run(job)

    def close(self) -> None:
        pass
