"""Checkpoint payloads no read needs leave messages.payloads.

What is live: of a session's external checkpoints ('blob' rows) the newest, the only one
`GET …/checkpoints/latest` reads; of an agent session's checkpoints ('agent' rows) those from its
newest full snapshot on, the chain a session is loaded from. The rest is garbage once a newer
checkpoint arrives, and the file only grows. When it is at least `storage.payload_compaction_min_mb`
and at least half garbage, the live payloads move to a new file, the next generation:

1. under the loader's lock (no batch is loading, so the file's end E is settled): list the live
   rows below E;
2. without a lock: copy their bytes, in file order, into `messages.payloads.<generation>`;
3. on the query thread (so no query holds an offset) and under the loader's lock: append what
   the loader added past E meanwhile, fdatasync, then one DuckDB transaction moves the live rows'
   offsets, NULLs the dead rows' and records the generation in `payload_file`. Then the store
   reads the new file and the old one is deleted.

A crash before that COMMIT leaves the old generation in force; after it, the new one. Whichever
file DuckDB does not name is deleted when the store opens (`remove_other_generations`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from storage import segments
from storage.payload_file import PayloadFile

if TYPE_CHECKING:
    from storage.store import Store

BASE_NAME = "messages.payloads"
COPY_CHUNK = 1 << 20
MAX_LIVE_SHARE = 0.5       # compact only when at least half of the file is garbage

LIVE_ROWS = """
WITH marks AS (
    SELECT session, kind, max(seq) AS newest, max(CASE WHEN is_full THEN seq END) AS full_seq
    FROM checkpoints GROUP BY session, kind)
SELECT c.writer, c.lsn, c.payload_at, c.payload_len
FROM checkpoints c JOIN marks m ON c.session = m.session AND c.kind = m.kind
WHERE c.payload_at IS NOT NULL AND c.payload_at + c.payload_len <= ?
  AND ((c.kind = 'blob' AND c.seq = m.newest) OR (c.kind = 'agent' AND c.seq >= coalesce(m.full_seq, c.seq)))
ORDER BY c.payload_at
"""


def payload_path(db_dir: Path, generation: int) -> Path:
    return db_dir / (BASE_NAME if generation == 0 else f"{BASE_NAME}.{generation}")


def remove_other_generations(db_dir: Path, generation: int) -> list[Path]:
    """Deletes payload files of other generations (a compaction that crashed before or after
    its commit); returns them."""
    keep = payload_path(db_dir, generation)
    gone = [p for p in db_dir.glob(f"{BASE_NAME}*") if p != keep]
    for path in gone:
        path.unlink()
    if gone:
        segments.fsync_dir(db_dir)
    return gone


@dataclass
class Plan:
    generation: int
    path: Path
    old_end: int                  # E: the old file's end when the live rows were listed
    new_end: int = 0              # where the copied live bytes end in the new file
    moves: tuple[list[int], list[int], list[int]] = field(default_factory=lambda: ([], [], []))


def copy_live(store: "Store", min_bytes: int) -> Plan | None:
    """Steps 1 and 2: the new generation's file with the live payloads below E, or None when the
    file is too small or not garbage enough to be worth it."""
    with store.loading:
        end = store.payloads.end
        # What is live changes slowly (about one payload per session), so until the file is
        # twice what was live at the last look, skip asking DuckDB (a scan of every row); at
        # worst a pass comes a little late.
        if end < max(1, min_bytes) or end * MAX_LIVE_SHARE < store.payload_live_bytes:
            return None
        live = store.conns["messages"].execute(LIVE_ROWS, [end]).fetchall()
        plan = Plan(store.payload_generation + 1, payload_path(store.db_dir, store.payload_generation + 1), end)
    store.payload_live_bytes = sum(length for _, _, _, length in live)
    if store.payload_live_bytes > end * MAX_LIVE_SHARE:
        return None
    writers, lsns, offsets = plan.moves
    fd = os.open(plan.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        at = 0                        # where the current run of adjacent payloads goes
        run_start = run_end = -1
        for writer, lsn, offset, length in live:
            if offset != run_end:     # not adjacent to the previous one: that run goes out first
                at = _copy(store.payloads, fd, run_start, run_end, at)
                run_start = offset
            writers.append(writer)
            lsns.append(lsn)
            offsets.append(at + offset - run_start)
            run_end = offset + length
        plan.new_end = _copy(store.payloads, fd, run_start, run_end, at)
        os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        plan.path.unlink(missing_ok=True)
        raise
    os.close(fd)
    segments.fsync_dir(store.db_dir)
    return plan


def _copy(source: PayloadFile, fd: int, start: int, end: int, at: int) -> int:
    """Copies [start, end) of `source` to `fd` at `at`; returns where the copy ends. Synced a
    chunk at a time, so writer/log's commit fsyncs on the same disk do not queue behind it all."""
    while start < end:
        data = source.read(start, min(COPY_CHUNK, end - start))
        os.pwrite(fd, data, at)
        os.fdatasync(fd)
        start += len(data)
        at += len(data)
    return at


def swap(store: "Store", plan: Plan) -> int:
    """Step 3 (on the query thread): the new generation in force. Returns the bytes freed."""
    with store.loading:
        old = store.payloads
        try:
            fd = os.open(plan.path, os.O_WRONLY)
            try:
                end = _copy(old, fd, plan.old_end, old.end, plan.new_end)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            _repoint(store, plan)
        except BaseException:
            plan.path.unlink(missing_ok=True)
            raise
        new = PayloadFile(plan.path)
        new.open(end)
        store.payloads, store.payload_generation = new, plan.generation
        freed = old.end - end
        old.close()
        old.path.unlink(missing_ok=True)
        segments.fsync_dir(store.db_dir)
        return freed


def _repoint(store: "Store", plan: Plan) -> None:
    con = store.conns["messages"]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("CREATE TEMP TABLE IF NOT EXISTS payload_moves (writer SMALLINT, lsn BIGINT, new_at BIGINT)")
        con.execute("DELETE FROM payload_moves")
        con.execute("INSERT INTO payload_moves SELECT unnest(?), unnest(?), unnest(?)", list(plan.moves))
        # in this order: the dead rows by their old offsets, the loader's newer rows by theirs, then the moves
        con.execute("UPDATE checkpoints SET payload_at = NULL, payload_len = NULL WHERE payload_at < ? AND NOT EXISTS "
                    "(SELECT 1 FROM payload_moves m WHERE m.writer = checkpoints.writer AND m.lsn = checkpoints.lsn)",
                    [plan.old_end])
        con.execute("UPDATE checkpoints SET payload_at = payload_at + ? WHERE payload_at >= ?",
                    [plan.new_end - plan.old_end, plan.old_end])
        con.execute("UPDATE checkpoints SET payload_at = m.new_at FROM payload_moves m "
                    "WHERE checkpoints.writer = m.writer AND checkpoints.lsn = m.lsn")
        con.execute("DELETE FROM payload_file")
        con.execute("INSERT INTO payload_file VALUES (?)", [plan.generation])
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 — a failed COMMIT already ended the transaction
            pass
        raise
