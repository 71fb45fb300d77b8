"""One row per session in messages.db and in events.db (`session_summary`): how many rows it has
that count (transcript messages; events) and the times of its first and last row.

Without it, listing a tenant's sessions aggregated every row of the tenant's transcript for each
page, and reading one session's transcript, checkpoint chain or events scanned the whole table
(DuckDB used no index for `session = ?`; an ART index on it cost 200 MB of memory and 9× the file
at 5M rows). Rows are appended in log order, so `ts` rises through a table, and DuckDB skips
every row group whose `ts` range lies outside the session's [first_at, last_at]: a session's
reads cost the rows written during its life, not every row ever written
(bench/results/2026-12-04-session-reads-dec04-thirtyfourth-3/).

Merged about once a second, not in every load batch: a MERGE costs about 2 ms whatever its size,
and a batch loaded for a reader who waits for it (a flow start with an Idempotency-Key asks the
store for the run's journal) took 7.5-8.9 ms with one per file against 4.1 without. Until then a
batch's sums wait in `Pending` — staged before the batch commits, kept once it has — and readers
add them to what the table says, so a read sees every row committed. `session_summary_progress`
says how far into each log the table holds; it is written in the merge's transaction, and at open
the rows past it are summed again (a crash loses only the sums in memory, never the rows).

`chain_from` (messages.db) bounds the read of a session's checkpoint chain — its newest full
snapshot and the deltas after it, what an actor reads to load a session after its TTL or a
restart — to the time since that snapshot, not the session's whole life: a session that lives for
days reads the row groups of its last few steps (`storage.snapshot_every`), not of its days. It is
the smallest `ts` among the session's agent checkpoints from its newest full one on (a minimum,
not the full one's own time, so a clock that stepped back cannot leave a delta out), kept as the
rows come in log order (a session's checkpoints are appended in `seq` order by its actor): a full
checkpoint starts it again, a delta can only lower it. NULL (a row from before the column): the
chain read falls back to the session's first row.

A close merges what is pending, then recomputes the session's row from the rows it leaves.
Deleting a superseded checkpoint leaves `first_at` as it was: a bound that is still below every
row of the session, and still its first activity.
"""
from __future__ import annotations

import threading
import time

import duckdb

TABLE = "session_summary"
PROGRESS = "session_summary_progress"
DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (session VARCHAR, tenant VARCHAR, counted BIGINT, "
       "first_at DOUBLE, last_at DOUBLE, chain_from DOUBLE)",
       f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS chain_from DOUBLE",   # a file from before it: NULLs
       f"CREATE TABLE IF NOT EXISTS {PROGRESS} (writer SMALLINT, position BIGINT)")
COLUMNS = "session, tenant, counted, first_at, last_at, chain_from"
# Per file: each table that feeds its summary, where its rows (as projected, storage/projection.py)
# hold `ts`, and whether they are counted (a checkpoint only stretches its session's life).
SOURCES: dict[str, tuple[tuple[str, int, bool], ...]] = {
    "messages": (("messages", 7, True), ("checkpoints", 8, False)),
    "events": (("events", 6, True),),
}
MERGE_EVERY_SECS = 1.0

# b (sums of later rows) after s: a full checkpoint among b's rows starts the chain again; else
# b's agent checkpoints are deltas that can only lower it, and an unknown (NULL) stays unknown.
_MERGE = (f"MERGE INTO {TABLE} s USING ({{source}}) b ON s.session = b.session "
          "WHEN MATCHED THEN UPDATE SET counted = s.counted + b.counted, first_at = least(s.first_at, b.first_at), "
          "last_at = greatest(s.last_at, b.last_at), chain_from = CASE WHEN b.has_full THEN b.chain_from "
          "WHEN b.chain_from IS NULL OR s.chain_from IS NULL THEN s.chain_from "
          "ELSE least(s.chain_from, b.chain_from) END "
          "WHEN NOT MATCHED THEN INSERT VALUES (b.session, b.tenant, b.counted, b.first_at, b.last_at, b.chain_from)")
_LISTS = ("SELECT unnest($1::VARCHAR[]) AS session, unnest($2::VARCHAR[]) AS tenant, unnest($3::BIGINT[]) AS counted, "
          "unnest($4::DOUBLE[]) AS first_at, unnest($5::DOUBLE[]) AS last_at, unnest($6::DOUBLE[]) AS chain_from, "
          "unnest($7::BOOLEAN[]) AS has_full")
# Where a checkpoints row (as projected) holds its kind and whether it is a full snapshot.
KIND_AT, FULL_AT, CHAIN_TS_AT = 2, 5, 8


def _from_rows(db: str, where: str) -> str:
    """A row per session from the file's rows under `where` ('' names the rows that only keep a
    log's progress), with the MERGE's `has_full` (whether those rows hold a full agent checkpoint)."""
    parts = [f"SELECT session, tenant, {'count(*)' if counted else '0'} AS n, min(ts) AS first_at, "
             f"max(ts) AS last_at FROM {table} WHERE {where} GROUP BY session, tenant"
             for table, _, counted in SOURCES[db]]
    sums = ("SELECT session, any_value(tenant) AS tenant, sum(n) AS counted, min(first_at) AS first_at, "
            "max(last_at) AS last_at FROM (" + " UNION ALL ".join(parts) + ") GROUP BY session")
    if db != "messages":
        return f"SELECT *, NULL::DOUBLE AS chain_from, false AS has_full FROM ({sums})"
    # the chain: from each session's newest full agent checkpoint among these rows (all of its
    # agent checkpoints if none is full)
    chains = ("SELECT session, min(ts) AS chain_from, bool_or(is_full) AS has_full FROM ("
              "SELECT session, ts, seq, is_full, max(CASE WHEN is_full THEN seq END) OVER (PARTITION BY session) "
              f"AS full_seq FROM checkpoints WHERE kind = 'agent' AND ({where})) "
              "WHERE full_seq IS NULL OR seq >= full_seq GROUP BY session")
    return (f"SELECT s.session, s.tenant, s.counted, s.first_at, s.last_at, ch.chain_from, "
            f"coalesce(ch.has_full, false) AS has_full FROM ({sums}) s LEFT JOIN ({chains}) ch ON s.session = ch.session")


def _chain_after(chains: dict[str, list], session: str, chain_from: float, has_full: bool) -> None:
    """The session's chain with later agent checkpoints added (`has_full`: a full one among them)."""
    entry = chains.get(session)
    if entry is None or has_full:
        chains[session] = [chain_from, has_full]
    elif chain_from < entry[0]:
        entry[0] = chain_from


def _add(sums: dict[str, list], session: str, tenant: str, counted: int, first: float, last: float) -> None:
    entry = sums.get(session)
    if entry is None:
        sums[session] = [tenant, counted, first, last]
    else:
        entry[1] += counted
        if first < entry[2]:
            entry[2] = first
        if last > entry[3]:
            entry[3] = last


class Pending:
    """One file's sums not yet merged into its table: `staged` for the batch being committed,
    `kept` for the batches committed. The loader writes them; readers on other threads only look
    (a dict read or a list's item read is whole under the GIL), and look before they read the
    table, since `kept` is emptied only after its merge commits."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.staged: dict[str, list] = {}
        self.kept: dict[str, list] = {}
        # session -> [chain_from, has_full] of its agent checkpoints among the sums (module docstring)
        self.staged_chains: dict[str, list] = {}
        self.kept_chains: dict[str, list] = {}
        self.lock = threading.Lock()   # a merge (loader or close) against another

    def stage(self, rows: dict[str, list[tuple]]) -> None:
        """A batch's rows (by table), before its commit: its rows are readable as soon as it commits."""
        staged: dict[str, list] = {}
        for table, ts_at, counted in SOURCES[self.db]:
            for row in rows.get(table, ()):
                if row[0]:
                    _add(staged, row[0], row[1], int(counted), row[ts_at], row[ts_at])
        chains: dict[str, list] = {}
        if self.db == "messages":
            for row in rows.get("checkpoints", ()):   # in log order
                if row[0] and row[KIND_AT] == "agent":
                    _chain_after(chains, row[0], row[CHAIN_TS_AT], bool(row[FULL_AT]))
        self.staged, self.staged_chains = staged, chains

    def committed(self) -> None:
        for session, (tenant, counted, first, last) in self.staged.items():
            _add(self.kept, session, tenant, counted, first, last)
        for session, (chain_from, has_full) in self.staged_chains.items():
            _chain_after(self.kept_chains, session, chain_from, has_full)
        self.staged, self.staged_chains = {}, {}

    def discard(self) -> None:
        self.staged, self.staged_chains = {}, {}

    def chain(self, session: str) -> list | None:
        """[chain_from, has_full] of the session's agent checkpoints among the sums not merged."""
        kept, staged = self.kept_chains.get(session), self.staged_chains.get(session)
        if kept is None or staged is None:
            return list(staged or kept) if (staged or kept) else None
        combined = {session: list(kept)}   # a copy: readers never change the sums
        _chain_after(combined, session, *staged)
        return combined[session]

    def span(self, session: str, tenant: str | None) -> tuple[float, float] | None:
        """The session's times among the sums not merged (staged ones too: a bound may be wide)."""
        out = None
        for sums in (self.staged, self.kept):
            entry = sums.get(session)
            if entry is not None and (not tenant or entry[0] == tenant):
                out = (entry[2], entry[3]) if out is None else (min(out[0], entry[2]), max(out[1], entry[3]))
        return out

    def after(self, after: str, tenant: str | None) -> dict[str, list]:
        """Committed sessions past `after` (of the tenant) with their sums not yet merged."""
        return {s: list(e) for s, e in list(self.kept.items()) if s > after and (not tenant or e[0] == tenant)}

    def merge(self, con: duckdb.DuckDBPyConnection, positions: dict[int, int]) -> int:
        """Merge the kept sums into the table, noting `positions` (the file's progress: every row
        before them is committed, and now merged) in the same transaction; returns sessions merged."""
        with self.lock:
            kept = self.kept
            if not kept:
                return 0
            values = list(kept.values())
            chains = [self.kept_chains.get(session, (None, False)) for session in kept]
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(_MERGE.format(source=_LISTS), [list(kept), [v[0] for v in values], [v[1] for v in values],
                                                          [v[2] for v in values], [v[3] for v in values],
                                                          [c[0] for c in chains], [c[1] for c in chains]])
                _note_progress(con, positions)
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            self.kept, self.kept_chains = {}, {}
            return len(values)


class SessionSummaries:
    """Mixed into Store (storage/store.py): needs `conns`, `memory`, `progress`, `log`, `loading`,
    `summary_pending` ({file: Pending}) and `summary_merged` (when they were last merged)."""

    def merge_summaries(self, force: bool = False) -> None:
        """Merge the sessions' pending sums into each file's summary, at most once a
        MERGE_EVERY_SECS unless `force`. Holding the loader's lock. A failure keeps them pending
        for the next time (and is raised if forced)."""
        if not force and time.monotonic() - self.summary_merged < MERGE_EVERY_SECS:
            return
        self.summary_merged = time.monotonic()
        for db, pending in self.summary_pending.items():
            if not pending.kept:
                continue
            con = self.conns[db]
            try:
                self.memory[db].run(con, lambda: pending.merge(con, dict(self.progress[db])))
            except duckdb.FatalException:
                raise
            except Exception as exc:   # DuckDB trouble (memory, a full disk): the sums stay pending
                self.log.warning("merging the session summary of %s.db failed; will retry: %s", db, exc)
                if force:
                    raise

    def merge_before_close(self) -> None:
        """What is pending, merged: spares the next open summing those rows again."""
        try:
            with self.loading:
                self.merge_summaries(force=True)
        except Exception as exc:
            self.log.warning("session summaries not merged at close (the next open sums them): %s", exc)


def _note_progress(con: duckdb.DuckDBPyConnection, positions: dict[int, int]) -> None:
    con.execute(f"DELETE FROM {PROGRESS}")
    if positions:
        con.executemany(f"INSERT INTO {PROGRESS} VALUES (?, ?)", [[w, p] for w, p in sorted(positions.items())])


def open_summary(con: duckdb.DuckDBPyConnection, db: str, positions: dict[int, int]) -> tuple[bool, int]:
    """At open, before loading: make the tables, then sum the rows the table does not hold yet —
    all of them in a file made before it, else those past its progress (a crash came before their
    merge). Returns (whether the file was made before it, sessions merged)."""
    existed = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name IN (?, ?) "
                                               "AND database_name = current_database()", [TABLE, PROGRESS]).fetchall()}
    if TABLE in existed and PROGRESS not in existed:   # merged in every batch, by the first version: built again
        con.execute(f"DROP TABLE {TABLE}")
        existed.clear()
    for ddl in DDL:
        con.execute(ddl)
    if TABLE not in existed:
        con.execute(f"DELETE FROM {PROGRESS}")   # nothing is merged into a new table
    noted = dict(con.execute(f"SELECT writer, position FROM {PROGRESS}").fetchall())
    # every row the file holds is merged once this commits
    past = " OR ".join([f"(writer = {int(w)} AND lsn >= {int(p)})" for w, p in noted.items()]
                       + ([f"writer NOT IN ({', '.join(str(int(w)) for w in noted)})"] if noted else ["true"]))
    con.execute("BEGIN TRANSACTION")
    try:
        (merged,) = con.execute(_MERGE.format(source=_from_rows(db, f"session <> '' AND ({past})"))).fetchone()
        _note_progress(con, positions)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return TABLE not in existed, merged


def recompute(con: duckdb.DuckDBPyConnection, db: str, session: str, bounds: tuple[float, float]) -> None:
    """The session's row again from the rows it has now, all of them between `bounds` (its row's
    times before; inside the caller's transaction, its pending sums merged first)."""
    con.execute(f"DELETE FROM {TABLE} WHERE session = ?", [session])
    con.execute(f"INSERT INTO {TABLE} SELECT {COLUMNS} FROM (" + _from_rows(db, "session = $1 AND ts BETWEEN $2 AND $3")
                + ")", [session, *bounds])


def span(cursor: duckdb.DuckDBPyConnection, session: str, tenant: str | None,
         chain: bool = False) -> tuple[float, float] | None:
    """(first_at, last_at) of the session's merged rows, None if none (of this tenant). `chain`:
    from where its checkpoint chain starts instead (its first row if that is not known)."""
    clause, args = (" AND tenant = ?", [tenant]) if tenant else ("", [])
    low = "coalesce(chain_from, first_at)" if chain else "first_at"
    return cursor.execute(f"SELECT {low}, last_at FROM {TABLE} WHERE session = ?" + clause,
                          [session, *args]).fetchone()


def page(cursor: duckdb.DuckDBPyConnection, pending: Pending, after: str, tenant: str | None,
         limit: int) -> list[tuple]:
    """(session, counted, first_at, last_at) of up to `limit` sessions after `after`, by id."""
    clause, args = (" AND tenant = ?", [tenant]) if tenant else ("", [])
    with pending.lock:   # no merge between the two reads: its sums would count twice
        extra = pending.after(after, tenant)
        rows = cursor.execute(f"SELECT session, tenant, counted, first_at, last_at FROM {TABLE} WHERE session > ?" +
                              clause + " ORDER BY session LIMIT ?", [after, *args, limit]).fetchall()
    sums = {session: [tenant_, counted, first, last] for session, tenant_, counted, first, last in rows}
    for session, (tenant_, counted, first, last) in extra.items():
        _add(sums, session, tenant_, counted, first, last)
    return [(s, sums[s][1], sums[s][2], sums[s][3]) for s in sorted(sums)[:limit]]


def one(cursor: duckdb.DuckDBPyConnection, pending: Pending, session: str, tenant: str | None) -> tuple | None:
    """(counted, first_at, last_at) of the session as `page` lists it; None if it holds nothing."""
    clause, args = (" AND tenant = ?", [tenant]) if tenant else ("", [])
    with pending.lock:   # no merge between the two reads: its sums would count twice
        entry = pending.kept.get(session)
        extra = list(entry) if entry is not None and (not tenant or entry[0] == tenant) else None
        row = cursor.execute(f"SELECT tenant, counted, first_at, last_at FROM {TABLE} WHERE session = ?" + clause,
                             [session, *args]).fetchone()
    sums = {session: list(row)} if row else {}
    if extra:
        _add(sums, session, *extra)
    return tuple(sums[session][1:]) if sums else None


def recent_page(cursor: duckdb.DuckDBPyConnection, pending: Pending, before: tuple[float, str] | None,
                tenant: str | None, limit: int) -> list[tuple]:
    """(session, counted, first_at, last_at) of up to `limit` sessions, the most recently active
    first (`last_at`, then the id, descending), below `before` ((last_at, session)). A session
    active since a page was read is listed again at its new place, as a chat's list moves it up."""
    clause, args = (" AND tenant = ?", [tenant]) if tenant else ("", [])
    below, below_args = ((" AND (last_at < ? OR (last_at = ? AND session < ?))", [before[0], before[0], before[1]])
                         if before else ("", []))
    with pending.lock:   # no merge between the reads: its sums would count twice
        extra = pending.after("", tenant)   # ('' names no session)
        # The sessions with sums not merged yet are placed by their whole sums, not by the table's
        # older time: there they would take a place on the page and leave it short.
        rows = cursor.execute(f"SELECT session, tenant, counted, first_at, last_at FROM {TABLE} WHERE session <> '' "
                              "AND session NOT IN (SELECT unnest(?))" + clause + below +
                              " ORDER BY last_at DESC, session DESC LIMIT ?",
                              [list(extra), *args, *below_args, limit]).fetchall()
        if extra:
            rows += cursor.execute(f"SELECT session, tenant, counted, first_at, last_at FROM {TABLE} "
                                   "WHERE session IN (SELECT unnest(?))", [list(extra)]).fetchall()
    sums = {session: [tenant_, counted, first, last] for session, tenant_, counted, first, last in rows}
    for session, (tenant_, counted, first, last) in extra.items():
        _add(sums, session, tenant_, counted, first, last)
    ranked = sorted(((entry[3], session) for session, entry in sums.items()
                     if before is None or (entry[3], session) < before), reverse=True)[:limit]
    return [(session, sums[session][1], sums[session][2], last) for last, session in ranked]
