"""Checkpoint payloads no read needs leave writer/store's payload segments, a segment at a time.

What is live: of a session's external checkpoints ('blob' rows) the newest, the only one
`GET …/checkpoints/latest` reads; of an agent session's checkpoints ('agent' rows) those from its
newest full snapshot on, the chain a session is loaded from. The rest is garbage once a newer
checkpoint arrives, and segments only grow. A sealed segment (storage/payload_segments.py) is
compacted when at most half of it is live, or when it is small (a process stopped while it was
being written) so that small ones merge:

1. `copy_live` (maintenance thread): under the loader's lock, ask DuckDB for the segment's rows
   and which are live (a query bounded by the segment's rows: the sessions of those rows only,
   never a pass over every session's marks); then, without a lock, append the live payloads to
   the compaction's own segment and fdatasync them.
2. `swap` (query thread, so no query holds a place in the old segment; under the loader's lock):
   one DuckDB transaction points the moved rows at their new places and clears the places of
   the rest of the segment; then the segment's file is deleted.

A crash before the COMMIT leaves the copies unnamed (cut off or deleted when the store opens);
after it, the old segment is named by no row and deleted when the store opens.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from storage.payload_segments import SEGMENT_ROWS, SYNC_CHUNK, place

if TYPE_CHECKING:
    from storage.store import Store

MAX_LIVE_SHARE = 0.5       # compact a segment when at most half of it is live…
SMALL_SHARE = 0.25         # …or when it is under a quarter of a full one (bytes and rows)
VOLUME_SHARE = 16          # passes begin once the segments hold a sixteenth of their disk, if less than the setting

SEGMENT_ROWS_LIVE = """
WITH seg AS (
    SELECT session, kind, seq, writer, lsn, payload_at, payload_len FROM checkpoints
    WHERE payload_at >= ? AND payload_at < ?),
marks AS (
    SELECT session, kind, max(seq) AS newest, max(CASE WHEN is_full THEN seq END) AS full_seq
    FROM checkpoints WHERE session IN (SELECT session FROM seg) GROUP BY session, kind)
SELECT seg.writer, seg.lsn, seg.payload_at, seg.payload_len,
       (seg.kind = 'blob' AND seg.seq = marks.newest)
       OR (seg.kind = 'agent' AND seg.seq >= coalesce(marks.full_seq, seg.seq)) AS live
FROM seg JOIN marks ON seg.session = marks.session AND seg.kind = marks.kind
ORDER BY seg.payload_at
"""


@dataclass
class Plan:
    segment: int
    size: int                     # the segment's bytes
    live_bytes: int = 0
    moves: tuple[list[int], list[int], list[int]] = field(default_factory=lambda: ([], [], []))
    mark: tuple[int, int, int] = (-1, 0, 0)   # the compaction's appender before the copies


def threshold(setting_mb: float, directory: Path) -> int:
    """Bytes the payload segments hold before passes compact them: `storage.payload_compaction_min_mb`,
    or a sixteenth of the disk they are on if that is less. On a small disk the logs share, every
    batch leaves a superseded payload per session it updates; waiting for 64 MB of them let them
    take the free room, the logs then refused every append, and nothing was left to load or free."""
    setting = int(setting_mb * (1 << 20))
    try:
        disk = os.statvfs(directory)
    except OSError:   # cannot tell: the setting
        return setting
    return min(setting, disk.f_blocks * disk.f_frsize // VOLUME_SHARE)


def order(store: "Store") -> list[int]:
    """The sealed segments, starting after the last one a pass looked at (round robin: a pass
    has a time budget, the next one goes on from there)."""
    numbers = sorted(store.payloads.sealed_segments())
    after = [n for n in numbers if n > store.payload_cursor]
    return after + [n for n in numbers if n <= store.payload_cursor]


def copy_live(store: "Store", segment: int) -> Plan | None:
    """Step 1: the segment's live payloads copied to the compaction's segment, or None when the
    segment is worth keeping as it is."""
    store.payload_cursor = segment
    size = store.payloads.sealed_segments().get(segment)
    if size is None:
        return None
    with store.loading:   # refused for memory (writer/store's limit is small), once more raised
        con = store.conns["messages"]
        rows = store.memory["messages"].run(con, lambda: con.execute(
            SEGMENT_ROWS_LIVE, [place(segment, 0), place(segment + 1, 0)]).fetchall())
    plan = Plan(segment, size)
    live = [row for row in rows if row[4]]
    plan.live_bytes = sum(row[3] for row in live)
    small = size < store.payloads.segment_bytes * SMALL_SHARE and len(rows) < SEGMENT_ROWS * SMALL_SHARE
    if plan.live_bytes > size * MAX_LIVE_SHARE and not small:
        return None
    writers, lsns, places = plan.moves
    out = store.payloads.compactor
    plan.mark = out.mark()
    unsynced = 0
    try:
        for writer, lsn, at, length, _ in live:
            new_at, _ = out.append(store.payloads.read(at, length))
            writers.append(writer)
            lsns.append(lsn)
            places.append(new_at)
            unsynced += length
            if unsynced >= SYNC_CHUNK:
                out.sync()
                unsynced = 0
        out.sync()
    except Exception:   # a full disk, say: the copies give their room back (as a failed load's do)
        out.rewind(plan.mark)
        raise
    return plan


def swap(store: "Store", plan: Plan) -> int:
    """Step 2 (on the query thread): the moved rows name their new places, the segment goes.
    Returns the bytes freed."""
    with store.loading:
        con = store.conns["messages"]

        def apply() -> None:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("CREATE TEMP TABLE IF NOT EXISTS payload_moves (writer SMALLINT, lsn BIGINT, new_at BIGINT)")
                con.execute("DELETE FROM payload_moves")
                if plan.moves[0]:
                    appender = con.appender("payload_moves")
                    appender.append_rows(list(zip(*plan.moves)))
                    appender.flush()
                    con.execute("UPDATE checkpoints SET payload_at = m.new_at FROM payload_moves m "
                                "WHERE checkpoints.writer = m.writer AND checkpoints.lsn = m.lsn")
                # what is left in the segment's range is what no read needs
                con.execute("UPDATE checkpoints SET payload_at = NULL, payload_len = NULL WHERE payload_at >= ? "
                            "AND payload_at < ?", [place(plan.segment, 0), place(plan.segment + 1, 0)])
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 — a failed COMMIT already ended the transaction
                    pass
                raise
        try:
            store.memory["messages"].run(con, apply)   # refused for memory: once more, the limit raised
        except Exception as exc:
            if not isinstance(exc, duckdb.FatalException):   # which may follow a durable COMMIT
                store.payloads.compactor.rewind(plan.mark)
            raise
        writers, lsns, places = plan.moves
        store.newest.moved(place(plan.segment, 0), place(plan.segment + 1, 0),
                           dict(zip(zip(writers, lsns), places)))
        store.payloads.drop(plan.segment)
    return plan.size - plan.live_bytes
