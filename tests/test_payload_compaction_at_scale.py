"""Payload compaction over a store of many sessions, under writer/store's default DuckDB memory
limit. Deciding what is live asks, per checkpoint, for its session's newest one; asked of every
session at once (300,000 here) that ran out of DuckDB's 16 MB per file, so the payloads were never
compacted and the disk only filled. A segment at a time, the question only covers its own rows."""
import duckdb

from storage import payload_compaction, payload_segments, schema
from storage.store import Store

SESSIONS = 300_000           # agent sessions, four checkpoints each (full, delta, delta, full)
BLOB_SESSIONS = 60_000       # external runtimes' sessions, five checkpoints each
SIZE = 64                    # bytes per payload
ROWS = payload_segments.SEGMENT_ROWS


def build(tmp_path) -> int:
    """messages.db and sparse payload segments laid out as the loader would have: rows in load
    order, ROWS to a segment. Returns the number of segments."""
    db = tmp_path / "db"
    (db / payload_segments.DIR_NAME).mkdir(parents=True)
    (tmp_path / "wal" / "0").mkdir(parents=True)
    with duckdb.connect(str(db / "messages.db")) as con:
        for ddl in schema.DATABASES["messages"]:
            con.execute(ddl)
        place = f"((n // {ROWS}) << {payload_segments.SHIFT}) + (n % {ROWS}) * {SIZE}"
        con.execute(f"INSERT INTO checkpoints SELECT 'sess-' || s, 't', 'agent', '', q, q IN (0, 3), q, NULL, 1.0, 0, n, "
                    f"{place}, {SIZE} FROM (SELECT s, q, s * 4 + q AS n FROM range({SESSIONS}) a(s), range(4) b(q))")
        base = SESSIONS * 4
        con.execute(f"INSERT INTO checkpoints SELECT 'ext-' || s, 't', 'blob', 'k' || q, q, false, 0, NULL, 1.0, 0, n, "
                    f"{place}, {SIZE} FROM (SELECT s, q, {base} + s * 5 + q AS n FROM range({BLOB_SESSIONS}) a(s), "
                    "range(5) b(q))")
    rows = SESSIONS * 4 + BLOB_SESSIONS * 5
    segments = -(-rows // ROWS)
    for number in range(segments):
        with open(db / payload_segments.DIR_NAME / f"{number:08d}", "wb") as f:
            f.truncate(min(ROWS, rows - number * ROWS) * SIZE)
    return segments


def test_payload_segments_compact_with_hundreds_of_thousands_of_sessions(tmp_path):
    segments = build(tmp_path)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)   # the default: 16 MB per DuckDB file
    store.open()
    try:
        assert payload_compaction.order(store) == list(range(segments))
        # the first two segments (agent sessions only: of each, its newest full snapshot is live),
        # and the last (external checkpoints: each session's newest is live)
        for segment in (0, 1, segments - 1):
            plan = payload_compaction.copy_live(store, segment)
            assert plan is not None
            rows_there = min(ROWS, SESSIONS * 4 + BLOB_SESSIONS * 5 - segment * ROWS)
            live_share = 1 / 4 if segment < segments - 1 else 1 / 5
            assert abs(len(plan.moves[0]) - rows_there * live_share) <= 1
            assert payload_compaction.swap(store, plan) == (rows_there - len(plan.moves[0])) * SIZE
        names = sorted(p.name for p in (tmp_path / "db" / payload_segments.DIR_NAME).iterdir())
        assert "00000000" not in names and "00000001" not in names and f"{segments:08d}" in names
        # a moved chain and a moved external checkpoint read back from their new place
        chain = store.conns["messages"].execute(
            "SELECT seq, payload_at >> 40 FROM checkpoints WHERE session = 'sess-10' AND payload_at IS NOT NULL"
        ).fetchall()
        assert chain == [(3, segments)]
        assert store.query("blob_latest", f"ext-{BLOB_SESSIONS - 1}")[0][0]["payload"] == bytes(SIZE)
    finally:
        store.close()
