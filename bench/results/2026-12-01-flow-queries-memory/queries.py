"""The store's flow-run queries against a flows.db of many runs, under the store's 16 MB limit.

    python queries.py DB RUNS      # builds DB (RUNS runs, 12 journal records each, 1 in 1000 left open)
                                   # if missing, then times each query with DuckDB's default threads and one
"""
import os
import sys
import time

import duckdb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
from storage import schema  # noqa: E402

QUERIES = {
    "open_runs before (DISTINCT ... NOT IN)": ("SELECT DISTINCT run FROM flow_records WHERE type = 'run.started' AND run "
                                               "NOT IN (SELECT run FROM flow_records WHERE type = 'run.ended')", []),
    "open_runs after (one aggregate)": ("SELECT run FROM flow_records WHERE type IN ('run.started', 'run.ended') "
                                        "GROUP BY run HAVING count(*) FILTER (WHERE type = 'run.ended') = 0", []),
    "expired_runs before (every run)": ("SELECT run, any_value(writer), min(lsn), max(lsn) FROM flow_records WHERE run IN "
                                        "(SELECT run FROM flow_records WHERE type = 'run.ended' AND ts < ?) GROUP BY run",
                                        [1e12]),
    "expired_runs after (5000 a pass)": ("SELECT run, any_value(writer), min(lsn), max(lsn) FROM flow_records WHERE run IN "
                                         "(SELECT run FROM flow_records WHERE type = 'run.ended' AND ts < ? LIMIT ?) "
                                         "GROUP BY run", [1e12, 5000]),
}


def build(path: str, runs: int) -> None:
    con = duckdb.connect(path, config={"memory_limit": "16MB"})
    for stmt in schema.DATABASES["flows"]:
        con.execute(stmt)
    rows, lsn = [], 0
    for r in range(runs):
        run = f"sync_steps-{r:020x}"
        types = ["run.started"] + ["step.start", "step.result"] * 5 + ([] if r % 1000 == 0 else ["run.ended"])
        for seq, kind in enumerate(types):
            lsn += 300
            rows.append((run, "default", kind, seq, os.urandom(200), time.time(), 0, lsn))
        if len(rows) > 50000 or r == runs - 1:
            con.execute("BEGIN")
            appender = con.appender("flow_records")
            appender.append_rows(rows)
            appender.flush()
            con.execute("COMMIT")
            rows = []
    con.close()


def main() -> None:
    path, runs = sys.argv[1], int(sys.argv[2])
    if not os.path.exists(path):
        build(path, runs)
    for threads in (None, 1):
        config = {"memory_limit": "16MB", **({"threads": threads} if threads else {})}
        con = duckdb.connect(path, config=config)
        count = con.execute("SELECT count(*) FROM flow_records").fetchone()[0]
        print(f"{runs} runs, {count} journal records, threads={threads or 'default (' + str(os.cpu_count()) + ')'}")
        for name, (sql, args) in QUERIES.items():
            started = time.perf_counter()
            try:
                n = len(con.execute(sql, args).fetchall())
                print(f"  {name}: {n} rows in {time.perf_counter() - started:.3f} s")
            except duckdb.Error as exc:
                print(f"  {name}: {type(exc).__name__} after {time.perf_counter() - started:.3f} s")
        con.close()


main()
