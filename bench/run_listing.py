"""What a page of `GET /v1/runs` costs as the flow journal grows.

Owns: a write-ahead log of flow runs built in a scratch directory (real FLOW records, as actors
write them: a start, a few steps, and for most runs an end; one in ten open, one in twenty with an
input and a result of 64 KiB), loaded by writer/store's own loader (`storage.store.Store`), and
then pages of the listing timed through `Store.query` — unfiltered, of one status, of one flow,
newest first, of the runs started in the last tenth of the journal's time — from random cursors,
beside the same page read as the listing was first written (but newest first and a window of
time, which it had no forms of): one GROUP BY of every run's start and end, whole bodies (kept
here as `first_form`), on the same file and cursor, with the store's retry at a raised memory
limit as `Store.query` has it.

Never does: start a server (it times the store's query, in this process).

Run ids as the server makes them (in the order runs began) and as Idempotency-Keys make them (in
no order), each in a journal of its own.

    python -m bench.run_listing [--runs 10000,100000] [--ids made,keyed] [--pages 20] [--name NAME]
"""
from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import msgpack

from actors.flow_runs import run_id_for_key
from agentos.config import StorageConfig
from bench.results import ResultsDir, markdown_table, pyplot
from storage import records, segments
from storage.records import RecordKind
from storage.store import Store
from storage.store_queries import StoreQueries

FLOWS = ("checkout", "refund", "onboard", "report")
FILTERS = {"all": {}, "status=open": {"status": "open"}, "status=failed": {"status": "failed"},
           "flow=refund": {"flow": "refund"}, "order=desc": {"desc": True},
           "started_after (the last tenth)": {"window": True}}   # no first form of desc nor of a window
BIG = "x" * (64 << 10)


def journal(directory: Path, runs: int, ids: str, seed: int = 7) -> None:
    """`ids`: "made" as the server makes them (actors/flow_client.py new_run_id: in the order runs
    began), or "keyed" (from an Idempotency-Key: in no order)."""
    rng = random.Random(seed)
    log = segments.SegmentLog(directory / "wal" / "0", segment_bytes=64 << 20)
    frames, at = [], 1.7e9
    for n in range(runs):
        flow, big = FLOWS[n % len(FLOWS)], n % 20 == 0
        at += 0.01
        run = (f"r{int(at * 1000):012x}{rng.getrandbits(80):020x}" if ids == "made"
               else run_id_for_key(flow, "t", f"order-{n}"))

        def add(kind: str, **body) -> None:
            frames.append(records.frame(RecordKind.FLOW, f"{run}:{len(frames)}".encode(), records.encode_body(
                {"run": run, "tenant": "t", "type": kind, "at": at, "exec": 1, **body})))
        add("run.started", flow=flow, input=BIG if big else {"order": n})
        for seq in range(3):
            add("step.started", seq=seq, name=f"s{seq}", attempt=1)
            add("step.done", seq=seq, name=f"s{seq}", ok=True, result=seq)
        if n % 10:
            add("run.ended", status="failed" if n % 7 == 0 else "completed", **({"result": BIG if big else n}
                                                                             if n % 7 else {"error": "boom"}))
        if len(frames) >= 20_000:
            log.write(frames, sync=False)
            frames = []
    log.write(frames, sync=True)
    log.close()


def first_form(store: Store, after: str, tenant: str, limit: int, flow: str | None, status: str | None):
    """The listing as first written (2026-12-06): every run's start and end grouped, whole bodies."""
    ended = "count(*) FILTER (WHERE type = 'run.ended')"
    having = "" if status is None else f" HAVING {ended} = 0" if status == "open" else f" HAVING {ended} > 0"
    picky = flow is not None or status not in (None, "open")
    rows = store.cursors["flows"].execute(
        "SELECT run, any_value(body) FILTER (WHERE type = 'run.started'), "
        "any_value(body) FILTER (WHERE type = 'run.ended') FROM flow_records "
        "WHERE tenant = ? AND run > ? AND type IN ('run.started', 'run.ended') AND NOT contains(run, '/') "
        f"GROUP BY run{having} ORDER BY run LIMIT ?", [tenant, after, 1000 if picky else limit + 1]).fetchall()
    out = []
    for run, started, end in rows:
        first, last = msgpack.unpackb(started), msgpack.unpackb(end) if end is not None else None
        row = {"run_id": run, "flow": first.get("flow"), "status": last.get("status") if last else "open"}
        if (flow is None or row["flow"] == flow) and (status is None or row["status"] == status):
            out.append(row)
            if len(out) > limit:
                return out[:limit]
    return out


def timed(call) -> tuple[float, int, bool]:
    """(ms, rows, whether DuckDB refused it at the store's memory limit first)."""
    began = time.perf_counter()
    try:
        rows = call(raised=False)
        refused = False
    except Exception as exc:   # duckdb's OutOfMemoryException: the store runs it again raised
        if "Out of Memory" not in str(exc):
            raise
        rows, refused = call(raised=True), True
    return (time.perf_counter() - began) * 1000, len(rows), refused


def measure(store: Store, ids: list[str], pages: int, rng: random.Random) -> list[dict]:
    rows = []
    # the window: runs started in the last tenth of the journal's time
    (tenth,) = store.cursors["flows"].execute(
        "SELECT quantile_disc(ts, 0.9) FROM flow_records WHERE type = 'run.started'").fetchone()
    for label, filters in FILTERS.items():
        since = tenth if filters.get("window") else None
        for form in ("now",) if filters.get("desc") or since else ("now", "first form"):
            times, refusals, counts = [], 0, []
            for _ in range(pages):
                after = rng.choice(ids)
                if form == "now":
                    def call(raised, after=after):
                        run = lambda: StoreQueries.q_runs(store, after, "t", 100, filters.get("flow"),  # noqa: E731
                                                          filters.get("status"), filters.get("desc", False),
                                                          since)[0]
                        return store.roomy(run) if raised else run()
                else:
                    def call(raised, after=after):
                        run = lambda: first_form(store, after, "t", 100, filters.get("flow"),  # noqa: E731
                                                 filters.get("status"))
                        return store.roomy(run) if raised else run()
                ms, n, refused = timed(call)
                times.append(ms)
                counts.append(n)
                refusals += refused
            rows.append({"query": label, "form": form, "pages": pages, "p50_ms": statistics.median(times),
                         "max_ms": max(times), "mean_rows": statistics.mean(counts), "refused_for_memory": refusals})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = list(FILTERS)
    for form in ("now", "first form"):
        for runs, ids in sorted({(r["runs"], r["ids"]) for r in rows}):
            point = {(r["query"]): r["p50_ms"] for r in rows if (r["runs"], r["ids"], r["form"]) == (runs, ids, form)}
            shown = [q for q in labels if q in point]
            ax.plot(shown, [point[q] for q in shown], marker="o" if form == "now" else "x",
                    linestyle="-" if form == "now" else "--", label=f"{form}, {runs:,} runs, {ids} ids")
    ax.set_ylabel("page p50 ms")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_listing", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="10000,100000", help="journal sizes, comma-separated")
    parser.add_argument("--pages", type=int, default=20, help="pages timed per query and form")
    parser.add_argument("--ids", default="made,keyed", help="run ids as the server makes them (in the order runs "
                                                            "began), from Idempotency-Keys (in no order), or both")
    parser.add_argument("--name", default="run-listing")
    args = parser.parse_args(argv)
    results = ResultsDir(args.name)
    config = {"command": "bench.run_listing", "args": vars(args)}
    results.write_config(config)
    rows = []
    for runs, ids in [(int(n), kind) for n in args.runs.split(",") for kind in args.ids.split(",")]:
        scratch = Path(tempfile.mkdtemp(prefix="run-listing-"))
        try:
            journal(scratch, runs, ids)
            store = Store(scratch, writers=1, memory_limit_mb=StorageConfig().duckdb_memory_limit_mb)
            store.open()
            try:
                began = time.perf_counter()
                store.load_all()
                loaded = time.perf_counter() - began
                run_ids = [run for (run,) in store.cursors["flows"].execute(
                    "SELECT DISTINCT run FROM flow_records WHERE type = 'run.started'").fetchall()]
                for row in measure(store, run_ids, args.pages, random.Random(runs)):
                    rows.append({"runs": runs, "ids": ids, "load_s": round(loaded, 2), **row})
                    print(rows[-1], flush=True)
            finally:
                store.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    results.write_rows(rows)
    plot(rows, results.figure_path("page_ms.png"))
    table = markdown_table(["runs", "ids", "query", "form", "page p50 ms", "max ms", "rows a page",
                            "refused for memory"],
                           [(r["runs"], r["ids"], r["query"], r["form"], r["p50_ms"], r["max_ms"], r["mean_rows"],
                             f"{r['refused_for_memory']} of {r['pages']}") for r in rows])
    results.write_summary(f"# A page of GET /v1/runs\n\nPages of 100 from random cursors, through the store's query "
                          f"thread's cursor at its own memory limit (a refusal for memory is run again raised, as "
                          f"`Store.query` does). `first form`: the listing as first written. Ids `made` as the "
                          f"server makes them (in the order runs began), `keyed` from Idempotency-Keys (in no "
                          f"order).\n\n{table}\n")
    print(f"results: {results.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
