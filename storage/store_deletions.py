"""The rows writer/store deletes: superseded external checkpoints, expired flow runs, old access
rows. Each deletion keeps the row that holds its file's progress (a log's largest lsn), so a
restart does not load those records again. A mixin of `storage.store.Store`; each holds the
loader's lock, since the loader writes through the same connection.
"""
from __future__ import annotations

ACCESS_PURGE_ROWS = 500_000   # access rows deleted per retention pass, at most


class StoreDeletions:
    """Needs: `conns` (one per DuckDB file) and `loading` of a Store."""

    def forget_superseded(self, writer: int, start: int, end: int, positions: list[int]) -> int:
        """Delete the rows of the superseded external checkpoints at `positions` in [start, end)
        of log `writer` — those its compaction was named and dropped (the log no longer has them,
        nothing reads them) — keeping the writer's largest lsn: it is the file's progress. By the
        positions named, not by what is superseded now: a checkpoint superseded since is still in
        the log, and a pass names it only while its row is there (it stayed in the log for good:
        bench/results/2026-12-03-forget-by-positions-leak/)."""
        with self.loading:   # the loader writes through the same connection
            con = self.conns["messages"]
            con.execute("BEGIN TRANSACTION")
            try:
                (top,) = con.execute("SELECT max(lsn) FROM checkpoints WHERE writer = ?", [writer]).fetchone()
                (count,) = con.execute(
                    "DELETE FROM checkpoints WHERE kind = 'blob' AND writer = ? AND lsn >= ? AND lsn < ? "
                    "AND lsn <> ? AND lsn IN (SELECT unnest(?::BIGINT[]))",
                    [writer, start, end, top if top is not None else -1, positions]).fetchone()
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            return count

    def purge_runs(self, runs: list[str]) -> int:
        """Delete the rows of these runs, keeping each log's progress (its largest lsn) in place."""
        if not runs:
            return 0
        with self.loading:   # the loader writes through the same connection
            return self._purge_runs(runs)

    def _purge_runs(self, runs: list[str]) -> int:
        con = self.conns["flows"]
        con.execute("BEGIN TRANSACTION")
        try:
            marks = con.execute("SELECT writer, max(lsn) FROM flow_records GROUP BY writer").fetchall()
            count = con.execute("SELECT count(*) FROM flow_records WHERE run IN (SELECT unnest(?))", [runs]).fetchone()[0]
            con.execute("DELETE FROM flow_records WHERE run IN (SELECT unnest(?))", [runs])
            for writer, lsn in marks:  # a progress mark, so a restart does not read these records again
                con.execute("INSERT INTO flow_records VALUES ('', '', 'progress', -1, NULL, 0, ?, ?, NULL, NULL, NULL)",
                            [writer, lsn])
            con.execute("DELETE FROM flow_records WHERE type = 'progress' AND lsn < (SELECT max(lsn) FROM flow_records "
                        "f WHERE f.writer = flow_records.writer)")
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        return count

    def purge_access(self, before: float) -> int:
        """Delete access rows older than `before` (UNIX seconds), at most ACCESS_PURGE_ROWS a call
        (a busy server writes millions a day; the next call goes on), keeping each log's newest
        row: it is the file's progress."""
        with self.loading:   # the loader writes through the same connection
            con = self.conns["access"]
            con.execute("BEGIN TRANSACTION")
            try:
                (count,) = con.execute(
                    "DELETE FROM access WHERE rowid IN (SELECT rowid FROM access a WHERE ts < ? AND "
                    "lsn < (SELECT max(lsn) FROM access b WHERE b.writer = a.writer) LIMIT ?)",
                    [before, ACCESS_PURGE_ROWS]).fetchone()
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
        return count
