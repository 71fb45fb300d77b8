"""What a session's reads cost as messages.db grows: with the session summary, and as before it.

Owns: a write-ahead log of agent sessions built in a scratch directory (real records, as session
actors write them), loaded by writer/store's own loader (`storage.store.Store`) twice — with the
session summary (storage/session_summary.py), and with no sums taken at all — and then, on the
first of those files, each read the HTTP API makes, timed through `Store.query` beside the same
read as it was before the summary, on the same file and cursor: the listing's old aggregate
(kept here), the other reads with no bounds on `ts`:
- `sessions`: a page of 100 of `GET /v1/sessions` (from a random session id on);
- `recent`: a page of 100 of `GET /v1/sessions?order=recent` (the most recently active first, from
  a random session's place on), `before` being the listing's old aggregate by last activity;
- `messages`: a page of `GET /v1/sessions/{sid}/messages` of a random session;
- `checkpoint_chain`: what a session actor reads to load a session (after TTL eviction or a restart);
- `events`: a page of `GET /v1/sessions/{sid}/events` (events.db, which has its own summary);
- `long_chain`: the checkpoint chain of one of `LONG` sessions that take a step in every wave,
  from the log's start to its end (a session that lives for days), a full snapshot every
  `SNAPSHOT_EVERY` steps as `storage.snapshot_every` has it; `before` being the same read bounded
  by the session's whole life, as it was before `chain_from` (storage/session_summary.py);
- `close`: what writer/store does when it loads the CLOSE record of `DELETE /v1/sessions/{sid}`
  (`apply_pending_closes`: the session's rows deleted from both files), `before` being the same
  statements with no bounds on `ts` (the memory retry and the progress check of today in both);
  "non-empty" counts the closes that succeeded, since one DuckDB refuses is retried after the
  loader's next batch.
The log is written in waves: `--concurrent` sessions live at a time, each taking `--turns` turns of
two messages and an event in round robin, then the next wave starts, as a server's sessions come
and go.
Never does: start a server (it times the store's loader and queries, in this process).

    python -m bench.session_reads [--sessions 2000,20000] [--turns 50] [--concurrent 1000] [--name NAME]
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator
from unittest import mock

from bench.results import ResultsDir, markdown_table, pyplot
from storage import records, segments, session_closing, session_summary
from storage.records import RecordKind
from storage.store import Store

READS = 60                 # of each kind, per scale and path
MEMORY_LIMIT_MB = 64       # writer/store's default (storage.duckdb_memory_limit_mb)
PAGE = 100
KINDS = ("sessions", "recent", "messages", "checkpoint_chain", "events", "long_chain", "close")
LONG = 20                  # sessions that live through the whole log
SNAPSHOT_EVERY = 16        # storage.snapshot_every's default

# Listing sessions as it was before the summary (29d9f58), for the baseline: an aggregate of every
# row of the tenant. The transcript and chain reads before it are today's without `_lifetime` (`unbounded`).
LIST_BEFORE = ("SELECT session, sum(n), min(first), max(last) FROM ("
               "SELECT session, count(*) AS n, min(ts) AS first, max(ts) AS last FROM messages WHERE session > ? "
               "AND tenant = ? GROUP BY session UNION ALL "
               "SELECT session, 0, min(ts), max(ts) FROM checkpoints WHERE session > ? AND tenant = ? GROUP BY session"
               ") GROUP BY session ORDER BY session LIMIT ?")
RECENT_BEFORE = ("SELECT session, sum(n), min(first), max(last) FROM ("
                 "SELECT session, count(*) AS n, min(ts) AS first, max(ts) AS last FROM messages WHERE tenant = ? "
                 "GROUP BY session UNION ALL "
                 "SELECT session, 0, min(ts), max(ts) FROM checkpoints WHERE tenant = ? GROUP BY session"
                 ") GROUP BY session HAVING max(last) < ? ORDER BY max(last) DESC, session DESC LIMIT ?")


@contextlib.contextmanager
def unbounded(self, session: str, tenant: str | None, db: str = "messages",
              chain: bool = False) -> Iterator[tuple[float, float]]:
    """`Store._lifetime` as reads were before the summary: no transaction, no lookup, no bounds."""
    yield -math.inf, math.inf


@contextlib.contextmanager
def unbounded_close() -> Iterator[None]:
    """Closes as their statements were before the summary: with no bounds on `ts`."""
    with mock.patch.object(session_closing, "_span", lambda con, session: (-math.inf, math.inf)):
        yield


def close(store: Store, session: str, n: int) -> bool:
    """The CLOSE record's work, as the loader does it after a batch; whether it succeeded."""
    ends = dict(store.progress["messages"])   # every record loaded so far is before the close
    with store.loading:
        store.pending_closes = [(session, ends, 0, 10**12 + n)]
        store.apply_pending_closes()
        failed = bool(store.pending_closes)
        store.pending_closes = []
    return not failed


@contextlib.contextmanager
def lifetime_chain() -> Iterator[None]:
    """Chain reads as they were before `chain_from`: bounded by the session's whole life."""
    whole_life = session_summary.span
    with mock.patch.object(session_summary, "span", lambda cursor, session, tenant, chain=False:
                           whole_life(cursor, session, tenant)):
        yield


def long_id(n: int) -> str:
    return "long-" + hashlib.blake2b(n.to_bytes(8, "little"), digest_size=8).hexdigest()


def long_steps(wave: int, clock: float) -> list[bytes]:
    """Each long-lived session's step of this wave: a full snapshot every SNAPSHOT_EVERY, else a delta."""
    frames = []
    for n in range(LONG):
        full = wave % SNAPSHOT_EVERY == 0
        messages = [{"role": "user", "content": f"long question {t}"} for t in range(2 * wave + 2)]
        frames.append(records.frame(RecordKind.CHECKPOINT, b"", records.encode_body({
            "session": long_id(n), "tenant": "t", "turn": f"wave-{wave}", "seq": wave + 1, "full": full,
            "first": 0 if full else 2 * wave, "messages": messages if full else messages[-2:], "at": clock})))
    return frames


def session_id(n: int) -> str:
    """Ids in no order of their start, like uuid4s or names a client picks: ids that rise with time
    would let DuckDB skip row groups by the session column's own min/max."""
    return "sess-" + hashlib.blake2b(n.to_bytes(8, "little"), digest_size=8).hexdigest()


def build(wal: Path, sessions: int, turns: int, concurrent: int) -> int:
    """The log; returns how many records it holds."""
    log = segments.SegmentLog(wal, segment_bytes=64 << 20, preallocate=False, spares=0)
    clock, count = 1_000_000.0, 0
    for wave in range(0, sessions, concurrent):
        members = range(wave, min(sessions, wave + concurrent))
        long = long_steps(wave // concurrent, clock)
        log.write(long, sync=False)
        count += len(long)
        for turn in range(turns):
            frames = []
            for n in members:
                clock += 0.001
                first = 2 * turn
                messages = [{"role": "user", "content": f"question {turn} of {n}"},
                            {"role": "assistant", "content": f"an answer of about this length to question {turn}"}]
                frames.append(records.frame(RecordKind.CHECKPOINT, b"", records.encode_body({
                    "session": session_id(n), "tenant": "t", "turn": f"turn-{turn}", "seq": turn + 1,
                    "full": turn == 0, "first": first, "messages": messages, "at": clock})))
                frames.append(records.frame(RecordKind.EVENT, b"", records.encode_body({
                    "session": session_id(n), "tenant": "t", "turn": f"turn-{turn}", "seq": 1,
                    "type": "turn.completed", "data": {"completion_tokens": 8}, "at": clock})))
            log.write(frames, sync=False)
            count += len(frames)
    log.close()
    return count


def load(data: Path, summary: bool) -> tuple[Store, float]:
    store = Store(data, writers=1, memory_limit_mb=MEMORY_LIMIT_MB)
    started = time.perf_counter()
    store.open()
    if summary:
        store.load_all()
        store.merge_summaries(force=True)   # what a second more of loading would do
    else:
        with mock.patch.object(session_summary.Pending, "stage", lambda self, rows: None):
            store.load_all()
    return store, time.perf_counter() - started


def check_long_chains(store: Store) -> None:
    """Each long-lived session's chain, read from its newest snapshot's time, is the one read over
    its whole life (a bound that left a delta out would fail the run, not just time it)."""
    for n in range(LONG):
        bounded = store.query("checkpoint_chain", long_id(n), "t")[0]
        with lifetime_chain():
            whole = store.query("checkpoint_chain", long_id(n), "t")[0]
        if bounded != whole or not bounded or not bounded[0]["full"]:
            raise RuntimeError(f"the chain of {long_id(n)} read from its newest snapshot differs from its whole life's")


def reads(store: Store, sessions: int, rng: random.Random) -> list[dict]:
    check_long_chains(store)
    cursor = store.cursors["messages"]
    picks = [session_id(rng.randrange(sessions)) for _ in range(READS)]
    others = [session_id(n) for n in rng.sample(range(sessions), 2 * READS)]   # closed, so none read twice
    closing = {"summary": others[:READS], "before": others[READS:]}
    last_at = dict(cursor.execute("SELECT session, last_at FROM session_summary").fetchall())
    rows = []
    for kind in KINDS:
        times: dict[str, list[float]] = {"summary": [], "before": []}
        answered = {"summary": 0, "before": 0}
        for i, sid in enumerate(picks):
            # the two paths in turns, each first every other time: the machine's drift hits both alike
            for path in (("summary", "before") if i % 2 else ("before", "summary")):
                if kind == "sessions" and path == "before":
                    call = lambda: cursor.execute(LIST_BEFORE, [sid, "t", sid, "t", PAGE + 1]).fetchall()   # noqa: E731
                elif kind == "recent" and path == "before":
                    call = lambda: cursor.execute(RECENT_BEFORE, ["t", "t", last_at[sid], PAGE + 1]).fetchall()  # noqa: E731
                elif kind == "recent":
                    call = lambda: store.query("sessions", sid, "t", limit=PAGE, desc=True, at=last_at[sid])[0]  # noqa: E731
                elif kind == "long_chain":
                    sid = long_id(i % LONG)
                    call = lambda: store.query("checkpoint_chain", sid, "t")[0]   # noqa: E731
                elif kind == "close":   # each path closes sessions of its own
                    sid = closing[path].pop()
                    call = lambda: close(store, sid, len(closing[path]))   # noqa: E731
                else:
                    call = lambda: store.query(kind, sid, "t", limit=PAGE)[0]   # noqa: E731
                if path == "summary":
                    patched = contextlib.nullcontext()
                else:
                    patched = {"close": unbounded_close, "long_chain": lifetime_chain}.get(
                        kind, lambda: mock.patch.object(Store, "_lifetime", unbounded))()
                with patched:
                    started = time.perf_counter()
                    answered[path] += bool(call())
                    times[path].append((time.perf_counter() - started) * 1000)
        for path in ("summary", "before"):
            rows.append({"read": kind, "path": path, "p50_ms": round(statistics.median(times[path]), 2),
                         "p99_ms": round(sorted(times[path])[int(len(times[path]) * 0.99) - 1], 2),
                         "reads": len(times[path]), "answered": answered[path]})
    return rows


def summary_text(rows: list[dict], loads: list[dict], config: dict) -> str:
    reads_table = markdown_table(
        ["sessions", "message rows", "read", "path", "p50 ms", "p99 ms", "reads", "non-empty"],
        [(r["sessions"], r["message_rows"], r["read"], r["path"], r["p50_ms"], r["p99_ms"], r["reads"], r["answered"])
         for r in rows])
    loads_table = markdown_table(
        ["sessions", "records", "with the summary s", "without s", "ratio"],
        [(r["sessions"], r["records"], r["with_secs"], r["without_secs"], r["ratio"]) for r in loads])
    return (f"# A session's reads as messages.db grows\n\n"
            f"Agent sessions of {config['turns']} turns of two messages and an event, {config['concurrent']} alive at a time, "
            f"in one log, loaded by writer/store's loader at its default memory limit "
            f"({MEMORY_LIMIT_MB} MB, one DuckDB thread). `summary`: the reads through `Store.query` "
            f"(storage/session_summary.py); `before`: as they were before it, on the same file and cursor (the "
            f"listing's aggregate of every row of the tenant; the others with no bounds on `ts`). "
            f"{READS} reads of each, of random sessions (a `sessions` read is a page of {PAGE} from a random "
            f"id on, a `recent` read a page of {PAGE} most recently active first from a random session's "
            f"place on).\n\n{reads_table}\n\nThe loader, with the summary (each batch's sums kept, merged once a second "
            f"and once at the end) and without "
            f"(the whole log from an empty file, open included):\n\n{loads_table}\n")


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(KINDS), figsize=(4 * len(KINDS), 4))
    for ax, kind in zip(axes, KINDS):
        for way in ("before", "summary"):
            mine = [r for r in rows if r["read"] == kind and r["path"] == way]
            ax.plot([r["message_rows"] for r in mine], [r["p50_ms"] for r in mine], marker="o", label=way)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.tick_params(which="minor", labelbottom=False, labelleft=False)   # they overlap
        ax.set_xlabel("message rows in messages.db")
        ax.set_ylabel("p50 (ms)")
        ax.set_title(kind)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.session_reads", description=__doc__.split("\n")[0])
    p.add_argument("--sessions", default="2000,20000", help="session counts, comma-separated")
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--concurrent", type=int, default=1000, help="sessions alive at a time")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--name", default="session-reads", help="results folder name")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.sessions.split(",")]
    config = {"sessions": counts, "turns": args.turns, "concurrent": args.concurrent, "reads": READS,
              "memory_limit_mb": MEMORY_LIMIT_MB,
              "command": " ".join(["python -m bench.session_reads", *(argv if argv is not None else sys.argv[1:])])}
    results = ResultsDir(args.name)
    results.write_config(config)
    scratch = Path(tempfile.mkdtemp(prefix="bench-session-reads-", dir=args.dir))
    rows, loads = [], []
    try:
        for count in counts:
            wal = scratch / "log"
            written = build(wal / "0", count, args.turns, args.concurrent)
            timings = {}
            for summary in (False, True):
                data = scratch / ("with" if summary else "without")
                shutil.copytree(wal, data / "wal")
                store, timings[summary] = load(data, summary)
                if store.stats["records"] != written:   # a reader that skips records (it did once)
                    raise RuntimeError(f"the loader read {store.stats['records']:,} of the {written:,} records written")
                if summary:
                    (message_rows,) = store.cursors["messages"].execute("SELECT count(*) FROM messages").fetchone()
                    for row in reads(store, count, random.Random(count)):
                        row.update(sessions=count, message_rows=message_rows)
                        print(row, flush=True)
                        rows.append(row)
                store.close()
                shutil.rmtree(data)
            shutil.rmtree(wal)
            loads.append({"sessions": count, "records": written, "with_secs": round(timings[True], 1),
                          "without_secs": round(timings[False], 1),
                          "ratio": round(timings[True] / timings[False], 2)})
            print(loads[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results.write_rows(rows)
    results.write_rows(loads, "loads.jsonl")
    results.write_summary(summary_text(rows, loads, config))
    plot(rows, results.figure_path("reads_p50.png"))
    print(f"results: {results.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
