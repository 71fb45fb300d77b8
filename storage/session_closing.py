"""Closing a session (`DELETE /v1/sessions/{sid}`): what leaves DuckDB, and when.

The gateway stops the session in its actor (the running turn cancelled, its records acknowledged),
asks where the logs end now, and appends a CLOSE record naming those ends (`upto`, [[log,
position], ...]). Every record of the session before them — transcript messages, turn events,
agent and external checkpoints — then goes:
- from DuckDB when writer/store loads the CLOSE record: rows of the session whose `lsn` lies
  before `upto` of their log are deleted (`SessionClosing.apply_close`), and a record of the
  session before `upto` that a log yields only later (the store reads its logs side by side, and
  a standby may rebuild from the bucket) is never loaded (`closed_before`);
- from the log by its compaction (storage/closed_compaction.py): the store keeps where those
  records were (`closed_records`) until each log's compaction has rewritten the segment holding
  them.
A record after the ends belongs to whatever uses the id next: a closed id may be used again,
starting empty. A crash between the CLOSE row's commit and the deletions is mended at open
(`applied` is false until they are done; every step is idempotent).
"""
from __future__ import annotations

import math

import duckdb
import orjson

from storage import session_summary
from storage.records import RecordKind

SESSION_KINDS = frozenset({RecordKind.EVENT, RecordKind.CHECKPOINT, RecordKind.BLOB})
# Stand-ins that keep a log's progress in a file once the rows holding its largest lsn are gone
# (storage/schema.py: rows of session '' are progress only).
PROGRESS_ROWS = {
    "messages": "('', '', -1, '', 'progress', NULL, NULL, 0, ?, ?)",
    "checkpoints": "('', '', 'progress', '', -1, false, 0, NULL, 0, ?, ?, NULL, NULL)",
    "events": "('', '', '', -1, 'progress', NULL, 0, ?, ?)",
}
DB_TABLES = {"messages": ("messages", "checkpoints"), "events": ("events",)}


def parse_upto(raw: str | list) -> dict[int, int]:
    """A CLOSE record's `upto` ([[log, position], ...], as JSON text in DuckDB) as {log: position}."""
    pairs = orjson.loads(raw) if isinstance(raw, str) else raw
    return {int(log): int(position) for log, position in pairs}


class SessionClosing:
    """Mixed into Store (storage/store.py): needs `conns`, `pass_cursors`, `loaded`, `loading`, `log`,
    `closing`, `pending_closes`, `newest`, `memory` and `merge_summaries`."""

    conns: dict[str, duckdb.DuckDBPyConnection]
    loaded: dict[int, int]
    closing: dict[str, dict[int, int]]
    pending_closes: list[tuple[str, dict[int, int], int, int]]

    def open_closing(self) -> list[tuple[str, dict[int, int], int, int]]:
        """At open, after the readers are placed: the closes whose earlier records a log may still
        yield (kept in `self.closing`), and those whose deletions a crash cut short (returned, for
        `apply_close`)."""
        self.closing = {}
        unapplied = []
        result = self.conns["messages"].execute("SELECT session, upto, applied, writer, lsn FROM closed_sessions")
        while rows := result.fetchmany(10_000):
            for session, upto, applied, writer, lsn in rows:
                ends = parse_upto(upto)
                self.expect_close(session, ends)
                if not applied:
                    unapplied.append((session, ends, writer, lsn))
        return unapplied

    def apply_pending_closes(self) -> None:
        """Apply the closes loaded (or found unapplied at open); one DuckDB refused stays for the
        next batch (its rows are readable until then: a read after the DELETE may see them)."""
        pending, self.pending_closes = self.pending_closes, []
        for session, ends, writer, lsn in pending:
            try:
                count = self.apply_close(session, ends, writer, lsn)
            except duckdb.FatalException:
                raise   # the file is invalidated: the loader's caller restarts writer/store to reopen it
            except Exception:   # DuckDB trouble (memory, disk): try again after the next batch
                self.log.exception("deleting the rows of closed session %s failed; will retry", session)
                self.pending_closes.append((session, ends, writer, lsn))
                continue
            self.log.info("session %s closed: %d of its records left DuckDB", session, count)
        for db in DB_TABLES:
            if self.memory[db].stuck_high:
                # The deletions' row versions hold more memory than the file's limit until a
                # checkpoint writes them out (appends bring one about, a burst of closes alone
                # does not): one now, so that the limit can go back down.
                try:
                    with self.memory[db].raised(self.conns[db]):
                        self.conns[db].execute("CHECKPOINT")
                except duckdb.FatalException:
                    raise
                except duckdb.Error as exc:   # the next close tries again
                    self.log.warning("checkpoint of %s.db after closes failed: %s", db, exc)

    def expect_close(self, session: str, ends: dict[int, int]) -> None:
        """Keep `session`'s ends while some log has not been loaded up to them."""
        if any(self.loaded.get(log, 0) < position for log, position in ends.items()):
            known = self.closing.setdefault(session, {})
            for log, position in ends.items():
                known[log] = max(known.get(log, 0), position)

    def closed_before(self, kind: int, body: dict, writer: int, position: int) -> str | None:
        """The session of a record a close has already removed (not to be loaded), else None."""
        if kind not in SESSION_KINDS:
            return None
        session = body.get("session")
        ends = self.closing.get(session)
        return session if ends is not None and position < ends.get(writer, 0) else None

    def settle_closing(self) -> None:
        """Forget the closes every log has been loaded past (after each batch)."""
        done = [s for s, ends in self.closing.items() if all(self.loaded.get(w, 0) >= p for w, p in ends.items())]
        for session in done:
            del self.closing[session]

    def apply_close(self, session: str, ends: dict[int, int], writer: int, lsn: int) -> int:
        """Delete the session's rows before `ends` (the close row is at (writer, lsn)); returns how
        many. Where their records sit in the logs is noted first, in the same transaction as the
        messages.db deletions, so the log's compaction can find them whatever else fails.

        Every statement is bounded by the session's times (its summary row, every sum merged
        first): rows are appended in log order, so DuckDB reads only the row groups of the
        session's life, not the whole file, and a close costs about what a read of the session
        does. (Unbounded, each of its dozen scans read every row group, and under the store's
        memory limit the first one was refused for memory at 2M rows: the close failed and was
        retried after every batch.)"""
        if not ends:
            return 0
        self.merge_summaries(force=True)   # before a row is recomputed from the rows: no sum of them pending
        cond = " OR ".join("(writer = ? AND lsn < ?)" for _ in ends)
        args = [v for pair in ends.items() for v in pair]
        econ, mcon = self.conns["events"], self.conns["messages"]
        events = self.memory["events"].run(econ, lambda: econ.execute(
            f"SELECT DISTINCT lsn, writer FROM events WHERE session = ? AND ts BETWEEN ? AND ? AND ({cond})",
            [session, *_span(econ, session), *args]).fetchall())
        count = self._delete_rows("messages", session, cond, args, events)
        self.newest.forget(session)   # after the deletion: a query meanwhile saw the rows (newest_blobs.py)
        count += self._delete_rows("events", session, cond, args, [])
        self.memory["messages"].run(mcon, lambda: mcon.execute(
            "UPDATE closed_sessions SET applied = true WHERE writer = ? AND lsn = ?", [writer, lsn]))
        return count

    def _delete_rows(self, db: str, session: str, cond: str, args: list, also: list[tuple[int, int]]) -> int:
        """One file's rows of the session under `cond`, each table keeping its logs' progress; in
        messages.db the records' places (and `also`'s, [(lsn, writer)]) go to closed_records.
        Refused for memory (a session of a big value), once more with the limit raised."""
        con = self.conns[db]
        return self.memory[db].run(con, lambda: self._delete_rows_once(con, db, session, cond, args, also))

    def _delete_rows_once(self, con: duckdb.DuckDBPyConnection, db: str, session: str, cond: str, args: list,
                          also: list[tuple[int, int]]) -> int:
        bounds = _span(con, session)
        con.execute("BEGIN TRANSACTION")
        try:
            count = 0
            places = list(also)
            for table in DB_TABLES[db]:
                where = f"session = ? AND ts BETWEEN ? AND ? AND ({cond})"
                doomed = sorted(set(con.execute(f"DELETE FROM {table} WHERE {where} RETURNING lsn, writer",
                                                [session, *bounds, *args]).fetchall()))
                if not doomed:
                    continue
                newest: dict[int, int] = {}
                for lsn, w in doomed:
                    newest[w] = max(newest.get(w, -1), lsn)
                for w, top in newest.items():
                    # Nothing of log w after the deleted rows: they held its newest position in
                    # this table, which an open reads as the table's progress. A stand-in keeps it
                    # (and the stand-in before it, of an older position, goes).
                    if con.execute(f"SELECT 1 FROM {table} WHERE writer = ? AND lsn > ? LIMIT 1", [w, top]).fetchone():
                        continue
                    con.execute(f"DELETE FROM {table} WHERE session = '' AND writer = ? AND lsn < ?", [w, top])
                    con.execute(f"INSERT INTO {table} VALUES {PROGRESS_ROWS[table]}", [w, top])
                places += doomed
                count += len(doomed)
            if db == "messages" and places:
                ordered = sorted(set(places))   # one statement: executemany took 18 ms for 60 rows
                con.execute("INSERT INTO closed_records SELECT ?, unnest(?::SMALLINT[]), unnest(?::BIGINT[])",
                            [session, [w for _, w in ordered], [lsn for lsn, _ in ordered]])
            if count:   # from what the id holds after the close, if anything
                session_summary.recompute(con, db, session, bounds)
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        return count

    def prune_closes(self) -> int:
        """Delete the rows of closes that are done: applied, every log loaded past their ends, and
        none of the session's records left in any log. Each log's newest close row stays (the
        file's progress); a log rebuilt from the bucket replays the CLOSE records anyway."""
        with self.loading:   # the loader writes through the same connection, and sets `closing`
            waiting = sorted(self.closing)
            (count,) = self.conns["messages"].execute(
                "DELETE FROM closed_sessions c WHERE applied "
                "AND NOT EXISTS (SELECT 1 FROM closed_records r WHERE r.session = c.session) "
                "AND session NOT IN (SELECT unnest(?::VARCHAR[])) "
                "AND lsn < (SELECT max(lsn) FROM closed_sessions m WHERE m.writer = c.writer)", [waiting]).fetchone()
        return count

    def closed_records(self, log: int, end: int, limit: int = 20_000) -> list[list]:
        """[position, session, closed at] of records of closed sessions before `end` in `log` (a
        pass's question)."""
        return [list(r) for r in self.pass_cursors["messages"].execute(
            "SELECT r.position, r.session, max(s.ts) FROM closed_records r JOIN closed_sessions s "
            "ON r.session = s.session WHERE r.log = ? AND r.position < ? GROUP BY r.position, r.session "
            "ORDER BY r.position LIMIT ?", [log, end, limit]).fetchall()]

    def forget_closed(self, log: int, start: int, end: int) -> int:
        """The log's compaction dropped the closed sessions' records in [start, end)."""
        con = self.conns["messages"]
        with self.loading:   # the loader writes through the same connection
            (count,) = con.execute("DELETE FROM closed_records WHERE log = ? AND position >= ? AND position < ?",
                                   [log, start, end]).fetchone()
        return count


def _span(con: duckdb.DuckDBPyConnection, session: str) -> tuple[float, float]:
    """The times between which the file holds every row of the session (its summary row); a
    session it holds no row of gets bounds no row lies between."""
    return session_summary.span(con, session, None) or (math.inf, -math.inf)
