"""The write-ahead logs of a data directory, read offline: `agent-os log check` and `agent-os log dump`.

What an operator asks of a log the server cannot answer for it: is every record on disk whole,
and what exactly does the log hold (a session's records, a run's journal) — say before restoring
a copy of the directory, after a disk error, or to see what a client's request left behind.

Only reads, so it may run beside a live server. There the newest segment of a log may end in a
batch being written (whole records appear as its write lands): `check` reports bytes after a
log's last whole record as a torn tail, which the writer clears when it next starts. In a sealed
segment (one a newer one follows) nothing is ever written again, so bytes there that are not a
whole record are damage: `check` says where and exits 1.
"""
from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any, Iterable, Iterator

from storage import damaged_records, records
from storage.segment_listing import list_segments


@dataclasses.dataclass
class SegmentCheck:
    log: str
    start: int                    # the segment's first position (its name)
    sealed: bool
    records: int = 0
    data_bytes: int = 0           # bytes of whole records, from the segment's start
    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    problem: str = ""             # "" = every byte is a whole record or a zero

    @property
    def damaged(self) -> bool:
        """Bytes that should be whole records and are not (a torn tail of the newest segment is not)."""
        return bool(self.problem) and (self.sealed or not self.problem.startswith("torn tail"))


def logs(wal_root: Path) -> list[Path]:
    """The log directories under a data directory's `wal/` (one per writer/log, and the gateway's)."""
    if not wal_root.is_dir():
        return []
    return sorted((p for p in wal_root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def check_segment(log: str, start: int, path: Path, sealed: bool) -> SegmentCheck:
    data = path.read_bytes()
    out = SegmentCheck(log, start, sealed)
    for offset, kind, _, body, end in records.scan(data):
        try:
            records.decode_body(body)
        except Exception as exc:   # its checksum held, so the writer was handed a bad body
            out.problem = f"the record at position {start + offset} has a body that is not a msgpack map ({exc})"
            return out
        out.records += 1
        out.kinds[records.RecordKind(kind).name] += 1
        out.data_bytes = end
    rest = data[out.data_bytes:].rstrip(b"\0")
    if rest:
        try:
            records.parse(data, out.data_bytes)
            why = "unreadable"
        except records.TornRecord as exc:
            why = str(exc)
        # whole records after it, or a record with every sector written: not a write torn by a
        # crash (its writer keeps the bytes aside, then clears them)
        torn = (not sealed and not damaged_records.all_on_disk(data, out.data_bytes)
                and records.next_whole(data[out.data_bytes:out.data_bytes + damaged_records.LOOK_BYTES], 0) is None)
        what = "torn tail" if torn else "damage"
        out.problem = (f"{what}: {len(rest):,} bytes at position {start + out.data_bytes} are not a whole record "
                       f"({why})")
    return out


def check(wal_root: Path) -> Iterator[SegmentCheck]:
    for directory in logs(wal_root):
        segments = list_segments(directory)
        for index, (start, path) in enumerate(segments):
            yield check_segment(directory.name, start, path, sealed=index + 1 < len(segments))


def _plain(value: Any) -> Any:
    """A body as JSON can hold it: bytes (a checkpoint's payload) become their length."""
    if isinstance(value, bytes):
        return {"bytes": len(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump(wal_root: Path, only_log: str | None = None, start: int = 0, kinds: Iterable[str] = (),
         session: str | None = None) -> Iterator[dict]:
    """Every whole record of the logs (or of log `only_log`) from position `start` on, oldest first
    in each log: {log, position, kind, id, body}. `kinds` (names, e.g. FLOW) and `session` (a
    session id, with its turns' journals, or a run id for its journal) narrow it."""
    wanted = {k.upper() for k in kinds}
    for directory in logs(wal_root):
        if only_log is not None and directory.name != only_log:
            continue
        for base, path in list_segments(directory):
            data = path.read_bytes()
            if base + len(data) <= start:
                continue
            for offset, kind, record_id, raw, _ in damaged_records.scan_all(data):   # past damage too
                name = records.RecordKind(kind).name
                if base + offset < start or (wanted and name not in wanted):
                    continue
                try:
                    body = records.decode_body(raw)
                except Exception as exc:
                    body = {"undecodable": str(exc)}
                if session is not None and not _of(body, session):
                    continue
                yield {"log": directory.name, "position": base + offset, "kind": name,
                       "id": record_id.decode(errors="backslashreplace"), "body": _plain(body)}


def _of(body: dict, session: str) -> bool:
    """Is the record the session's, or of its run (a run's journal; a session's turns are runs
    named `session/turn`)?"""
    run = body.get("run")
    return body.get("session") == session or run == session or (isinstance(run, str) and
                                                                 run.startswith(session + "/"))


def print_check(wal_root: Path, out=None) -> int:
    """`agent-os log check`: a line per log and per problem; 1 if any record is damaged."""
    import sys

    out = out or sys.stdout
    by_log: dict[str, list[SegmentCheck]] = collections.defaultdict(list)
    for seg in check(wal_root):
        by_log[seg.log].append(seg)
    if not by_log:
        print(f"no logs under {wal_root}", file=out)
        return 1
    damaged = False
    for log, segs in by_log.items():
        kinds = sum((s.kinds for s in segs), collections.Counter())
        print(f"log {log}: {len(segs)} segment(s), {sum(s.records for s in segs):,} records, "
              f"{sum(s.data_bytes for s in segs):,} bytes ("
              + (", ".join(f"{k} {n:,}" for k, n in sorted(kinds.items())) or "empty") + ")", file=out)
        for seg in segs:
            if seg.problem:
                damaged |= seg.damaged
                print(f"  segment {seg.start}: {seg.problem}", file=out)
        for kept in kept_aside(wal_root / log):
            print(f"  {kept}", file=out)
    print("damaged: a sealed segment holds bytes that are not whole records (with storage.s3, `agent-os log "
          "mend` writes the bucket's copy over them, the server stopped)" if damaged else
          "ok: every record whole", file=out)
    return 1 if damaged else 0


def kept_aside(directory: Path) -> Iterator[str]:
    """The bytes a writer's recovery kept before clearing them, or a mend before writing the
    bucket's copy over them (storage/damaged_records.py, storage/bucket_mending.py), which the log
    no longer holds: a line each, with the whole records in them, for an operator to look at."""
    for path in sorted(directory.glob("*.damaged-*")):
        data = path.read_bytes()
        whole = sum(1 for _ in damaged_records.scan_all(data))
        yield (f"kept aside: {path.name}, {len(data):,} bytes taken out of the log at position "
               f"{path.name.rsplit('-', 1)[1]}, {whole:,} whole record(s) in them")


def print_dump(wal_root: Path, only_log: str | None, start: int, kinds: Iterable[str], session: str | None,
               limit: int, out=None) -> int:
    """`agent-os log dump`: a JSON line per record."""
    import sys

    import orjson

    out = out or sys.stdout
    for n, record in enumerate(dump(wal_root, only_log, start, kinds, session)):
        if limit and n >= limit:
            break
        out.write(orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    return 0
