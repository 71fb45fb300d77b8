"""The old payload compaction's swap, alone: one transaction moving the place of every live row
(a temp table of moves, joined) and clearing every other row's, under the store's limit (16 MB,
one thread). Rolled back at the end, so the database is left as it was.

    python update_all_rows.py DB      # a DB built by queries.py
"""
import sys
import time

import duckdb

con = duckdb.connect(sys.argv[1], config={"memory_limit": "16MB", "threads": 1})
rows = con.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
t0 = time.monotonic()
con.execute("BEGIN TRANSACTION")
con.execute("CREATE TEMP TABLE payload_moves (writer SMALLINT, lsn BIGINT, new_at BIGINT)")
con.execute("INSERT INTO payload_moves SELECT 0, lsn, lsn * 7 FROM checkpoints WHERE lsn % 4 = 3")
moves = con.execute("SELECT count(*) FROM payload_moves").fetchone()[0]
print(f"{rows} rows, {moves} moves")
try:
    con.execute("UPDATE checkpoints SET payload_at = NULL, payload_len = NULL WHERE payload_at < ? AND NOT EXISTS "
                "(SELECT 1 FROM payload_moves m WHERE m.writer = checkpoints.writer AND m.lsn = checkpoints.lsn)",
                [1 << 62])
    print(f"  dead rows cleared after {time.monotonic() - t0:.1f} s")
    con.execute("UPDATE checkpoints SET payload_at = m.new_at FROM payload_moves m "
                "WHERE checkpoints.writer = m.writer AND checkpoints.lsn = m.lsn")
    print(f"  live rows moved after {time.monotonic() - t0:.1f} s")
except duckdb.Error as exc:
    print(f"  FAILED after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {str(exc)[:160]}")
con.execute("ROLLBACK")
