"""The read queries writer/store answers over the bus, one method each, on the query thread with
its own cursors (a slow query never stops the loader), and compaction's questions, on the pass
thread with cursors of their own (`on_pass`: a pass's question never holds up a read).
`Store` (storage/store.py) mixes them in.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, TypeVar

import duckdb
import msgpack
import orjson

from broker.protocol import RUN_MATCH, RUN_STATUSES
from storage import duck_memory, schema, session_summary
from storage.newest_blobs import Newest
from storage.run_queries import RunQueries

MAX_LIMIT = 1000
T = TypeVar("T")


class StoreQueries(RunQueries):
    """Needs: `cursors`, `pass_cursors` and `memory` (one per DuckDB file), `passing`, `payloads`,
    `checkpointed`, `newest`, `loaded` and `summary_pending` of a Store."""

    def query(self, name: str, session: str, tenant: str | None = None, turn: str | None = None,
              after: int = -1, limit: int = 100, before: int | None = None,
              desc: bool = False, flow: str | None = None, status: str | None = None,
              at: float | None = None, since: float | None = None,
              until: float | None = None, match: dict[str, str] | None = None,
              ) -> tuple[list[dict[str, Any]], int | str | None]:
        """(rows, cursor for the next page or None). A transcript or events page may also be bounded
        above (`before`, exclusive) and come newest first (`desc`; its cursor is then the oldest
        row's, for the page before it). A page of runs may be of one `flow`, one `status` and one
        `match` (queue, queue_key, schedule: broker/protocol.py RUN_MATCH), of
        runs started in [`since`, `until`), and newest first too (`desc`: `session` is then the
        cursor below which it starts). Sessions
        with `desc` come the most recently active first, below the cursor (`at`, `session`)."""
        limit = max(1, min(limit, MAX_LIMIT))
        if name == "runs":
            if not tenant or (status is not None and status not in RUN_STATUSES) or before is not None:
                raise ValueError(f"runs: a tenant, a status of {', '.join(RUN_STATUSES)}, and no before "
                                 "(the cursor is `session`)")
            if match and not set(match) <= set(RUN_MATCH):
                raise ValueError(f"runs: match only {', '.join(RUN_MATCH)}")
            return self.roomy(StoreQueries.q_runs, self, session, tenant, limit, flow, status, desc, since, until,
                              match)
        if name == "sessions" and desc:
            if before is not None or (session and at is None):
                raise ValueError("sessions, most recent first: the cursor is a session and its time (at)")
            return self.roomy(StoreQueries.q_recent_sessions, self, (float(at), session) if session else None, tenant,
                              limit)
        handler = QUERIES.get(name)
        if handler is None:
            raise ValueError(f"unknown query {name!r}")
        if name in PAGED_BOTH_WAYS:
            return self.roomy(handler, self, session, tenant, turn, after, limit, before, desc)
        if before is not None or desc:
            raise ValueError(f"query {name!r} pages forward only (no before, no desc)")
        return self.roomy(handler, self, session, tenant, turn, after, limit)

    def roomy(self, call: Callable[..., T], *args: Any) -> T:
        """call(*args) on the query thread; refused by DuckDB for memory, once more with every
        file's limit raised: rows holding big values (storage/duck_memory.py)."""
        try:
            return call(*args)
        except duckdb.Error as exc:
            if not duck_memory.refused_for_memory(exc):
                raise
        with contextlib.ExitStack() as raised:
            for db, cursor in self.cursors.items():
                raised.enter_context(self.memory[db].raised(cursor))
            return call(*args)

    def on_pass(self, call: Callable[..., T], *args: Any) -> T:
        """call(*args) on the pass thread: a compaction or retention pass's question or deletion.
        Such a question goes over a whole table (which checkpoints a segment holds are superseded:
        half a second for 60,000 of them), so it has cursors of its own and never holds up a read.
        It runs with every file's limit raised: at the small limit it did not hold at 20,000
        checkpoints of 510 sessions (16 MB; the log then kept them all), and beside the reads it
        would take the memory they need — a payload copy's raise itself was refused
        for memory then (DuckDB needs a little to change its limit)."""
        with self.passing, contextlib.ExitStack() as raised:   # a recycle waits for the cursors
            for db, cursor in self.pass_cursors.items():
                raised.enter_context(self.memory[db].raised(cursor))
            return call(*args)

    def _tenant_clause(self, tenant: str | None) -> tuple[str, list]:
        return (" AND tenant = ?", [tenant]) if tenant else ("", [])

    @contextlib.contextmanager
    def _lifetime(self, session: str, tenant: str | None, db: str = "messages",
                  chain: bool = False) -> Iterator[tuple[float, float] | None]:
        """The session's (first, last) row time in file `db`, None if it has no rows there; inside a
        read transaction on that file, so the block's reads see the rows the summary counted. Bounds
        on `ts` let DuckDB skip the row groups from outside the session's life
        (storage/session_summary.py). Two statements, not one with the bounds as subqueries: those
        cost 2 ms more at 1M rows. `chain`: from where its checkpoint chain starts instead (its
        newest full snapshot's), not its first row."""
        summary = self.summary_pending[db]
        pending = summary.span(session, tenant)   # before the table (session_summary.Pending)
        pending_chain = summary.chain(session) if chain and pending is not None else None
        cursor = self.cursors[db]
        cursor.execute("BEGIN TRANSACTION")
        try:
            merged = session_summary.span(cursor, session, tenant, chain)
            if merged is None or pending is None:
                bounds = merged or pending
            else:
                bounds = min(merged[0], pending[0]), max(merged[1], pending[1])
            if pending_chain is not None and bounds is not None:
                chain_from, has_full = pending_chain
                # a full snapshot not merged yet starts the chain; deltas not merged can only lower it
                low = chain_from if has_full or merged is None else min(merged[0], chain_from)
                bounds = low, bounds[1]
            yield bounds
        finally:
            cursor.execute("ROLLBACK")   # read only

    def q_messages(self, session, tenant, turn, after, limit, before=None, desc=False):
        clause, args = self._tenant_clause(tenant)
        page, page_args = _page("idx", before, desc, limit)
        with self._lifetime(session, tenant) as span:
            if span is None:
                return [], None
            rows = self.cursors["messages"].execute(
                "SELECT idx, turn, role, content, extra, ts FROM messages WHERE session = ? AND ts >= ? AND ts <= ? "
                "AND idx > ?" + clause + page, [session, *span, after, *args, *page_args]).fetchall()
        out = []
        for idx, turn_id, role, content, extra, at in rows[:limit]:
            row = {"index": idx, "turn_id": turn_id, "role": role, "content": content, "at": at}
            if extra:
                row.update(orjson.loads(extra))
            out.append(row)
        return out, (out[-1]["index"] if len(rows) > limit else None)

    def q_events(self, session, tenant, turn, after, limit, before=None, desc=False):
        clause, args = self._tenant_clause(tenant)
        if turn:
            clause += " AND turn = ?"
            args.append(turn)
        page, page_args = _page("lsn", before, desc, limit)
        with self._lifetime(session, tenant, "events") as span:
            if span is None:
                return [], None
            rows = self.cursors["events"].execute(
                "SELECT lsn, turn, seq, type, data, ts FROM events WHERE session = ? AND ts >= ? AND ts <= ? AND lsn > ?"
                + clause + page, [session, *span, after, *args, *page_args]).fetchall()
        out = [{"cursor": lsn, "turn_id": turn_id, "seq": seq, "type": kind,
                "data": orjson.loads(data) if data else None, "at": at}
               for lsn, turn_id, seq, kind, data, at in rows[:limit]]
        return out, (out[-1]["cursor"] if len(rows) > limit else None)

    def q_sessions(self, session, tenant, turn, after, limit):
        """The tenant's sessions that hold a transcript or an external checkpoint, by id, after
        `session` ('' = from the first): how many messages each has, its first and last record's time."""
        rows = session_summary.page(self.cursors["messages"], self.summary_pending["messages"], session, tenant,
                                    limit + 1)
        out = [{"session_id": sid, "messages": int(n), "first_at": first, "last_at": last}
               for sid, n, first, last in rows[:limit]]
        return out, (out[-1]["session_id"] if len(rows) > limit else None)

    def q_session(self, session, tenant, turn, after, limit):
        """One session as `q_sessions` lists it; no row if it holds nothing."""
        row = session_summary.one(self.cursors["messages"], self.summary_pending["messages"], session, tenant)
        return ([{"session_id": session, "messages": int(row[0]), "first_at": row[1], "last_at": row[2]}]
                if row else []), None

    def q_recent_sessions(self, before: tuple[float, str] | None, tenant: str | None, limit: int):
        """As `q_sessions`, the most recently active first, below `before` ((last_at, session));
        the next page's cursor is the last session's id (and its `last_at`)."""
        rows = session_summary.recent_page(self.cursors["messages"], self.summary_pending["messages"], before,
                                           tenant, limit + 1)
        out = [{"session_id": sid, "messages": int(n), "first_at": first, "last_at": last}
               for sid, n, first, last in rows[:limit]]
        return out, (out[-1]["session_id"] if len(rows) > limit else None)

    def q_checkpoint_chain(self, session, tenant, turn, after, limit):
        """The last full snapshot of an agent session and the deltas after it, in order."""
        if f"agent:{session}" not in self.checkpointed:
            return [], None
        clause, args = self._tenant_clause(tenant)
        # One scan for the session's rows (without payloads); only the chain's payloads are read.
        with self._lifetime(session, tenant, chain=True) as span:
            if span is None:
                return [], None
            rows = self.cursors["messages"].execute(
                "SELECT seq, first_idx, is_full, payload_at, payload_len, payload IS NULL FROM checkpoints "
                "WHERE session = ? AND ts >= ? AND ts <= ? AND kind = 'agent'" + clause + " ORDER BY seq",
                [session, *span, *args]).fetchall()
        fulls = [i for i, row in enumerate(rows) if row[2]]
        chain = rows[fulls[-1]:] if fulls else rows
        return [{"seq": seq, "first": first, "full": full,
                 "messages": msgpack.unpackb(self._chain_payload(session, seq, at, length, in_file))}
                for seq, first, full, at, length, in_file in chain], None

    def _chain_payload(self, session: str, seq: int, at: int | None, length: int | None, in_file: bool) -> bytes:
        if in_file and at is not None:
            return self.payloads.read(at, length)
        # a row from before payloads moved out of DuckDB
        (inline,) = self.cursors["messages"].execute(
            "SELECT payload FROM checkpoints WHERE session = ? AND kind = 'agent' AND seq = ?", [session, seq]).fetchone()
        return bytes(inline)

    def has_blobs(self, session: str) -> bool:
        """False if the session certainly has no external checkpoint loaded (a Bloom filter: True
        may be a false "maybe"; safe beside the loader, which only adds to it)."""
        return f"blob:{session}" in self.checkpointed

    def q_blob_latest(self, session, tenant, turn, after, limit):
        if not self.has_blobs(session):
            return [], None
        if (rows := self.known_latest(session, tenant)) is not None:
            return rows, None
        removals = self.newest.removals   # before the query: see storage/newest_blobs.py
        clause, args = self._tenant_clause(tenant)
        # a scan of the row groups of the session's life: DuckDB makes no index lookup of it
        with self._lifetime(session, tenant) as span:
            if span is None:
                return [], None
            row = self.cursors["messages"].execute(
                "SELECT key, seq, payload, payload_at, payload_len, tenant, writer, lsn FROM checkpoints WHERE "
                "session = ? AND ts >= ? AND ts <= ? AND kind = 'blob'" + clause + " ORDER BY seq DESC LIMIT 1",
                [session, *span, *args]).fetchone()
        if row is None:
            return [], None
        key, seq, inline, at, length, row_tenant, writer, lsn = row
        if at is not None:   # a session's rows are all its tenant's (gateway/tenancy.py): the newest
            self.newest.answered(session, Newest(row_tenant, key, seq, at, length, True, writer, lsn), removals)
        return [{"key": key, "seq": seq, "payload": self._payload(inline, at, length)}], None

    def known_latest(self, session: str, tenant: str | None) -> list[dict] | None:
        """`blob_latest`'s rows from where the session's newest external checkpoint is known to lie
        (storage/newest_blobs.py), one payload read; None if that is not known. OSError if the
        place is gone (a payload compaction moved it since: read again)."""
        known = self.newest.get(session)
        if known is None or (tenant and known.tenant != tenant):
            return None
        return [{"key": known.key, "seq": known.seq, "payload": self.payloads.read(known.at, known.length)}]

    def q_blob_filter(self, session, tenant, turn, after, limit):
        """The Bloom filter of the sessions with checkpoints (`checkpointed`), for the gateway: a
        session it does not hold is certainly without an external checkpoint so far loaded."""
        return [self.checkpointed.state()], None

    def superseded_blobs(self, writer: int, start: int, end: int) -> list[list]:
        """[position, session, seq] of the external checkpoints in [start, end) of log `writer`
        older than their session's newest loaded one, by position (a pass's question)."""
        rows = self.pass_cursors["messages"].execute(
            "SELECT lsn, session, seq FROM checkpoints WHERE kind = 'blob' AND writer = ? AND lsn IN "
            f"({SUPERSEDED}) ORDER BY lsn", [writer, writer, start, end]).fetchall()
        return [list(row) for row in rows]

    def _payload(self, inline: bytes | None, at: int | None, length: int | None) -> bytes:
        return bytes(inline) if at is None else self.payloads.read(at, length)

    def q_count(self, session, tenant, turn, after, limit):
        """Rows per table (for tests and operators; `session` "" counts everything)."""
        out = {}
        for table, db in schema.TABLE_DB.items():
            sql = f"SELECT count(*) FROM {table}" + (" WHERE session = ?" if session else "")
            out[table] = self.cursors[db].execute(sql, [session] if session else []).fetchone()[0]
        return [out], None


def _page(position: str, before: int | None, desc: bool, limit: int) -> tuple[str, list]:
    """The end of a page's statement: its upper bound, its order, and one row more than the page
    (which tells whether another page follows)."""
    bound = f" AND {position} < ?" if before is not None else ""
    return (f"{bound} ORDER BY {position}{' DESC' if desc else ''} LIMIT ?",
            ([before] if before is not None else []) + [limit + 1])


SUPERSEDED = (
    "WITH seg AS (SELECT session, seq, lsn FROM checkpoints WHERE kind = 'blob' AND writer = ? AND lsn >= ? AND lsn < ?), "
    "newest AS (SELECT session, max(seq) AS seq FROM checkpoints WHERE kind = 'blob' "
    "AND session IN (SELECT session FROM seg) GROUP BY session) "
    "SELECT seg.lsn FROM seg JOIN newest ON seg.session = newest.session WHERE seg.seq < newest.seq")

QUERIES = {"messages": StoreQueries.q_messages, "events": StoreQueries.q_events, "sessions": StoreQueries.q_sessions,
           "session": StoreQueries.q_session,
           "checkpoint_chain": StoreQueries.q_checkpoint_chain, "blob_latest": StoreQueries.q_blob_latest,
           "blob_filter": StoreQueries.q_blob_filter,
           "count": StoreQueries.q_count, "flow_records": StoreQueries.q_flow_records,
           "open_runs": StoreQueries.q_open_runs, "expired_runs": StoreQueries.q_expired_runs,
           "recent_admissions": StoreQueries.q_recent_admissions}
PAGED_BOTH_WAYS = {"messages", "events"}
