"""The session summary (storage/session_summary.py): what `GET /v1/sessions` lists, and the bounds
on a session's transcript, checkpoint and event reads. It stays exact across batches, restarts, closes
and a file made before it; the reads it bounds still return every row."""
import duckdb

from storage import records, session_summary
from storage.records import RecordKind
from test_session_close import agent, blob, close, event, hello, logs, opened, write


def listed(store, tenant=None):
    rows, _ = store.query("sessions", "", tenant, limit=1000)
    return {r["session_id"]: (r["messages"], r["first_at"], r["last_at"]) for r in rows}


def one(store, session, tenant=None):
    """GET /v1/sessions/{sid}'s read: the listing's entry for that session alone."""
    rows, _ = store.query("session", session, tenant)
    return (rows[0]["messages"], rows[0]["first_at"], rows[0]["last_at"]) if rows else None


def by_scan(store):
    """What the summary must say, aggregated from every row."""
    rows = store.conns["messages"].execute(
        "SELECT session, sum(n), min(f), max(l) FROM (SELECT session, count(*) n, min(ts) f, max(ts) l FROM messages "
        "WHERE session <> '' GROUP BY session UNION ALL SELECT session, 0, min(ts), max(ts) FROM checkpoints "
        "WHERE session <> '' GROUP BY session) GROUP BY session").fetchall()
    return {s: (int(n), f, last) for s, n, f, last in rows}


def grow(log, session, turns, start_at, first_seq=1):
    """`turns` full snapshots of a growing agent transcript, one second apart."""
    for t in range(turns):
        seq = first_seq + t
        write(log, [(RecordKind.CHECKPOINT, records.encode_body({
            "session": session, "tenant": "t", "turn": f"turn{seq}", "seq": seq, "full": True, "first": 0,
            "new_from": 2 * (seq - 1), "messages": hello(2 * seq), "at": start_at + t}))])


def test_the_summary_counts_every_batch_once_across_restarts_and_lists_a_tenants_sessions(tmp_path):
    actors, gateway = logs(tmp_path)
    grow(actors, "a", 3, 100.0)
    write(gateway, [(RecordKind.BLOB, blob("ext", 1, at=50.0))])
    store = opened(tmp_path)
    assert listed(store) == {"a": (6, 100.0, 102.0), "ext": (0, 50.0, 50.0)} == by_scan(store)
    grow(actors, "a", 2, 200.0, first_seq=4)     # a later batch adds to the same row
    write(gateway, [(RecordKind.BLOB, blob("ext", 2, at=60.0))])
    write(actors, [(RecordKind.CHECKPOINT, records.encode_body({
        "session": "other", "tenant": "u", "turn": "x", "seq": 1, "full": True, "first": 0,
        "messages": hello(1), "at": 70.0}))])
    store.load_all()
    expected = {"a": (10, 100.0, 201.0), "ext": (0, 50.0, 60.0), "other": (1, 70.0, 70.0)}
    assert listed(store) == expected == by_scan(store)
    assert set(listed(store, "t")) == {"a", "ext"} and set(listed(store, "u")) == {"other"}
    store.close()
    again = opened(tmp_path)   # nothing merged twice
    assert listed(again) == expected
    assert [m["index"] for m in again.query("messages", "a", "t")[0]] == list(range(10))
    assert again.query("messages", "a", "u")[0] == []   # another tenant's session reads as empty
    again.close()
    for log in (actors, gateway):
        log.close()


def recent(store, tenant, limit):
    """Every page of the sessions the most recently active first: [(session, last_at)], pages."""
    out, pages, cursor = [], 0, ("", None)
    while True:
        rows, nxt = store.query("sessions", cursor[0], tenant, limit=limit, desc=True, at=cursor[1])
        out += [(r["session_id"], r["last_at"]) for r in rows]
        pages += 1
        if nxt is None:
            return out, pages
        assert nxt == rows[-1]["session_id"]
        cursor = (nxt, rows[-1]["last_at"])


def test_sessions_list_the_most_recently_active_first_with_sums_not_yet_merged(tmp_path, monkeypatch):
    monkeypatch.setattr(session_summary, "MERGE_EVERY_SECS", 3600.0)   # merged only when the test says
    actors, gateway = logs(tmp_path)
    for n in range(7):      # s0..s6, the later the more recent; s2 and s3 at the same time
        grow(actors, f"s{n}", 1, 100.0 + n - (n == 3))
    write(gateway, [(RecordKind.BLOB, blob("ext", 1, at=104.5))])
    write(actors, [(RecordKind.CHECKPOINT, records.encode_body({
        "session": "theirs", "tenant": "u", "turn": "x", "seq": 1, "full": True, "first": 0,
        "messages": hello(1), "at": 999.0}))])
    store = opened(tmp_path)
    store.merge_summaries(force=True)
    want = [("s6", 106.0), ("s5", 105.0), ("ext", 104.5), ("s4", 104.0), ("s3", 102.0), ("s2", 102.0),
            ("s1", 101.0), ("s0", 100.0)]
    for limit in (1, 3, 8, 100):
        assert recent(store, "t", limit)[0] == want
    assert recent(store, "t", 3)[1] == 3 and recent(store, "u", 3)[0] == [("theirs", 999.0)]

    grow(actors, "s1", 1, 200.0, first_seq=2)    # s1 active again: first, from sums not merged yet
    store.load_all()
    assert store.summary_pending["messages"].kept
    moved = [("s1", 200.0)] + [row for row in want if row[0] != "s1"]
    for limit in (1, 2, 100):
        assert recent(store, "t", limit)[0] == moved
    assert one(store, "s1", "t") == listed(store, "t")["s1"] == (4, 101.0, 200.0)   # the table's row + sums not merged
    assert one(store, "s1", "u") is None and one(store, "theirs", "u") == (1, 999.0, 999.0)
    # a page read before it moved: the next ones list it no more below the cursor
    assert store.query("sessions", "s4", "t", limit=10, desc=True, at=104.0)[0][-2:] == [
        {"session_id": "s2", "messages": 2, "first_at": 102.0, "last_at": 102.0},
        {"session_id": "s0", "messages": 2, "first_at": 100.0, "last_at": 100.0}]
    store.merge_summaries(force=True)
    assert recent(store, "t", 2)[0] == moved
    assert listed(store, "t")["s1"] == (4, 101.0, 200.0) == one(store, "s1", "t")
    store.close()
    for log in (actors, gateway):
        log.close()


def test_a_close_leaves_only_what_the_id_holds_after_it(tmp_path):
    actors, gateway = logs(tmp_path)
    grow(actors, "gone", 2, 10.0)
    grow(actors, "reused", 2, 10.0)
    write(actors, [(RecordKind.EVENT, event("reused", 0, at=10.5))])
    write(gateway, [(RecordKind.CLOSE, close("gone", [[0, actors.end], [1, gateway.end]])),
                    (RecordKind.CLOSE, close("reused", [[0, actors.end], [1, gateway.end]]))])
    write(actors, [(RecordKind.CHECKPOINT, agent("reused", 1, hello(1), at=30.0)),   # the id used again
                   (RecordKind.EVENT, event("reused", 1, at=31.0))])
    store = opened(tmp_path)
    assert listed(store) == {"reused": (1, 30.0, 30.0)} == by_scan(store)
    assert one(store, "reused") == (1, 30.0, 30.0) and one(store, "gone") is None
    assert [m["content"] for m in store.query("messages", "reused")[0]] == ["hello 0"]
    assert [e["seq"] for e in store.query("events", "reused")[0]] == [1]
    store.merge_summaries(force=True)
    assert store.conns["events"].execute(f"SELECT session, counted, first_at, last_at FROM {session_summary.TABLE}"
                                         ).fetchall() == [("reused", 1, 31.0, 31.0)]
    store.close()
    for log in (actors, gateway):
        log.close()


def test_a_file_made_before_the_summary_gets_one_when_it_opens(tmp_path):
    actors, gateway = logs(tmp_path)
    grow(actors, "a", 3, 100.0)
    write(actors, [(RecordKind.EVENT, event("a", i, at=100.0 + i)) for i in range(3)])
    write(gateway, [(RecordKind.BLOB, blob("ext", 1, at=50.0))])
    store = opened(tmp_path)
    expected = listed(store)
    store.close()
    for db in ("messages", "events"):
        with duckdb.connect(str(tmp_path / "db" / f"{db}.db")) as con:
            con.execute(f"DROP TABLE {session_summary.TABLE}")
    again = opened(tmp_path)
    assert listed(again) == expected == by_scan(again)
    assert len(again.query("checkpoint_chain", "a")[0]) == 1 and again.query("blob_latest", "ext")[0]
    assert [e["seq"] for e in again.query("events", "a")[0]] == [0, 1, 2]
    again.close()
    for log in (actors, gateway):
        log.close()


def test_reads_bounded_by_a_sessions_life_return_all_its_rows_among_many_row_groups(tmp_path):
    """300,000 rows of other sessions before, between and after the session's: its transcript, its
    chain, its latest external checkpoint and its events read back whole, and a session never
    written reads empty."""
    actors, gateway = logs(tmp_path)
    store = opened(tmp_path)
    con = store.conns["messages"]
    con.execute("INSERT INTO messages SELECT 'filler-' || (i % 1000), 't', i // 1000, 'u', 'user', 'x', NULL, "
                "i / 1000.0, 0, -1 FROM range(300000) r(i)")   # at 0-300 s, row groups of their own
    events = store.conns["events"]
    events.execute("INSERT INTO events SELECT 'filler-' || (i % 1000), 't', 'u', i, 'x', NULL, i / 1000.0, 0, -1 "
                   "FROM range(300000) r(i)")
    grow(actors, "a", 2, 150.0)                  # its life lies inside the filler's
    write(actors, [(RecordKind.EVENT, event("a", i, at=150.0 + i / 2)) for i in range(3)])
    write(gateway, [(RecordKind.BLOB, blob("a", 1, at=151.5))])
    store.load_all()
    con.execute("INSERT INTO messages SELECT 'filler-' || (i % 1000), 't', 1000 + i, 'u', 'user', 'x', NULL, "
                "400 + i / 1000.0, 0, -1 FROM range(200000) r(i)")
    events.execute("INSERT INTO events SELECT 'filler-' || (i % 1000), 't', 'u', i, 'x', NULL, 400 + i / 1000.0, "
                   "0, -1 FROM range(200000) r(i)")
    store.close()
    store = opened(tmp_path)   # nothing in memory knows where its newest external checkpoint lies
    assert [m["content"] for m in store.query("messages", "a", "t")[0]] == [f"hello {i}" for i in range(4)]
    assert [(c["seq"], len(c["messages"])) for c in store.query("checkpoint_chain", "a", "t")[0]] == [(2, 4)]
    assert store.query("blob_latest", "a", "t")[0][0]["key"] == "k1"
    assert [e["seq"] for e in store.query("events", "a", "t")[0]] == [0, 1, 2]
    assert store.query("messages", "never", "t")[0] == [] and store.query("messages", "a", "u")[0] == []
    store.close()
    for log in (actors, gateway):
        log.close()


def crash(store):
    """Gone without its close: DuckDB keeps what was committed, the sums in memory are lost."""
    store._close_instance()
    store.payloads.close()


def merged_rows(store, db="messages"):
    return {s: (n, f, last) for s, n, f, last in store.conns[db].execute(
        f"SELECT session, counted, first_at, last_at FROM {session_summary.TABLE}").fetchall()}


def test_sums_not_yet_merged_are_read_and_a_crash_before_their_merge_loses_none(tmp_path, monkeypatch):
    monkeypatch.setattr(session_summary, "MERGE_EVERY_SECS", 3600.0)   # no merge but those forced
    actors, gateway = logs(tmp_path)
    grow(actors, "a", 2, 100.0)
    store = opened(tmp_path)
    assert merged_rows(store) == {}                              # pending, yet read
    assert listed(store) == {"a": (4, 100.0, 101.0)} == by_scan(store)
    assert len(store.query("messages", "a", "t")[0]) == 4
    store.merge_summaries(force=True)
    assert merged_rows(store) == {"a": (4, 100.0, 101.0)}
    grow(actors, "a", 1, 200.0, first_seq=3)                    # after the merge: pending again
    write(actors, [(RecordKind.EVENT, event("b", 0, at=300.0))])
    write(gateway, [(RecordKind.BLOB, blob("c", 1, at=50.0))])
    store.load_all()
    expected = {"a": (6, 100.0, 200.0), "c": (0, 50.0, 50.0)}
    assert listed(store) == expected and [e["seq"] for e in store.query("events", "b")[0]] == [0]
    crash(store)
    again = opened(tmp_path)   # sums the rows past the last merge again, and only those
    assert merged_rows(again) == expected == by_scan(again) == listed(again)
    assert merged_rows(again, "events") == {"b": (1, 300.0, 300.0)}
    again.close()
    for log in (actors, gateway):
        log.close()


def step(log, session, seq, full, at):
    """An agent checkpoint: a full snapshot of the transcript so far, or a delta of its two new messages."""
    messages = hello(2 * seq) if full else hello(2 * seq)[-2:]
    write(log, [(RecordKind.CHECKPOINT, records.encode_body({
        "session": session, "tenant": "t", "turn": f"turn{seq}", "seq": seq, "full": full,
        "first": 0 if full else 2 * (seq - 1), "messages": messages, "at": at}))])


def chain_of(store, session="a"):
    """(seq, full) of the chain read, and the lower bound on `ts` it was read with."""
    with store._lifetime(session, "t", chain=True) as bounds:
        pass
    return [(c["seq"], c["full"]) for c in store.query("checkpoint_chain", session, "t")[0]], bounds[0]


def test_a_chain_read_starts_at_the_newest_full_snapshot_merged_or_not_through_a_crash_and_a_close(
        tmp_path, monkeypatch):
    """Loading a session reads only from its newest full snapshot's time, not from its first row:
    the bound is the smallest time of that snapshot and the deltas after it (a clock that stepped
    back cannot hide a delta), whether those rows are merged into the summary or still pending."""
    monkeypatch.setattr(session_summary, "MERGE_EVERY_SECS", 3600.0)   # no merge but those forced
    actors, gateway = logs(tmp_path)
    for seq, full, at in ((1, True, 100.0), (2, False, 101.0), (3, False, 102.0)):
        step(actors, "a", seq, full, at)
    store = opened(tmp_path)
    assert chain_of(store) == ([(1, True), (2, False), (3, False)], 100.0)   # pending
    store.merge_summaries(force=True)
    assert chain_of(store) == ([(1, True), (2, False), (3, False)], 100.0)   # merged
    step(actors, "a", 4, True, 200.0)
    step(actors, "a", 5, False, 199.5)           # the clock stepped back between the two
    store.load_all()
    assert chain_of(store) == ([(4, True), (5, False)], 199.5)              # a pending full starts it
    store.merge_summaries(force=True)
    assert chain_of(store) == ([(4, True), (5, False)], 199.5)
    step(actors, "a", 6, False, 300.0)
    store.load_all()
    assert chain_of(store) == ([(4, True), (5, False), (6, False)], 199.5)  # a pending delta cannot raise it
    crash(store)
    again = opened(tmp_path)                      # the rows past the last merge summed again
    assert chain_of(again) == ([(4, True), (5, False), (6, False)], 199.5)
    again.conns["messages"].execute(f"UPDATE {session_summary.TABLE} SET chain_from = NULL")   # as a file from before it
    assert chain_of(again) == ([(4, True), (5, False), (6, False)], 100.0)  # from its first row then
    again.close()
    again = opened(tmp_path)
    before_close = actors.end
    step(actors, "a", 7, False, 400.0)            # written after the close's ends: the id's new life
    write(gateway, [(RecordKind.CLOSE, close("a", [[0, before_close], [1, gateway.end]], at=350.0))])
    again.load_all()
    assert chain_of(again) == ([(7, False)], 400.0)   # recomputed from the rows the close left
    again.close()
    for log in (actors, gateway):
        log.close()


def test_pending_chains_start_again_at_a_full_snapshot_and_deltas_only_lower_them():
    def row(kind, full, at):   # a checkpoints row as the loader projects it
        return ("a", "t", kind, "", 0, full, 0, None, at, 0, 0, None, None)

    pending = session_summary.Pending("messages")
    pending.stage({"checkpoints": [row("agent", False, 5.0), row("agent", True, 30.0), row("agent", False, 29.0),
                                   row("blob", True, 1.0)]})   # an external checkpoint is not in the chain
    assert pending.chain("a") == [29.0, True]
    pending.committed()
    pending.stage({"checkpoints": [row("agent", False, 28.0)]})
    assert pending.chain("a") == [28.0, True]      # a later delta, staged: lower
    pending.committed()
    pending.stage({"checkpoints": [row("agent", True, 40.0)]})
    assert pending.chain("a") == [40.0, True]      # a later full, staged: starts again
    pending.committed()
    assert pending.kept_chains == {"a": [40.0, True]} and pending.chain("b") is None
