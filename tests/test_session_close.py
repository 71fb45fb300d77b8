"""Closing a session (DELETE /v1/sessions/{sid}): its transcript, events and checkpoints leave
DuckDB at once and the log with its compaction; the id can be used again, starting empty."""
import time

from storage import records, segments
from storage.records import RecordKind
from storage.store import Store


def event(session, seq, at=1.0):
    return records.encode_body({"session": session, "tenant": "t", "turn": "t1", "seq": seq, "type": "step.completed",
                                "data": {"n": seq}, "at": at})


def agent(session, seq, messages, at=1.0):
    return records.encode_body({"session": session, "tenant": "t", "turn": f"turn{seq}", "seq": seq, "full": True,
                                "first": 0, "messages": messages, "at": at})


def blob(session, seq, at=1.0):
    return records.encode_body({"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq, "payload": b"p" * 100,
                                "at": at})


def close(session, upto, at=2.0):
    return records.encode_body({"session": session, "tenant": "t", "upto": upto, "at": at})


def write(log, frames):
    log.write(b"".join(records.frame(kind, b"", body) for kind, body in frames), sync=True)


def logs(tmp_path):
    return [segments.SegmentLog(tmp_path / "wal" / str(i), segment_bytes=1 << 20) for i in range(2)]


def opened(tmp_path):
    store = Store(tmp_path, writers=2, memory_limit_mb=64)
    store.open()
    store.load_all()
    return store


def reads(store, session):
    return {"messages": store.query("messages", session)[0], "events": store.query("events", session)[0],
            "chain": store.query("checkpoint_chain", session)[0], "latest": store.query("blob_latest", session)[0]}


def hello(n):
    return [{"role": "user", "content": f"hello {i}"} for i in range(n)]


def test_a_closed_session_leaves_duckdb_and_another_stays_across_a_restart(tmp_path):
    actors, gateway = logs(tmp_path)
    for sid in ("gone", "kept"):
        write(actors, [(RecordKind.EVENT, event(sid, 0)), (RecordKind.CHECKPOINT, agent(sid, 1, hello(2)))])
        write(gateway, [(RecordKind.BLOB, blob(sid, 1))])
    store = opened(tmp_path)
    before = reads(store, "kept")
    assert all(before.values()) and all(reads(store, "gone").values())
    write(gateway, [(RecordKind.CLOSE, close("gone", [[0, actors.end], [1, gateway.end]]))])
    store.load_all()
    assert not any(reads(store, "gone").values())
    assert reads(store, "kept") == before
    # the log still holds its records: the store says where, for the log's compaction
    named = {log: store.closed_records(log, 1 << 40) for log in (0, 1)}
    assert [s for _, s, _ in named[0]] == ["gone", "gone"] and [s for _, s, _ in named[1]] == ["gone"]
    assert all(at == 2.0 for rows in named.values() for _, _, at in rows)
    counts = store.query("count", "")[0][0]
    store.close()
    for log in (actors, gateway):
        log.close()

    again = opened(tmp_path)   # a restart reads nothing twice and brings nothing back
    assert again.query("count", "")[0][0] == counts
    assert not any(reads(again, "gone").values()) and reads(again, "kept") == before
    assert again.forget_closed(0, 0, 1 << 40) == 2 and again.closed_records(0, 1 << 40) == []
    again.close()


def test_records_before_the_close_that_a_log_yields_later_are_never_loaded_and_the_id_starts_over(tmp_path):
    """The store reads its logs side by side: the close (in the gateway's log) can come before
    records of the session it covers (in an actor's log)."""
    actors, gateway = logs(tmp_path)
    write(actors, [(RecordKind.EVENT, event("s", 0))])
    first = actors.end
    late = [(RecordKind.EVENT, event("s", 1)), (RecordKind.CHECKPOINT, agent("s", 1, hello(3)))]
    upto = first + sum(len(records.frame(k, b"", b)) for k, b in late)
    write(gateway, [(RecordKind.CLOSE, close("s", [[0, upto], [1, gateway.end]]))])
    store = Store(tmp_path, writers=2, memory_limit_mb=64)
    store.open()
    store.limits = {0: first, 1: gateway.end}   # log 0 is loaded only so far
    store.load_all()
    assert not any(reads(store, "s").values()) and "s" in store.closing
    write(actors, late)                         # …then the records before the close come
    write(actors, [(RecordKind.CHECKPOINT, agent("s", 1, [{"role": "user", "content": "new life"}], at=3.0))])
    store.limits = None
    store.load_all()
    assert store.closing == {}
    assert [m["content"] for m in reads(store, "s")["messages"]] == ["new life"]
    assert [p for p, _, _ in store.closed_records(0, 1 << 40)] == [0, first, first + len(records.frame(
        RecordKind.EVENT, b"", late[0][1]))]
    store.close()


def test_a_close_whose_deletions_failed_is_applied_at_the_next_open(tmp_path, monkeypatch):
    actors, gateway = logs(tmp_path)
    write(actors, [(RecordKind.CHECKPOINT, agent("s", 1, hello(2)))])
    write(gateway, [(RecordKind.CLOSE, close("s", [[0, actors.end], [1, gateway.end]]))])

    def fail(*args):
        raise RuntimeError("DuckDB refused")
    monkeypatch.setattr(Store, "apply_close", fail)
    store = opened(tmp_path)
    assert reads(store, "s")["messages"] and len(store.pending_closes) == 1
    store.close()
    monkeypatch.undo()
    again = opened(tmp_path)
    assert not any(reads(again, "s").values()) and again.pending_closes == []
    again.close()


def test_compaction_drops_a_closed_sessions_records_by_name_and_time():
    from storage.segment_rewrites import records_of

    drop = records_of({"gone": 5.0})
    assert drop(RecordKind.EVENT, event("gone", 0, at=4.0))
    assert drop(RecordKind.BLOB, blob("gone", 1, at=5.0))
    assert not drop(RecordKind.CHECKPOINT, agent("gone", 2, hello(1), at=6.0))   # the id's next life
    assert not drop(RecordKind.EVENT, event("kept", 0, at=1.0))
    assert not drop(RecordKind.CLOSE, close("gone", [], at=1.0))


def test_closing_a_session_over_http_removes_it_for_reads_at_once_and_from_the_log_later(make_server, tmp_path):
    """Real processes: a session with turns and external checkpoints is closed; every read of it
    404s right away, also after a restart, while another session is untouched; its id starts
    over; the log's compaction then drops its records."""
    from harness import get_json, status_of, turn, wait_until

    from bench.failover import put

    server = make_server({"storage": {"segment_bytes": 4096, "compaction_interval_secs": 1}})
    base = server.url
    for sid in ("doomed", "other"):
        assert turn(base, sid, "remember me").terminal == "turn.completed"
        assert put(base, sid, "k1", b"state " * 200) == 200
    fresh_prompt = turn(base, "fresh", "remember me").data("turn.completed")["usage"]["prompt_tokens"]

    def left_in_logs(before):
        left = []
        for wal in (tmp_path / "data" / "wal").iterdir():
            for _, path in segments.list_segments(wal):
                for _, kind, _, body, _ in records.scan(path.read_bytes()):
                    if kind in (RecordKind.EVENT, RecordKind.CHECKPOINT, RecordKind.BLOB):
                        decoded = records.decode_body(body)
                        if decoded.get("session") == "doomed" and decoded.get("at", 0) < before:
                            left.append((wal.name, path.name, kind))
        return left

    assert left_in_logs(time.time())
    status, _, _ = get_json(f"{base}/v1/sessions/doomed", method="DELETE")
    assert status == 204
    closed_at = time.time()

    def gone(sid):
        return [status_of(f"{base}/v1/sessions/{sid}/{path}") for path in ("messages", "events", "checkpoints/latest")]

    assert gone("doomed") == [404, 404, 404]
    assert gone("other") == [200, 200, 200]
    assert get_json(f"{base}/v1/sessions/never-seen", method="DELETE")[0] == 204
    server.stop()
    base = server.start().url   # a new port
    assert gone("doomed") == [404, 404, 404] and gone("other") == [200, 200, 200]

    # the id starts over: the model sees no history, and the transcript holds only the new turn
    again = turn(base, "doomed", "remember me")
    assert again.data("turn.completed")["usage"]["prompt_tokens"] == fresh_prompt
    _, _, body = get_json(f"{base}/v1/sessions/doomed/messages")
    assert [m["content"] for m in body["messages"]] == ["remember me", again.text]

    for n in range(12):   # more records seal the segments holding the old ones
        assert put(base, "filler", f"f{n}", b"x" * 1500) == 200
        turn(base, "doomed", f"more {n}")
    wait_until(lambda: not left_in_logs(closed_at), 60, "the closed session's records to leave the log", interval=0.5)
    # The pass says so once the store has forgotten them too, a bus exchange after the rewrite.
    wait_until(lambda: "records of closed sessions" in server.log(), 30, "the pass's log line", interval=0.2)


def test_a_close_record_that_names_no_session_or_bad_ends_is_skipped(tmp_path):
    actors, gateway = logs(tmp_path)
    write(actors, [(RecordKind.CHECKPOINT, agent("s", 1, hello(2)))])
    write(gateway, [(RecordKind.CLOSE, close("", [[0, 1 << 30]])), (RecordKind.CLOSE, close("s", [["x", None]])),
                    (RecordKind.CLOSE, close("s", "everything"))])
    store = opened(tmp_path)
    assert store.stats["bad_records"] == 3
    assert [m["content"] for m in reads(store, "s")["messages"]] == ["hello 0", "hello 1"]
    store.close()


def test_closed_sessions_stay_closed_through_kill9_of_the_store_and_of_the_whole_tree(make_server):
    """Real processes: writer/store killed right after closes were acknowledged (before or while
    it deletes their rows), then the whole tree: every close holds, every other session reads."""
    from harness import get_json, status_of, turn

    from bench.failover import put

    server = make_server({"storage": {"compaction_interval_secs": 1}})
    sessions = [f"kill-{i}" for i in range(6)]
    for sid in sessions:
        assert turn(server.url, sid, f"hello from {sid}").terminal == "turn.completed"
        assert put(server.url, sid, "k1", sid.encode() * 100) == 200

    def statuses(base):
        out = {}
        for sid in sessions:
            out[sid] = (status_of(f"{base}/v1/sessions/{sid}/messages"),
                        status_of(f"{base}/v1/sessions/{sid}/checkpoints/latest"))
        return out

    for sid in sessions[:2]:
        assert get_json(f"{server.url}/v1/sessions/{sid}", method="DELETE")[0] == 204
    server.kill9("writer/store")
    assert get_json(f"{server.url}/v1/sessions/{sessions[2]}", method="DELETE")[0] == 204
    server.crash()
    base = server.start().url
    expected = {sid: (404, 404) if sid in sessions[:3] else (200, 200) for sid in sessions}
    assert statuses(base) == expected
    server.kill9("writer/store")
    assert statuses(base) == expected


def test_a_close_leaves_its_row_once_its_records_are_gone_from_every_log(tmp_path):
    actors, gateway = logs(tmp_path)
    write(actors, [(RecordKind.CHECKPOINT, agent("a", 1, hello(2)))])
    write(gateway, [(RecordKind.CLOSE, close("a", [[0, actors.end], [1, gateway.end]]))])
    write(gateway, [(RecordKind.CLOSE, close("b", [[0, actors.end], [1, gateway.end]]))])
    store = opened(tmp_path)

    def closes():
        return store.conns["messages"].execute("SELECT session FROM closed_sessions ORDER BY lsn").fetchall()

    assert store.prune_closes() == 0                 # a's record is still in log 0
    assert store.forget_closed(0, 0, actors.end) == 1
    assert store.prune_closes() == 1 and closes() == [("b",)]   # b's row holds log 1's progress
    counts = store.query("count", "")[0][0]
    store.close()
    again = opened(tmp_path)                         # nothing is read twice
    assert again.query("count", "")[0][0] == counts and not any(reads(again, "a").values())
    again.close()


def test_a_turn_resumed_after_its_actor_died_does_not_bring_a_closed_session_back(make_server, make_worker, tmp_path):
    """Real processes: the actor is killed mid-turn (its successor resumes the turn in the
    background), the session is closed meanwhile; the resumed turn stops instead of writing a
    transcript for the closed session."""
    from harness import get_json, turn_killing_its_actor

    server = make_server({"gateway": {"turn_probe_secs": 1}})
    gate = tmp_path / "gate"
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(tmp_path / "tools.txt"), "FLOWS_APP_TOOL_DELAY": "2",
                             "FLOWS_APP_TOOL_GATE": str(gate)})
    sid = "closed-mid-turn"
    result = turn_killing_its_actor(server, sid, "weather and news", gate)
    assert result.events[-1][0] == "turn.interrupted", result.events[-3:]
    assert get_json(f"{server.url}/v1/sessions/{sid}", method="DELETE")[0] == 204
    deadline = time.monotonic() + 8   # the tool takes 2 s: a resumed turn would have finished by then
    while time.monotonic() < deadline:
        assert [get_json(f"{server.url}/v1/sessions/{sid}/{p}")[0] for p in ("messages", "events")] == [404, 404]
        time.sleep(0.5)


def test_compaction_picks_the_same_records_with_many_closed_sessions_in_a_segment():
    from storage.segment_rewrites import FEW_NAMES, records_of

    many = {f"gone-{i}": 5.0 for i in range(FEW_NAMES + 1)}
    drop = records_of(many)
    assert drop(RecordKind.EVENT, event("gone-3", 0, at=4.0))
    assert not drop(RecordKind.EVENT, event("gone-3", 0, at=6.0)) and not drop(RecordKind.EVENT, event("kept", 0))


def test_closing_the_sessions_that_hold_each_logs_newest_rows_keeps_the_files_progress(tmp_path):
    """The deleted rows held each table's largest lsn of their log, which an open reads as how
    far the file has loaded: a stand-in row keeps it (one per log and table, the older going), so
    a restart loads nothing again and brings nothing back."""
    actors, gateway = logs(tmp_path)
    write(actors, [(RecordKind.EVENT, event("kept", 0)), (RecordKind.CHECKPOINT, agent("kept", 1, hello(2)))])
    write(gateway, [(RecordKind.BLOB, blob("kept", 1))])
    store = opened(tmp_path)
    before = reads(store, "kept")
    for sid in ("last", "later"):   # each in turn the newest rows of every table of both logs
        write(actors, [(RecordKind.EVENT, event(sid, 0)), (RecordKind.CHECKPOINT, agent(sid, 1, hello(3)))])
        write(gateway, [(RecordKind.BLOB, blob(sid, 1))])
        store.load_all()
        assert all(reads(store, sid).values())
        write(gateway, [(RecordKind.CLOSE, close(sid, [[0, actors.end], [1, gateway.end]]))])
        store.load_all()
        assert not any(reads(store, sid).values())
    stand_ins = {table: store.conns[db].execute(f"SELECT writer, count(*) FROM {table} WHERE session = '' "
                                                "GROUP BY writer ORDER BY writer").fetchall()
                 for table, db in (("messages", "messages"), ("checkpoints", "messages"), ("events", "events"))}
    assert stand_ins == {"messages": [(0, 1)], "checkpoints": [(0, 1), (1, 1)], "events": [(0, 1)]}
    counts = store.query("count", "")[0][0]
    store.close()
    for log in (actors, gateway):
        log.close()

    again = opened(tmp_path)
    assert again.query("count", "")[0][0] == counts
    assert reads(again, "kept") == before
    assert not any(reads(again, "last").values()) and not any(reads(again, "later").values())
    again.close()
