"""One row per session in messages.db and in events.db (`session_summary`): how many rows it has
that count (transcript messages; events) and the times of its first and last row.

Without it, listing a tenant's sessions aggregated every row of the tenant's transcript for each
page, and reading one session's transcript, checkpoint chain or events scanned the whole table
(DuckDB used no index for `session = ?`; an ART index on it cost 200 MB of memory and 9× the file
at 5M rows). Rows are appended in log order, so `ts` rises through a table, and DuckDB skips
every row group whose `ts` range lies outside the session's [first_at, last_at]: a session's
reads cost the rows written during its life, not every row ever written
(bench/results/2026-12-04-session-reads-dec04-thirtyfourth/).

The loader merges each batch's sums in the same transaction as the batch's rows, so a summary is
exactly as far as its file's rows (a restart repeats nothing). A close recomputes the session's
row from the rows it leaves. Deleting a superseded checkpoint leaves `first_at` as it was: a
bound that is still below every row of the session, and still its first activity.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

TABLE = "session_summary"
DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (session VARCHAR, tenant VARCHAR, counted BIGINT, "
       "first_at DOUBLE, last_at DOUBLE)")
# Per file: each table that feeds its summary, where its rows (as projected, storage/projection.py)
# hold `ts`, and whether they are counted (a checkpoint only stretches its session's life).
SOURCES: dict[str, tuple[tuple[str, int, bool], ...]] = {
    "messages": (("messages", 7, True), ("checkpoints", 8, False)),
    "events": (("events", 6, True),),
}

MERGE = (f"MERGE INTO {TABLE} s USING (SELECT unnest($1::VARCHAR[]) AS session, unnest($2::VARCHAR[]) AS tenant, "
         "unnest($3::BIGINT[]) AS counted, unnest($4::DOUBLE[]) AS first_at, unnest($5::DOUBLE[]) AS last_at) b "
         "ON s.session = b.session "
         "WHEN MATCHED THEN UPDATE SET counted = s.counted + b.counted, first_at = least(s.first_at, b.first_at), "
         "last_at = greatest(s.last_at, b.last_at) "
         "WHEN NOT MATCHED THEN INSERT VALUES (b.session, b.tenant, b.counted, b.first_at, b.last_at)")


def _from_rows(db: str, where: str) -> str:
    """A row per session from the file's rows ('' names the rows that only keep a log's progress)."""
    parts = [f"SELECT session, tenant, {'count(*)' if counted else '0'} AS n, min(ts) AS first_at, "
             f"max(ts) AS last_at FROM {table} WHERE {where} GROUP BY session, tenant"
             for table, _, counted in SOURCES[db]]
    return ("SELECT session, any_value(tenant), sum(n), min(first_at), max(last_at) FROM ("
            + " UNION ALL ".join(parts) + ") GROUP BY session")


def merge_statement(db: str, rows: dict[str, list[tuple]]) -> tuple[str, list] | None:
    """The statement that adds a batch's rows (by table) to file `db`'s summary; None if none."""
    sums: dict[str, list] = {}
    for table, ts_at, counted in SOURCES[db]:
        for row in rows.get(table, ()):
            session, at = row[0], row[ts_at]
            if not session:
                continue
            entry = sums.get(session)
            if entry is None:
                sums[session] = [row[1], int(counted), at, at]
            else:
                entry[1] += counted
                if at < entry[2]:
                    entry[2] = at
                if at > entry[3]:
                    entry[3] = at
    if not sums:
        return None
    values = list(sums.values())
    return MERGE, [list(sums), [v[0] for v in values], [v[1] for v in values], [v[2] for v in values],
                   [v[3] for v in values]]


def create(con: "duckdb.DuckDBPyConnection") -> bool:
    """Make the table; True if it was not there (a file from before it: `fill` it)."""
    (existed,) = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [TABLE]).fetchone()
    con.execute(DDL)
    return not existed


def fill(con: "duckdb.DuckDBPyConnection", db: str) -> int:
    """Build the whole summary from the rows (once, for a file made before it); returns sessions."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"DELETE FROM {TABLE}")
        con.execute(f"INSERT INTO {TABLE} " + _from_rows(db, "session <> ''"))
        (count,) = con.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return count


def recompute(con: "duckdb.DuckDBPyConnection", db: str, session: str) -> None:
    """The session's row again from the rows it has now (inside the caller's transaction)."""
    con.execute(f"DELETE FROM {TABLE} WHERE session = ?", [session])
    con.execute(f"INSERT INTO {TABLE} " + _from_rows(db, "session = $1"), [session])


def span(cursor: "duckdb.DuckDBPyConnection", session: str, tenant: str | None) -> tuple[float, float] | None:
    """(first_at, last_at) of the session's rows, None if it has none (of this tenant)."""
    clause, args = (" AND tenant = ?", [tenant]) if tenant else ("", [])
    return cursor.execute(f"SELECT first_at, last_at FROM {TABLE} WHERE session = ?" + clause,
                          [session, *args]).fetchone()


def page(cursor: "duckdb.DuckDBPyConnection", after: str, tenant: str | None, limit: int) -> list[tuple]:
    """(session, counted, first_at, last_at) of up to `limit` sessions after `after`, by id."""
    clause, args = (" AND tenant = ?", [tenant]) if tenant else ("", [])
    return cursor.execute(f"SELECT session, counted, first_at, last_at FROM {TABLE} WHERE session > ?" + clause +
                          " ORDER BY session LIMIT ?", [after, *args, limit]).fetchall()
