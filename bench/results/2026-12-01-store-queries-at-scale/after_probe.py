"""Payload compaction, a segment at a time (copy_live + swap, the real code), over a store of many
sessions: the same rows as before_probe.py, laid out as the loader lays them out now (segments of
SEGMENT_ROWS payloads, sparse files).

    python after_probe.py DIR SESSIONS [PAYLOAD_BYTES]

Opens the Store as writer/store does (64 MB over four files), compacts every sealed segment once
(as passes of the store's compaction task would, without their time budget) and prints the total
and the longest step (copy_live holds the loader's lock only for its query; swap holds it whole),
the bytes freed and the process's peak RSS.
"""
import logging
import os
import resource
import sys
import time
from pathlib import Path

import duckdb

sys.path.insert(0, os.environ.get("ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
from storage import payload_compaction, payload_segments, schema  # noqa: E402
from storage.store import Store  # noqa: E402


def build(root: Path, sessions: int, size: int) -> tuple[int, int]:
    db = root / "db"
    (db / payload_segments.DIR_NAME).mkdir(parents=True)
    (root / "wal" / "0").mkdir(parents=True)
    rows_per = payload_segments.SEGMENT_ROWS
    place = f"((n // {rows_per}) << {payload_segments.SHIFT}) + (n % {rows_per}) * {size}"
    con = duckdb.connect(str(db / "messages.db"), config={"memory_limit": "2GB"})
    for stmt in schema.DATABASES["messages"]:
        con.execute(stmt)
    con.execute(f"INSERT INTO checkpoints SELECT 'sess-' || s, 'default', 'agent', '', q, q IN (0, 3), q * 4, NULL, "
                f"1.7e9, 0, n, {place}, {size} FROM (SELECT s, q, s * 4 + q AS n FROM range({sessions}) a(s), range(4) b(q))")
    base = sessions * 4
    con.execute(f"INSERT INTO checkpoints SELECT 'ext-' || s, 'default', 'blob', 'k' || q, q, false, 0, NULL, 1.7e9, 0, n, "
                f"{place}, {size} FROM (SELECT s, q, {base} + s * 5 + q AS n FROM range({sessions // 5}) a(s), range(5) b(q))")
    con.execute("CHECKPOINT")
    con.close()
    rows = base + sessions // 5 * 5
    segments = -(-rows // rows_per)
    for number in range(segments):
        with open(db / payload_segments.DIR_NAME / f"{number:08d}", "wb") as f:
            f.truncate(min(rows_per, rows - number * rows_per) * size)
    return rows, segments


def main() -> None:
    root, sessions = Path(sys.argv[1]), int(sys.argv[2])
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    logging.basicConfig(level=logging.WARNING)
    t0 = time.monotonic()
    rows, segments = build(root, sessions, size)
    print(f"built: {rows} checkpoint rows in {segments} segments, {rows * size / 2**20:.1f} MB in "
          f"{time.monotonic() - t0:.1f} s")
    store = Store(root, 1, 64)
    t0 = time.monotonic()
    store.open()
    print(f"store opened in {time.monotonic() - t0:.2f} s, {store.payloads.total_bytes} payload bytes")
    t0 = time.monotonic()
    freed = moved = 0
    longest_copy = longest_swap = 0.0
    failed = None
    for segment in payload_compaction.order(store):
        try:
            t1 = time.monotonic()
            plan = payload_compaction.copy_live(store, segment)
            t2 = time.monotonic()
            longest_copy = max(longest_copy, t2 - t1)
            if plan is not None:
                freed += payload_compaction.swap(store, plan)
                moved += len(plan.moves[0])
                longest_swap = max(longest_swap, time.monotonic() - t2)
        except Exception as exc:  # noqa: BLE001 — the probe reports it
            failed = f"segment {segment}: {type(exc).__name__}: {str(exc)[:200]}"
            break
    print(f"compacted {segments} segments in {time.monotonic() - t0:.2f} s: {moved} live rows moved, {freed} bytes "
          f"freed, {store.payloads.total_bytes} payload bytes left; longest copy_live {longest_copy:.3f} s, "
          f"longest swap {longest_swap:.3f} s" + (f"; FAILED at {failed}" if failed else ""))
    store.close()
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
