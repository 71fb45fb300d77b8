"""The queries writer/store answers over the journals of flow runs (the `flows` DuckDB file):
one run's journal, the open runs a restarted actor recovers, the tenant's listing of runs, the
admissions a restarted actor reads back into its queues' rate windows, and the ended runs
retention removes. `StoreQueries` (storage/store_queries.py) mixes them in.
"""
from __future__ import annotations

import time
from typing import Any

import msgpack
import orjson

from broker.protocol import RUN_STATES_OPEN
from storage import records

EXPIRED_PER_ANSWER = 5000     # runs per `expired_runs` answer (see q_expired_runs)
RUNS_SCAN = 1000              # runs a page of `runs` filtered by flow or by status reads at most
HEAD_BYTES = 1024             # of an older run's start or end body: what a listing reads (see q_runs)
ADMISSIONS_PER_ANSWER = 20_000   # the latest admissions into flow queues a `recent_admissions` answer holds


class RunQueries:
    """Needs `cursors` (one per DuckDB file) of a Store."""

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
               match: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """The tenant's flow runs by id after `cursor_run` ('' = from the first), or with `desc`
        from the last down, before `cursor_run` ('' = from the last); not the agent turns' own
        (their ids hold a '/'); only those started in [`since`, `until`) if given. Each with its
        flow, status (scheduled, enqueued or running until it ends; the filter `open` is any of
        them), times, and its parent, queue, schedule, delayed start and the run it was forked
        from if it has them. Of one `flow`, one `status` or those whose start named the `match`'s
        queue, queue_key and schedule (broker/protocol.py RUN_MATCH), a page reads at most
        RUNS_SCAN runs, so it may hold fewer than `limit`, even none, and still name the next:
        the listing ends where the cursor is None."""
        # The page's starts first (a top-N of one record type), then the ends in its range of ids,
        # from the columns the loader fills for this (schema.py `name`, `parent`): no body is read
        # (a GROUP BY of every run's start and end, whole bodies, went past the store's memory
        # limit at 100,000 runs; the heads of the bodies alone took 130-250 ms a page there).
        picky = flow is not None or status is not None or bool(match)
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
            if (flow is None or row["flow"] == flow) and all(row.get(k) == v for k, v in (match or {}).items()) \
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
