"""The read queries writer/store answers over the bus, one method each, on the query thread with
its own cursors (a slow query never stops the loader), and compaction's questions, on the pass
thread with cursors of their own (`on_pass`: a pass's question never holds up a read).
`Store` (storage/store.py) mixes them in.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, TypeVar

import duckdb
import msgpack
import orjson

from broker.protocol import RUN_STATES_OPEN, RUN_STATUSES
from storage import duck_memory, records, schema, session_summary
from storage.newest_blobs import Newest

MAX_LIMIT = 1000
EXPIRED_PER_ANSWER = 5000     # runs per `expired_runs` answer (see q_expired_runs)
RUNS_SCAN = 1000              # runs a page of `runs` filtered by flow or by status reads at most
HEAD_BYTES = 1024             # of an older run's start or end body: what a listing reads (see q_runs)
ADMISSIONS_PER_ANSWER = 20_000   # the latest admissions into flow queues a `recent_admissions` answer holds
T = TypeVar("T")


class StoreQueries:
    """Needs: `cursors`, `pass_cursors` and `memory` (one per DuckDB file), `passing`, `payloads`,
    `checkpointed`, `newest`, `loaded` and `summary_pending` of a Store."""

    def query(self, name: str, session: str, tenant: str | None = None, turn: str | None = None,
              after: int = -1, limit: int = 100, before: int | None = None,
              desc: bool = False, flow: str | None = None, status: str | None = None,
              at: float | None = None, since: float | None = None,
              until: float | None = None, queue: str | None = None) -> tuple[list[dict[str, Any]], int | str | None]:
        """(rows, cursor for the next page or None). A transcript or events page may also be bounded
        above (`before`, exclusive) and come newest first (`desc`; its cursor is then the oldest
        row's, for the page before it). A page of runs may be of one `flow`, one `status` and one `queue`, of
        runs started in [`since`, `until`), and newest first too (`desc`: `session` is then the
        cursor below which it starts). Sessions
        with `desc` come the most recently active first, below the cursor (`at`, `session`)."""
        limit = max(1, min(limit, MAX_LIMIT))
        if name == "runs":
            if not tenant or (status is not None and status not in RUN_STATUSES) or before is not None:
                raise ValueError(f"runs: a tenant, a status of {', '.join(RUN_STATUSES)}, and no before "
                                 "(the cursor is `session`)")
            return self.roomy(StoreQueries.q_runs, self, session, tenant, limit, flow, status, desc, since, until,
                              queue)
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

    def q_flow_records(self, session, tenant, turn, after, limit):
        """The whole journal of run `session`, in log order."""
        rows = self.cursors["flows"].execute("SELECT body FROM flow_records WHERE run = ? AND body IS NOT NULL "
                                             "ORDER BY writer, lsn",   # (not the progress rows, run '')
                                             [session]).fetchall()
        return [msgpack.unpackb(body) for (body,) in rows], None

    def q_open_runs(self, session, tenant, turn, after, limit):
        """Runs started and not ended (every shard's: the caller keeps its own)."""
        # One aggregate over the two record types, not DISTINCT ... NOT IN (a second hash table
        # over every ended run): the journal holds every run of the retention window.
        rows = self.cursors["flows"].execute(
            "SELECT run FROM flow_records WHERE type IN ('run.started', 'run.ended') GROUP BY run "
            "HAVING count(*) FILTER (WHERE type = 'run.ended') = 0").fetchall()
        return [{"run_id": run} for (run,) in rows], None

    def q_runs(self, cursor_run: str, tenant: str, limit: int, flow: str | None, status: str | None,
               desc: bool = False, since: float | None = None, until: float | None = None,
               queue: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """The tenant's flow runs by id after `cursor_run` ('' = from the first), or with `desc`
        from the last down, before `cursor_run` ('' = from the last); not the agent turns' own
        (their ids hold a '/'); only those started in [`since`, `until`) if given. Each with its
        flow, status (scheduled, enqueued or running until it ends; the filter `open` is any of
        them), times, and its parent, queue, schedule, delayed start and the run it was forked
        from if it has them. Of one `flow`, one `status` or one `queue`, a page reads
        at most RUNS_SCAN runs, so it may hold fewer than `limit`, even
        none, and still name the next: the listing ends where the cursor is None."""
        # The page's starts first (a top-N of one record type), then the ends in its range of ids,
        # from the columns the loader fills for this (schema.py `name`, `parent`): no body is read
        # (a GROUP BY of every run's start and end, whole bodies, went past the store's memory
        # limit at 100,000 runs; the heads of the bodies alone took 130-250 ms a page there).
        picky = flow is not None or status is not None or queue is not None
        bound, bound_args = ("run > ?", [cursor_run]) if not desc else ("run < ?", [cursor_run]) if cursor_run \
            else ("true", [])
        # A window on the start's time is cheap whatever the ids: the log's order is the time's, so
        # DuckDB skips the row groups from outside it.
        window = [(" AND ts >= ?", since), (" AND ts < ?", until)]
        cursor = self.cursors["flows"]
        page = cursor.execute(
            f"SELECT run, name, parent, ts, extra FROM flow_records WHERE tenant = ? AND {bound} AND type = 'run.started' "
            f"AND NOT contains(run, '/'){''.join(c for c, v in window if v is not None)} "
            f"ORDER BY run{' DESC' if desc else ''} LIMIT ?",
            [tenant, *bound_args, *(float(v) for _, v in window if v is not None),
             RUNS_SCAN if picky else limit + 1]).fetchall()
        if not page:
            return [], None
        ends = {run: (name, ts) for run, name, ts in cursor.execute(
            "SELECT run, any_value(name), max(ts) FROM flow_records WHERE type = 'run.ended' AND run >= ? "
            "AND run <= ? AND tenant = ? GROUP BY run",
            [min(page[0][0], page[-1][0]), max(page[0][0], page[-1][0]), tenant]).fetchall()}
        older = [run for run, name, _, _, _ in page if name is None or (run in ends and ends[run][0] is None)]
        heads = self._older_heads(older) if older else {}
        extras = {run: orjson.loads(extra) for run, _, _, _, extra in page if extra}
        queued = [run for run, extra in extras.items() if run not in ends and extra.get("queue")]
        admitted = self._admitted(queued, tenant) if queued else set()
        now = time.time()
        out: list[dict[str, Any]] = []
        for run, name, parent, at, _ in page:
            end, extra = ends.get(run), extras.get(run, {})
            first, last = heads.get((run, "run.started"), {}), heads.get((run, "run.ended"), {})
            # As the run's own view says (actors/flow_state.py Run.summary), from its start and
            # whether it was admitted: a delayed start cannot have run anything before its time.
            state = end[0] or last.get("status") if end else "scheduled" if extra.get("start_at", 0) > now \
                else "enqueued" if extra.get("queue") and run not in admitted else "running"
            row = {"run_id": run, "flow": name or first.get("flow"), "status": state,
                   "started_at": at, "ended_at": end[1] if end else None}
            if parent or first.get("parent"):
                row["parent"] = parent or first["parent"]
            row.update(extra)
            if (flow is None or row["flow"] == flow) and (queue is None or row.get("queue") == queue) \
                    and (status is None or state == status or (status == "open" and state in RUN_STATES_OPEN)):
                out.append(row)
                if len(out) > limit:
                    return out[:limit], out[limit - 1]["run_id"]
        return out, (page[-1][0] if picky and len(page) == RUNS_SCAN else None)

    def _admitted(self, runs: list[str], tenant: str) -> set[str]:
        """Which of these runs (queued, not ended) have had their place in their queue."""
        rows = self.cursors["flows"].execute(
            "SELECT DISTINCT run FROM flow_records WHERE type = 'run.admitted' AND run >= ? AND run <= ? "
            "AND tenant = ?", [min(runs), max(runs), tenant]).fetchall()
        return {run for (run,) in rows} & set(runs)

    def _older_heads(self, runs: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
        """The flow, parent and status of runs whose starts or ends were loaded before the
        columns that name them: from the heads of their bodies (what is listed comes before the
        input and the result, which may be megabytes)."""
        rows = self.cursors["flows"].execute(
            f"SELECT run, type, body[1:{HEAD_BYTES}] FROM flow_records WHERE run IN (SELECT unnest(?)) "
            "AND type IN ('run.started', 'run.ended')", [runs]).fetchall()
        return {(run, kind): records.head_fields(head, ("flow", "parent", "status")) for run, kind, head in rows}

    def q_recent_admissions(self, session, tenant, turn, after, limit):
        """Runs admitted into a flow queue at or after `after` (UNIX seconds), ended or not, with
        the queue and key they waited in (the latest ADMISSIONS_PER_ANSWER): what a restarted
        actor lists of a rate's window to a scheduler that may have restarted too
        (actors/run_queues.py)."""
        rows = self.cursors["flows"].execute(
            "WITH a AS (SELECT run, max(ts) AS admitted FROM flow_records WHERE type = 'run.admitted' AND ts >= ? "
            "GROUP BY run ORDER BY admitted DESC LIMIT ?) "
            "SELECT a.run, s.tenant, a.admitted, s.extra FROM a JOIN flow_records s ON s.run = a.run "
            "AND s.type = 'run.started' AND s.extra IS NOT NULL",
            [float(after), ADMISSIONS_PER_ANSWER]).fetchall()
        out = []
        for run, tenant, at, extra in rows:
            listed = orjson.loads(extra)
            if listed.get("queue"):
                out.append({"run_id": run, "tenant": tenant, "at": at, "queue": listed["queue"],
                            "queue_key": listed.get("queue_key", "")})
        return out, None

    def q_expired_runs(self, session, tenant, turn, after, limit):
        """Runs that ended before `after` (UNIX seconds) as [run, log, position of its first record,
        of its last] (a run's records all go to one log), with how far each log has been loaded."""
        # At most EXPIRED_PER_ANSWER runs, the longest ended first: after a long pause (or the
        # first pass over an old journal) every run of days may have expired at once, and all of
        # them in one answer would not fit the store's memory limit; the next pass takes the next
        # ones (the oldest are the likeliest to sit in sealed segments compaction can rewrite).
        rows = self.cursors["flows"].execute(
            "SELECT run, any_value(writer), min(lsn), max(lsn) FROM flow_records WHERE run IN "
            "(SELECT run FROM flow_records WHERE type = 'run.ended' AND ts < ? ORDER BY ts LIMIT ?) GROUP BY run",
            [float(after), EXPIRED_PER_ANSWER]).fetchall()
        return [{"runs": [list(row) for row in rows], "loaded": {str(w): p for w, p in self.loaded.items()}}], None

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
