"""The store's listing of a tenant's flow runs (GET /v1/runs): by id, a page at a time, of one
flow or one status, never another tenant's runs nor the agent turns' own, on a journal loaded
from a real log."""
import time

import pytest

from storage import records, run_queries, segments
from storage.records import RecordKind
from storage.store import Store


def flow_record(run, tenant, kind, at, **body):
    return records.frame(RecordKind.FLOW, f"{run}:{kind}".encode(), records.encode_body(
        {"run": run, "tenant": tenant, "type": kind, "seq": 0, "at": at, "exec": 1, **body}))


@pytest.fixture
def store(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=8 << 20)
    frames = []
    for n in range(30):   # r00..r29 of tenant t: three flows; every third open, the rest ended
        run, flow = f"r{n:02d}", ("a", "b", "c")[n % 3]
        frames.append(flow_record(run, "t", "run.started", 100.0 + n, flow=flow, input={"n": n}))
        frames.append(flow_record(run, "t", "step.done", 101.0 + n, ok=True, result=n))
        if n % 3:
            frames.append(flow_record(run, "t", "run.ended", 200.0 + n,
                                      status="completed" if n % 2 else "failed", result=n))
    frames.append(flow_record("r05.0", "t", "run.started", 150.0, flow="a", input=None, parent="r05", parent_seq=0))
    big = "x" * 300_000   # a listing reads only the head of a body: the flow, the parent, the state
    frames.append(flow_record("r07.1", "t", "run.started", 155.0, flow="d", parent="r07", parent_seq=1, input=big))
    frames.append(flow_record("r07.1", "t", "run.ended", 255.0, status="completed", result=big))
    frames.append(flow_record("s1/turn-1", "t", "run.started", 160.0, flow="turn", input={}))   # an agent turn
    frames.append(flow_record("r99", "other", "run.started", 170.0, flow="a", input=None))     # another tenant
    log.write(frames, sync=True)
    log.close()
    s = Store(tmp_path, writers=1, memory_limit_mb=64)
    s.open()
    s.load_all()
    yield s
    s.close()


def listing(store, desc=False, **filters):
    """Every page of the listing, followed to its end: (runs, pages)."""
    runs, pages, after = [], 0, ""
    while True:
        rows, after = store.query("runs", after, tenant="t", limit=4, desc=desc, **filters)
        runs += rows
        pages += 1
        if after is None:
            return runs, pages


def test_runs_are_listed_by_id_with_their_flow_status_and_times_a_page_at_a_time(store):
    runs, pages = listing(store)
    assert [r["run_id"] for r in runs] == sorted([f"r{n:02d}" for n in range(30)] + ["r05.0", "r07.1"])
    assert pages == 8     # 32 runs, 4 a page
    by_id = {r["run_id"]: r for r in runs}
    assert by_id["r00"] == {"run_id": "r00", "flow": "a", "status": "running", "started_at": 100.0,
                            "ended_at": None}
    assert by_id["r01"] == {"run_id": "r01", "flow": "b", "status": "completed", "started_at": 101.0,
                            "ended_at": 201.0}
    assert by_id["r02"]["status"] == "failed" and by_id["r05.0"]["parent"] == "r05"
    assert by_id["r07.1"] == {"run_id": "r07.1", "flow": "d", "status": "completed", "started_at": 155.0,
                              "ended_at": 255.0, "parent": "r07"}



def test_a_listing_of_one_flow_or_one_status_reads_a_bounded_share_a_page(store, monkeypatch):
    monkeypatch.setattr(run_queries, "RUNS_SCAN", 5)   # a page reads at most five runs
    failed, pages = listing(store, status="failed")
    assert [r["run_id"] for r in failed] == [f"r{n:02d}" for n in range(30) if n % 3 and n % 2 == 0]
    assert pages == 7     # 32 runs, five read a page: pages of fewer than four, and the listing went on
    of_c, _ = listing(store, flow="c")
    assert [r["run_id"] for r in of_c] == [f"r{n:02d}" for n in range(2, 30, 3)]
    open_a, _ = listing(store, flow="a", status="open")
    assert [r["run_id"] for r in open_a] == sorted([f"r{n:02d}" for n in range(0, 30, 3)] + ["r05.0"])
    assert listing(store, status="open")[0] == [r for r in listing(store)[0] if r["ended_at"] is None] == \
        listing(store, status="running")[0]
    with pytest.raises(ValueError):
        store.query("runs", "", tenant="t", status="pending")
    assert store.query("runs", "", tenant="nobody")[0] == []


def test_runs_are_listed_from_the_last_down_with_the_same_states_and_filters(store, monkeypatch):
    ascending = listing(store)[0]
    runs, pages = listing(store, desc=True)
    assert runs == ascending[::-1] and pages == 8
    # each page's ends are those of its own runs, when the cursor runs down through ended runs
    assert [(r["run_id"], r["status"]) for r in store.query("runs", "r06", tenant="t", limit=3, desc=True)[0]] == \
        [("r05.0", "running"), ("r05", "completed"), ("r04", "failed")]
    monkeypatch.setattr(run_queries, "RUNS_SCAN", 5)
    assert listing(store, desc=True, status="failed")[0] == listing(store, status="failed")[0][::-1]
    assert listing(store, desc=True, flow="a", status="open")[0] == listing(store, flow="a", status="open")[0][::-1]
    assert store.query("runs", "r00", tenant="t", desc=True) == ([], None)
    with pytest.raises(ValueError):
        store.query("runs", "", tenant="t", before=3)


def test_runs_started_in_a_window_of_time_are_listed_in_either_order(store):
    # r00..r29 started at 100..129, r05.0 at 150, r07.1 at 155
    assert [r["run_id"] for r in listing(store, since=110.0, until=113.0)[0]] == ["r10", "r11", "r12"]
    assert [r["run_id"] for r in listing(store, desc=True, since=126.0)[0]] == [
        "r29", "r28", "r27", "r26", "r07.1", "r05.0"]
    assert [r["run_id"] for r in listing(store, since=120.0, status="failed")[0]] == ["r20", "r22", "r26", "r28"]
    assert listing(store, until=100.0)[0] == []


def test_a_fork_a_queued_run_and_a_schedules_run_are_listed_as_such_and_by_queue(tmp_path):
    later = time.time() + 3600
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=8 << 20)
    log.write([flow_record("f1", "t", "run.started", 151.0, flow="a", input="x" * 300_000, forked_from="r05",
                           fork_seq=1, queue="reports", queue_key="alice", schedule="", priority=3),
               flow_record("s1", "t", "run.started", 152.0, flow="b", input=None, schedule="daily",
                           scheduled_at=152.0, queue=7),   # (not a name: passed over)
               flow_record("s1", "t", "run.ended", 153.0, status="completed", result=1),
               # a queued run that got its place, a delayed start to come and one whose time came
               flow_record("q1", "t", "run.started", 154.0, flow="a", input=None, queue="reports"),
               flow_record("q1", "t", "run.admitted", 154.5),
               flow_record("w1", "t", "run.started", 155.0, flow="a", input=None, start_at=later, queue="reports"),
               flow_record("w2", "t", "run.started", 156.0, flow="a", input=None, start_at=157.0),
               flow_record("w3", "t", "run.started", 157.0, flow="a", input=None, start_at=float("inf"))],
              sync=True)
    log.close()
    s = Store(tmp_path, writers=1, memory_limit_mb=64)
    s.open()
    try:
        s.load_all()
        assert [r["run_id"] for r in s.query("runs", "", tenant="t", limit=10, match={"queue": "reports"})[0]] == ["f1", "q1", "w1"]
        assert s.query("runs", "", tenant="t", limit=10)[0] == [
            {"run_id": "f1", "flow": "a", "status": "enqueued", "started_at": 151.0, "ended_at": None,
             "forked_from": "r05", "queue": "reports", "queue_key": "alice", "priority": 3},
            {"run_id": "q1", "flow": "a", "status": "running", "started_at": 154.0, "ended_at": None,
             "queue": "reports"},
            {"run_id": "s1", "flow": "b", "status": "completed", "started_at": 152.0, "ended_at": 153.0,
             "schedule": "daily"},
            {"run_id": "w1", "flow": "a", "status": "scheduled", "started_at": 155.0, "ended_at": None,
             "start_at": later, "queue": "reports"},
            {"run_id": "w2", "flow": "a", "status": "running", "started_at": 156.0, "ended_at": None,
             "start_at": 157.0},
            {"run_id": "w3", "flow": "a", "status": "running", "started_at": 157.0, "ended_at": None}]  # (junk)
        def ids(**filters):
            return [r["run_id"] for r in s.query("runs", "", tenant="t", limit=10, **filters)[0]]
        assert ids(match={"queue_key": "alice"}) == ["f1"] and ids(match={"schedule": "daily"}) == ["s1"]
        assert ids(match={"queue": "reports", "queue_key": "alice"}) == ["f1"]
        assert ids(match={"queue": "reports", "queue_key": "bob"}) == [] == ids(match={"schedule": "weekly"})
        with pytest.raises(ValueError):
            ids(match={"flow": "a"})   # (a filter of its own)
        states = {state: [r["run_id"] for r in s.query("runs", "", tenant="t", limit=10, status=state)[0]]
                  for state in ("enqueued", "scheduled", "running", "open", "completed")}
        assert states == {"enqueued": ["f1"], "scheduled": ["w1"], "running": ["q1", "w2", "w3"],
                          "open": ["f1", "q1", "w1", "w2", "w3"], "completed": ["s1"]}
    finally:
        s.close()


def test_runs_loaded_before_the_listing_columns_are_listed_from_their_bodies(store, tmp_path):
    """Rows a store loaded before `name` and `parent` existed have NULLs there (the columns are
    added to an older file as it opens): their flow, parent and state come from their bodies."""
    full = listing(store)[0]
    store.conns["flows"].execute("UPDATE flow_records SET name = NULL, parent = NULL")
    assert store.cursors["flows"].execute("SELECT count(*) FROM flow_records WHERE name IS NOT NULL").fetchone() == (0,)
    assert listing(store)[0] == full
    assert [r["run_id"] for r in listing(store, flow="d")[0]] == ["r07.1"]

    import duckdb
    older = tmp_path / "older" / "db"
    older.mkdir(parents=True)
    con = duckdb.connect(str(older / "flows.db"))
    con.execute("CREATE TABLE flow_records (run VARCHAR, tenant VARCHAR, type VARCHAR, seq INTEGER, body BLOB, "
                "ts DOUBLE, writer SMALLINT, lsn BIGINT)")
    con.close()
    reopened = Store(tmp_path / "older", writers=1, memory_limit_mb=64)
    reopened.open()
    try:
        columns = [c for (c,) in reopened.conns["flows"].execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'flow_records'").fetchall()]
        assert columns[-3:] == ["name", "parent", "extra"]
    finally:
        reopened.close()


def test_every_page_size_order_and_filter_lists_what_a_model_of_the_journal_says(tmp_path, monkeypatch):
    """Random journals: runs of two tenants and agent turns, ids in no order, some open, and the
    listing followed page by page in both orders against a model of what it should list."""
    import random
    rng = random.Random(11)
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=8 << 20)
    frames, model = [], {}
    for n in range(120):
        tenant = "t" if n % 5 else "u"
        run = f"{rng.choice('abcdefgh')}{rng.getrandbits(24):06x}"
        if rng.random() < 0.1:
            run = f"s{n}/turn"          # an agent turn's run: never listed
        flow = rng.choice(("a", "b", "c"))
        frames.append(flow_record(run, tenant, "run.started", 100.0 + n, flow=flow, input=n))
        status = rng.choice(("open", "completed", "failed", "cancelled"))
        if status != "open":
            frames.append(flow_record(run, tenant, "run.ended", 300.0 + n, status=status))
        if tenant == "t" and "/" not in run:
            model[run] = (flow, status)
    log.write(frames, sync=True)
    log.close()
    s = Store(tmp_path, writers=1, memory_limit_mb=64)
    s.open()
    try:
        s.load_all()
        for scan in (3, 1000):
            monkeypatch.setattr(run_queries, "RUNS_SCAN", scan)
            for limit in (2, 7, 50):
                for flow, status in ((None, None), ("a", None), (None, "open"), ("b", "failed")):
                    want = [run for run in sorted(model) if flow in (None, model[run][0])
                            and status in (None, model[run][1])]
                    for desc in (False, True):
                        got, cursor = [], ""
                        for _ in range(500):
                            rows, cursor = s.query("runs", cursor, tenant="t", limit=limit, flow=flow,
                                                   status=status, desc=desc)
                            assert len(rows) <= limit
                            got += [(r["run_id"], r["flow"], "open" if r["status"] == "running" else r["status"])
                                    for r in rows]
                            if cursor is None:
                                break
                        expected = [(run, *model[run]) for run in (want[::-1] if desc else want)]
                        assert got == expected, (scan, limit, flow, status, desc)
    finally:
        s.close()
