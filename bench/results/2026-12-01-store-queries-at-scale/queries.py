"""writer/store's queries over messages.db (checkpoints) at scale, under the store's per-file limit.

    python queries.py DB SESSIONS [MB]   # builds DB if missing: SESSIONS agent sessions with 3
                                         # checkpoints each (a full snapshot, two deltas) and
                                         # SESSIONS/5 external ('blob') sessions with 5 each; then
                                         # runs each query with one thread (as the store does)
                                         # under MB (default 16) and prints time, rows or the error
"""
import os
import sys
import time

import duckdb

sys.path.insert(0, os.environ.get("ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
from storage import schema  # noqa: E402
from storage.payload_compaction import SEGMENT_ROWS_LIVE  # noqa: E402

# the payload compaction's query before payload segments (storage/payload_compaction.py at 67b7d76)
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
from storage.store_queries import SUPERSEDED  # noqa: E402


def build(path: str, sessions: int) -> None:
    con = duckdb.connect(path, config={"memory_limit": "2GB"})
    for stmt in schema.DATABASES["messages"]:
        con.execute(stmt)
    # agent sessions: seq 0 full, 1..2 deltas; payloads 20 KB apart in the payload file
    con.execute(
        "INSERT INTO checkpoints SELECT 'sess-' || lower(lpad(to_hex(s), 16, '0')), 'default', 'agent', '', q, q = 0, q * 4, "
        "NULL, 1.7e9 + s, 0, s * 3 + q, (s * 3 + q) * 20480, 20480 FROM range(?) t(s), range(3) u(q)", [sessions])
    base = sessions * 3
    con.execute(
        "INSERT INTO checkpoints SELECT 'ext-' || lower(lpad(to_hex(s), 16, '0')), 'default', 'blob', 'step-' || q, q, false, "
        "0, NULL, 1.7e9 + s, 0, ? + s * 5 + q, (? + s * 5 + q) * 20480, 20480 FROM range(?) t(s), range(5) u(q)",
        [base, base, sessions // 5])
    con.execute("CHECKPOINT")
    con.close()


def main() -> None:
    path, sessions = sys.argv[1], int(sys.argv[2])
    mb = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    if not os.path.exists(path):
        t0 = time.monotonic()
        build(path, sessions)
        print(f"built {path}: {sessions} agent sessions, {sessions // 5} blob sessions in {time.monotonic() - t0:.1f} s")
    total = sessions * 3 + sessions // 5 * 5
    queries = {
        "store open: max(lsn) by writer": ("SELECT writer, max(lsn) FROM checkpoints GROUP BY writer", []),
        "store open: DISTINCT kind, session": ("SELECT DISTINCT kind, session FROM checkpoints", []),
        "store open: payload end": ("SELECT coalesce(max(payload_at + payload_len), 0) FROM checkpoints", []),
        "payload compaction before: LIVE_ROWS (every row)": (LIVE_ROWS, [total * 20480]),
        "payload compaction after: SEGMENT_ROWS_LIVE (16,384 rows' range)": (
            SEGMENT_ROWS_LIVE, [sessions * 20480, (sessions + 16384) * 20480]),
        "log compaction: SUPERSEDED (a 64 MB segment's range)": (
            "SELECT lsn, session, seq FROM checkpoints WHERE kind = 'blob' AND writer = ? AND lsn IN "
            f"({SUPERSEDED}) ORDER BY lsn", [0, 0, sessions * 3, sessions * 3 + 3200]),
        "checkpoint_chain of one session": (
            "SELECT seq, first_idx, is_full, payload_at, payload_len, payload IS NULL FROM checkpoints "
            "WHERE session = ? AND kind = 'agent' ORDER BY seq", [f"sess-{sessions // 2:016x}"]),
        "blob_latest of one session": (
            "SELECT key, seq, payload, payload_at, payload_len FROM checkpoints WHERE session = ? AND kind = 'blob' "
            "ORDER BY seq DESC LIMIT 1", [f"ext-{sessions // 10:016x}"]),
    }
    con = duckdb.connect(path, config={"memory_limit": f"{mb}MB", "threads": 1})
    print(f"{total} checkpoint rows, memory_limit {mb} MB, threads 1, duckdb {duckdb.__version__}")
    for name, (sql, args) in queries.items():
        t0 = time.monotonic()
        try:
            rows = con.execute(sql, args).fetchall()
            print(f"  {name}: {len(rows)} rows in {time.monotonic() - t0:.3f} s")
        except duckdb.Error as exc:
            print(f"  {name}: FAILED after {time.monotonic() - t0:.3f} s: {type(exc).__name__}: {str(exc)[:160]}")
    con.close()


if __name__ == "__main__":
    main()
