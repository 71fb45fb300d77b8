"""The chaos run's check of the JSON-lines copy of the events (`storage.jsonl_dir`): every event
record the stopped tree's logs hold is a line of events.jsonl exactly once, though writer/store was
killed mid-load again and again.

An event is named by (session, turn, seq, type). A closed session's records may have left the log
(its compaction drops them) while their lines stay in the file, and records that reach the log
after its close are never loaded: such a session is only held to one line at most per record.
"""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Callable

import orjson

from storage import records
from storage.jsonl_events import FILE_NAME
from storage.records import RecordKind
from storage.segments import SegmentReader

Key = tuple[str, str, int, str]


def _key(event: dict) -> Key:
    return (event.get("session", ""), event.get("turn", ""), int(event.get("seq", 0)), event.get("type", ""))


def events_in_log(data_dir: Path) -> collections.Counter[Key]:
    """Every event record in a stopped server's write-ahead logs."""
    found: collections.Counter[Key] = collections.Counter()
    for wal in sorted((data_dir / "wal").iterdir()):
        reader = SegmentReader(wal, 0)
        while batch := reader.read(8 << 20):
            for _, kind, _, body, _ in batch:
                if kind == RecordKind.EVENT:
                    found[_key(records.decode_body(body))] += 1
    return found


def events_in_file(jsonl_dir: Path) -> tuple[collections.Counter[Key], int]:
    """The file's events, and how many of its lines are not a whole JSON object."""
    found: collections.Counter[Key] = collections.Counter()
    bad = 0
    path = jsonl_dir / FILE_NAME
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            found[_key(orjson.loads(line))] += 1
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
            bad += 1
    return found, bad


def compare(in_log: collections.Counter[Key], in_file: collections.Counter[Key], bad_lines: int,
            closable: Callable[[str], bool]) -> dict:
    """Missing: a logged event with fewer lines than records. Extra: more lines than records. A
    session that may have been closed is held to neither, only to one line at most per record
    (its records may have left the log, or come after its close and never been loaded)."""
    missing = [list(k) for k, n in in_log.items() if in_file[k] < n and not closable(k[0])]
    extra = [list(k) for k, n in in_file.items() if n > max(in_log[k], 1 if closable(k[0]) else 0)]
    return {"lines": sum(in_file.values()), "log_events": sum(in_log.values()), "bad_lines": bad_lines,
            "missing": len(missing), "extra": len(extra), "missing_first": missing[:10], "extra_first": extra[:10]}
