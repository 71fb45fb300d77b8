"""The store's flow-run queries on a journal of many runs, under the store's own small DuckDB memory
limit: an actor that restarts asks for every open run before it serves flows again, so that query
must answer however many runs have ended since (a failure here left flows stalled for good)."""
import time

from storage import records, segments
from storage.records import RecordKind
from storage.store import Store
from storage.run_queries import EXPIRED_PER_ANSWER

RUNS = 20_000
OPEN_EVERY = 1_000
STEPS = ("step.start", "step.result") * 3


def flow_record(run, seq, kind, at):
    return records.frame(RecordKind.FLOW, f"{run}:{seq}".encode(), records.encode_body(
        {"run": run, "tenant": "t", "type": kind, "seq": seq, "at": at, "flow": "sync_steps"}))


def test_open_and_expired_runs_answer_after_many_runs_with_the_default_memory_limit(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=64 << 20)
    old = time.time() - 30 * 86400
    frames, still_open = [], set()
    for n in range(RUNS):
        run = f"sync_steps-{n:020x}"
        frames.append(flow_record(run, 0, "run.started", old))
        frames += [flow_record(run, 1 + i, kind, old) for i, kind in enumerate(STEPS)]
        if n % OPEN_EVERY:
            frames.append(flow_record(run, 1 + len(STEPS), "run.ended", old))
        else:
            still_open.add(run)
    log.write(frames, sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)   # the default: 16 MB per DuckDB file
    store.open()
    try:
        store.load_all()
        assert {row["run_id"] for row in store.query("open_runs", "")[0]} == still_open
        expired = {run for run, *_ in store.query("expired_runs", "", after=int(time.time()))[0][0]["runs"]}
        ended = {f"sync_steps-{n:020x}" for n in range(RUNS)} - still_open
        assert len(expired) == EXPIRED_PER_ANSWER and expired <= ended   # a bounded share per compaction pass
    finally:
        store.close()


def queued_record(run, kind, at, **body):
    return records.frame(RecordKind.FLOW, f"{run}:{kind}".encode(), records.encode_body(
        {"run": run, "tenant": "t", "type": kind, "seq": 0, "at": at, **body}))


def test_recent_admissions_name_each_runs_queue_and_key_ended_or_not(tmp_path):
    """What a restarted actor reads back of its queues' rate windows (actors/run_queues.py)."""
    now = time.time()
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=8 << 20)
    log.write([
        queued_record("old", "run.started", now - 120, flow="f", queue="mail"),
        queued_record("old", "run.admitted", now - 100),                       # before the window asked for
        queued_record("ended", "run.started", now - 20, flow="f", queue="mail"),
        queued_record("ended", "run.admitted", now - 15),
        queued_record("ended", "run.ended", now - 14, status="completed"),
        queued_record("keyed", "run.started", now - 10, flow="f", queue="per_user", queue_key="alice"),
        queued_record("keyed", "run.admitted", now - 5),
        queued_record("waits", "run.started", now - 3, flow="f", queue="mail"),   # not admitted yet
        queued_record("plain", "run.started", now - 2, flow="f"),
    ], sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    try:
        store.load_all()
        rows = store.query("recent_admissions", "", after=int(now - 60))[0]
        assert sorted(rows, key=lambda r: r["run_id"]) == [
            {"run_id": "ended", "tenant": "t", "at": now - 15, "queue": "mail", "queue_key": ""},
            {"run_id": "keyed", "tenant": "t", "at": now - 5, "queue": "per_user", "queue_key": "alice"}]
    finally:
        store.close()
