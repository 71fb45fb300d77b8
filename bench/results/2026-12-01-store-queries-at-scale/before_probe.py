"""The payload compaction (copy_live + swap, the real code) over a store of many sessions.

    ROOT=<tree at the code before> python before_probe.py DIR SESSIONS [PAYLOAD_BYTES]

Builds DIR/db/messages.db with SESSIONS agent sessions (3 checkpoints each: a full snapshot, two
deltas, then a newer full snapshot, so 2 of 4 rows are garbage) and SESSIONS/5 blob sessions (5
each, 4 garbage), payloads PAYLOAD_BYTES (default 256) each, laid out in the payload file in
insertion order (the file is sparse: its bytes are zeros). Then opens the Store as writer/store
does (64 MB over four files) and runs one payload compaction, printing its time, whether it
failed, and the process's peak RSS.
"""
import logging
import os
import resource
import sys
import time
from pathlib import Path

import duckdb

sys.path.insert(0, os.environ.get("ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
from storage import payload_compaction, schema  # noqa: E402
from storage.store import Store  # noqa: E402


def build(root: Path, sessions: int, size: int) -> int:
    db = root / "db"
    db.mkdir(parents=True)
    (root / "wal" / "0").mkdir(parents=True)
    con = duckdb.connect(str(db / "messages.db"), config={"memory_limit": "2GB"})
    for stmt in schema.DATABASES["messages"]:
        con.execute(stmt)
    con.execute(
        "INSERT INTO checkpoints SELECT 'sess-' || lower(to_hex(s)), 'default', 'agent', '', q, q IN (0, 3), q * 4, "
        "NULL, 1.7e9, 0, s * 4 + q, (s * 4 + q) * ?, ? FROM range(?) t(s), range(4) u(q)", [size, size, sessions])
    base = sessions * 4
    blobs = sessions // 5
    con.execute(
        "INSERT INTO checkpoints SELECT 'ext-' || lower(to_hex(s)), 'default', 'blob', 'k' || q, q, false, 0, NULL, "
        "1.7e9, 0, ? + s * 5 + q, (? + s * 5 + q) * ?, ? FROM range(?) t(s), range(5) u(q)",
        [base, base, size, size, blobs])
    rows = base + blobs * 5
    con.execute("CHECKPOINT")
    con.close()
    with open(db / payload_compaction.BASE_NAME, "wb") as f:
        f.truncate(rows * size)
    return rows


def main() -> None:
    root, sessions = Path(sys.argv[1]), int(sys.argv[2])
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    logging.basicConfig(level=logging.INFO)
    if not root.exists():
        t0 = time.monotonic()
        rows = build(root, sessions, size)
        print(f"built: {rows} checkpoint rows, payload file {rows * size / 2**20:.1f} MB in {time.monotonic() - t0:.1f} s")
    store = Store(root, 1, 64)
    t0 = time.monotonic()
    store.open()
    print(f"store opened in {time.monotonic() - t0:.2f} s, payload file end {store.payloads.end}")
    t0 = time.monotonic()
    try:
        plan = payload_compaction.copy_live(store, 1)
        print(f"copy_live: {'nothing to do' if plan is None else f'{len(plan.moves[0])} live rows'} "
              f"in {time.monotonic() - t0:.2f} s")
        if plan is not None:
            t1 = time.monotonic()
            freed = payload_compaction.swap(store, plan)
            print(f"swap: {freed} bytes freed in {time.monotonic() - t1:.2f} s")
    except Exception as exc:  # noqa: BLE001 — the probe reports it
        print(f"FAILED after {time.monotonic() - t0:.2f} s: {type(exc).__name__}: {str(exc)[:200]}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
