"""The write-ahead log's DuckDB projection (storage/store.py), loaded in-process from real segment
files (no bus)."""
import errno
import os

import msgpack
import pytest

from log_frames import frames
from storage import records, segments
from storage.records import RecordKind
from storage.store import Store


def test_the_store_loads_only_what_its_writers_reported_durable(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    data = frames(6)
    log.write(data, sync=True)
    store = Store(tmp_path, 1, 64)
    store.open()
    try:
        store.limits = {0: sum(map(len, data[:4]))}    # the last two: written, fdatasync not back yet
        store.load_all()
        assert store.loaded == {0: sum(map(len, data[:4]))} and store.stats["records"] == 4
        store.limits[0] = log.end                      # the writer's notice
        store.load_all()
        assert store.loaded == {0: log.end} and store.stats["records"] == 6
    finally:
        store.close()
        log.close()


def agent_checkpoint(session, seq, first, new_from, messages, full):
    return records.encode_body({"session": session, "tenant": "t", "turn": f"turn{seq}", "seq": seq, "full": full,
                                "first": first, "new_from": new_from, "messages": messages, "at": 2.0})


def test_store_loads_exactly_once_across_a_restart_and_rebuilds_checkpoint_chains(tmp_path):
    wal = tmp_path / "wal" / "0"
    log = segments.SegmentLog(wal, segment_bytes=1 << 20)
    m = [{"role": "user", "content": f"q{i}"} if i % 2 == 0 else {"role": "assistant", "content": f"a{i}"}
         for i in range(6)]
    log.write(b"".join(frames(5)), sync=True)
    log.write(records.frame(RecordKind.CHECKPOINT, b"c1", agent_checkpoint("s", 1, 0, 0, m[:2], True)), sync=True)
    log.write(records.frame(RecordKind.CHECKPOINT, b"c2", agent_checkpoint("s", 2, 2, 2, m[2:4], False)), sync=True)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    assert store.load_once() == 7
    assert store.load_once() == 0
    assert [r["seq"] for r in store.query("checkpoint_chain", "s")[0]] == [1, 2]
    assert store.query("checkpoint_chain", "never-checkpointed")[0] == []
    assert store.query("blob_latest", "s")[0] == []   # it has agent checkpoints, no blob
    real = store.cursors["messages"]

    class NoScans:
        def execute(self, *args):
            raise AssertionError("a session with no checkpoint must not cost a scan")

    store.cursors["messages"] = NoScans()
    assert store.query("checkpoint_chain", "new-session")[0] == []
    store.cursors["messages"] = real
    store.close()
    # More records, one of them a full snapshot, then a new store process: nothing twice.
    log.write(records.frame(RecordKind.CHECKPOINT, b"c3", agent_checkpoint("s", 3, 0, 4, m[:6], True)), sync=True)
    log.write(records.frame(RecordKind.BLOB, b"b1", records.encode_body(
        {"session": "s", "tenant": "t", "key": "k", "seq": 9, "payload": b"\x00\x01", "at": 3.0})), sync=True)
    log.write(records.frame(RecordKind.ACCESS, b"a1", records.encode_body(
        {"at": 4.0, "method": "GET", "route": "/x", "status": 200, "tenant": "t", "session": "s",
         "duration_ms": 1.5})), sync=True)
    # the gateway's access rows, many to a record; one malformed row spoils its whole record
    row = [5.0, "PUT", "/v1/sessions/{sid}/checkpoints/{key}", 200, "t", "s", 0.5]
    log.write(records.frame(RecordKind.ACCESS, b"a2", records.encode_body(
        {"at": 5.1, "rows": [row, [5.1, "GET", "/x", 404, "t", "s2", 0.2]]})), sync=True)
    log.write(records.frame(RecordKind.ACCESS, b"a3", records.encode_body({"at": 6.0, "rows": [row, ["short"]]})),
              sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    while store.load_once():
        pass
    counts = store.query("count", "")[0][0]
    assert counts == {"events": 5, "messages": 6, "checkpoints": 4, "access": 3, "flow_records": 0, "closed_sessions": 0}
    assert store.stats["bad_records"] == 1
    assert store.conns["access"].execute("SELECT status, session FROM access WHERE ts >= 5 ORDER BY ts").fetchall() \
        == [(200, "s"), (404, "s2")]
    messages, _ = store.query("messages", "s")
    assert [r["content"] for r in messages] == ["q0", "a1", "q2", "a3", "q4", "a5"]
    chain, _ = store.query("checkpoint_chain", "s")
    assert [r["seq"] for r in chain] == [3]  # from the latest full snapshot
    rebuilt = []
    for row in chain:
        rebuilt[row["first"]:] = row["messages"]
    assert rebuilt == m
    assert store.query("blob_latest", "s")[0] == [{"key": "k", "seq": 9, "payload": b"\x00\x01"}]
    page, cursor = store.query("events", "s0", limit=1)
    assert len(page) == 1 and cursor is not None
    rest, end = store.query("events", "s0", after=cursor)
    assert len(rest) == 1 and end is None and rest[0]["cursor"] > cursor
    store.close()


def test_records_whose_values_duckdb_would_refuse_are_skipped_and_the_rest_load(tmp_path):
    """Each of these once passed the projection and failed the batch's commit, at every retry:
    the loader stopped behind it (found by a peer fuzzer's LOG_APPENDs)."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    event = {"session": "s", "tenant": "t", "turn": "u", "seq": 1, "type": "turn.delta", "data": {}, "at": 1.0}
    bad = [(RecordKind.EVENT, {**event, "seq": 1 << 31}),                       # past an INTEGER column
           (RecordKind.EVENT, {**event, "session": ["s"]}),                      # a list for a text column
           (RecordKind.CHECKPOINT, {"session": "s", "seq": 1, "first": 0, "messages": {"role": "user"}}),
           (RecordKind.CHECKPOINT, {"session": "s", "seq": 1 << 63, "first": 0, "messages": []}),
           (RecordKind.BLOB, {"session": "s", "tenant": "t", "key": "k", "seq": 1, "payload": 1 << 40}),
           (RecordKind.FLOW, {"run": "r", "tenant": "t", "type": "op.done", "seq": -(1 << 40)}),
           (RecordKind.ACCESS, {"at": 1.0, "rows": [[1.0, "GET", "/x", 1 << 32, "t", "s", 0.1]]})]
    good = [(RecordKind.EVENT, event), (RecordKind.BLOB, {"session": "s", "tenant": "t", "key": "k", "seq": 2,
                                                          "payload": b"ok"})]
    for i, (kind, body) in enumerate(bad + good):
        log.write(records.frame(kind, b"r%d" % i, records.encode_body(body)), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    try:
        while store.load_once():
            pass
        assert store.stats["bad_records"] == len(bad) and store.loaded == {0: log.end}
        counts = store.query("count", "")[0][0]
        assert (counts["events"], counts["checkpoints"], counts["flow_records"], counts["access"]) == (1, 1, 0, 0)
        assert store.query("blob_latest", "s")[0] == [{"key": "k", "seq": 2, "payload": b"ok"}]
    finally:
        store.close()


def test_reopening_the_duckdb_files_mid_load_keeps_every_row_and_the_progress(tmp_path):
    """The store reopens each file now and then (its native memory starts over): loads and
    queries on either side of a reopen see one consistent file, and nothing is loaded twice."""
    import threading

    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    stop, loaded = threading.Event(), []

    def loader():
        while not stop.is_set():
            loaded.append(store.load_once())

    thread = threading.Thread(target=loader)
    thread.start()
    try:
        for round_ in range(6):
            log.write(b"".join(frames(50, start=round_ * 50)), sync=True)
            store.recycle()
    finally:
        stop.set()
        thread.join(30)
    store.load_all()
    assert store.query("count", "")[0][0]["events"] == 300
    assert store.stats["reopened"] == 6
    store.close()
    again = Store(tmp_path, writers=1, memory_limit_mb=64)   # after a restart: nothing loaded twice
    again.open()
    again.load_all()
    assert again.query("count", "")[0][0]["events"] == 300
    again.close()
    log.close()


def blob(session, seq, payload):
    return records.encode_body({"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq, "payload": payload,
                                "at": 1.0})


def segment_path(tmp_path, number):
    return tmp_path / "db" / "payloads" / f"{number:08d}"


def test_checkpoints_larger_than_duckdbs_memory_limit_still_load(tmp_path):
    """16 MB of checkpoint payloads in one batch, with DuckDB held to 16 MB per file: the payloads
    go to the payload file, DuckDB only gets their places, and every one reads back."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=64 << 20)
    payloads = {i: os.urandom(40_000) for i in range(400)}
    log.write(b"".join(records.frame(RecordKind.BLOB, f"b{i}".encode(), blob(f"s{i % 40}", i, p))
                       for i, p in payloads.items()), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    assert store.stats["load_errors"] == 0
    assert store.query("count", "")[0][0]["checkpoints"] == 400
    for s in range(40):
        latest = store.query("blob_latest", f"s{s}")[0][0]
        assert latest["seq"] == 360 + s and latest["payload"] == payloads[360 + s]
    store.close()


def test_payloads_no_committed_row_names_are_cut_off_on_open_and_loaded_again(tmp_path):
    """A crash between writing a batch's payloads and committing its rows: on restart the stray
    bytes go, the records load again from the log, and each payload reads back whole."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    log.write(records.frame(RecordKind.BLOB, b"b1", blob("s", 1, b"first")), sync=True)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    store.close()
    log.write(records.frame(RecordKind.BLOB, b"b2", blob("s", 2, b"second")), sync=True)
    log.close()
    with open(segment_path(tmp_path, 0), "ab") as f:
        f.write(b"half-written payload of a batch that never committed")
    with open(segment_path(tmp_path, 1), "wb") as f:     # a segment begun by that batch
        f.write(b"more of it")
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    assert store.payloads.total_bytes == len(b"first") and not segment_path(tmp_path, 1).exists()
    store.load_all()
    assert store.query("blob_latest", "s")[0] == [{"key": "k2", "seq": 2, "payload": b"second"}]
    assert segment_path(tmp_path, 0).read_bytes() == b"first"
    assert segment_path(tmp_path, 2).read_bytes() == b"second"   # each start begins a segment
    store.close()


def five_checkpoints(tmp_path):
    """A store opened on a log of five checkpoints of 10 bytes (s0..s4), none loaded yet."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    log.write(b"".join(records.frame(RecordKind.BLOB, f"b{i}".encode(), blob(f"s{i}", i, bytes([i]) * 10))
                       for i in range(5)), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    return store


def test_a_batch_duckdb_refuses_is_retried_smaller_and_its_payloads_are_rewritten(tmp_path, monkeypatch):
    store = five_checkpoints(tmp_path)
    real_commit, failures = store._commit, []

    def refuse_once(db, tables, positions, big):
        if db == "messages" and not failures:
            failures.append(db)
            raise MemoryError("out of memory (simulated)")
        real_commit(db, tables, positions, big)

    monkeypatch.setattr(store, "_commit", refuse_once)
    with pytest.raises(MemoryError):
        store.load_once()
    assert store.read_bytes < 8 << 20 and store.payloads.total_bytes == 0
    store.load_all()
    assert store.query("count", "")[0][0]["checkpoints"] == 5
    assert store.query("blob_latest", "s4")[0][0]["payload"] == bytes([4]) * 10
    assert segment_path(tmp_path, 0).stat().st_size == 50   # the retry wrote over the refused batch
    store.close()


def test_a_payload_the_disk_has_no_room_for_leaves_its_batch_to_be_loaded_again(tmp_path, monkeypatch):
    """A full disk met while copying a batch's payloads (before any DuckDB commit) once left the
    log readers past the batch: its records never reached DuckDB (found on a 12 MiB disk the logs
    shared with DuckDB)."""
    store = five_checkpoints(tmp_path)
    real_append, failures = store.payloads.loader.append, []

    def full_once(payload):
        if len(failures) < 1 and payload == bytes([3]) * 10:
            failures.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(payload)

    monkeypatch.setattr(store.payloads.loader, "append", full_once)
    with pytest.raises(OSError):
        store.load_once()
    store.load_all()
    assert store.query("count", "")[0][0]["checkpoints"] == 5
    assert [store.query("blob_latest", f"s{i}")[0][0]["payload"] for i in range(5)] == [bytes([i]) * 10
                                                                                          for i in range(5)]
    assert segment_path(tmp_path, 0).stat().st_size == 50   # the retry wrote over what the failed one had
    store.close()


def test_only_a_sessions_newest_blob_of_a_batch_is_copied_to_the_payload_file(tmp_path):
    """Nothing reads an older external checkpoint, so a batch copies out one payload per session;
    every row is still there, and the newest reads back, in this batch and the next."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    log.write(b"".join(records.frame(RecordKind.BLOB, f"{sid}-{i}".encode(), blob(sid, i, f"{sid}:{i};".encode()))
                       for i in range(4) for sid in ("a", "b")), sync=True)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    assert store.query("count", "")[0][0]["checkpoints"] == 8
    assert store.query("blob_latest", "a")[0] == [{"key": "k3", "seq": 3, "payload": b"a:3;"}]
    assert store.query("blob_latest", "b")[0] == [{"key": "k3", "seq": 3, "payload": b"b:3;"}]
    assert segment_path(tmp_path, 0).read_bytes() == b"a:3;b:3;"
    log.write(records.frame(RecordKind.BLOB, b"a-4", blob("a", 4, b"a:4;")), sync=True)
    log.close()
    store.load_all()
    assert store.query("blob_latest", "a")[0][0]["payload"] == b"a:4;"
    assert store.query("blob_latest", "b")[0][0]["payload"] == b"b:3;"
    assert segment_path(tmp_path, 0).read_bytes() == b"a:3;b:3;a:4;"
    store.close()


def test_checkpoint_rows_from_before_the_payload_file_still_read(tmp_path):
    """A messages.db written when payloads were BLOB columns: the old rows keep reading, new ones
    go to the file."""
    import duckdb

    (tmp_path / "db").mkdir()
    con = duckdb.connect(str(tmp_path / "db" / "messages.db"))
    con.execute("CREATE TABLE checkpoints (session VARCHAR, tenant VARCHAR, kind VARCHAR, key VARCHAR, seq BIGINT, "
                "is_full BOOLEAN, first_idx INTEGER, payload BLOB, ts DOUBLE, writer SMALLINT, lsn BIGINT)")
    con.execute("INSERT INTO checkpoints VALUES ('old', 't', 'blob', 'k', 1, true, 0, 'inline'::BLOB, 1.0, 0, 0)")
    con.execute("INSERT INTO checkpoints VALUES ('old', 't', 'agent', '', 1, true, 0, ?, 1.0, 0, 0)",
                [msgpack.packb([{"role": "user", "content": "kept inline"}])])
    con.close()
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    log.write(b"".join(frames(1)), sync=True)   # position 0: the old row's lsn
    log.write(records.frame(RecordKind.BLOB, b"b1", blob("new", 1, b"outside")), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    assert store.query("blob_latest", "old")[0][0]["payload"] == b"inline"
    assert store.query("checkpoint_chain", "old")[0][0]["messages"] == [{"role": "user", "content": "kept inline"}]
    assert store.query("blob_latest", "new")[0][0]["payload"] == b"outside"
    store.close()


def test_payload_segments_sync_in_chunks_start_anew_when_full_and_read_back_every_byte(tmp_path, monkeypatch):
    """A sync larger than one flush chunk is flushed in pieces of whole payloads, each at most the
    chunk size plus one payload; a full segment is followed by a new one; every byte lands where
    append() promised."""
    from storage import payload_segments

    monkeypatch.setattr(payload_segments, "SYNC_CHUNK", 1000)
    monkeypatch.setattr(payload_segments, "SEGMENT_ROWS", 6)
    flushed = []
    real_pwritev, real_fdatasync = os.pwritev, os.fdatasync
    monkeypatch.setattr(payload_segments.os, "pwritev",
                        lambda fd, parts, at: (flushed.append(sum(map(len, parts))), real_pwritev(fd, parts, at))[1])
    syncs = []
    monkeypatch.setattr(payload_segments.os, "fdatasync", lambda fd: (syncs.append(fd), real_fdatasync(fd)))
    segs = payload_segments.PayloadSegments(tmp_path / "p")
    assert segs.open({}) == []
    parts = [bytes([i]) * (300 + 300 * i) for i in range(8)]
    spots = [segs.loader.append(p) for p in parts]
    segs.loader.sync()
    assert len(flushed) == len(syncs) > 1 and sum(flushed) == sum(map(len, parts))
    assert max(flushed) < 1000 + max(map(len, parts))
    assert [payload_segments.segment_of(at) for at, _ in spots] == [0] * 6 + [1] * 2
    assert [segs.read(at, n) for at, n in spots] == parts
    assert segs.sealed_segments() == {0: sum(map(len, parts[:6]))} and segs.total_bytes == sum(map(len, parts))
    segs.close()
    assert (tmp_path / "p" / "00000001").stat().st_size == sum(map(len, parts[6:]))




def test_a_flow_record_bigger_than_duckdbs_memory_limit_loads_and_reads_back(tmp_path):
    """A 12 MB value with DuckDB held to 16 MB per file (as it was then; now 64 MB for the four):
    the loader retried that batch for ever (and loaded nothing after it) before it learnt to raise
    the limit for the one commit."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=64 << 20)
    big = {"run": "r1", "tenant": "t", "type": "step.done", "seq": 0, "result": "x" * (12 << 20), "at": 1.0}
    log.write(records.frame(RecordKind.FLOW, b"f1", records.encode_body(big)) + b"".join(frames(3)), sync=True)
    # and a run's worth of 4 MB step results: each commit's autocheckpoint pins one such block
    # (at the small limit that failure was fatal to the file)
    for seq in range(1, 7):
        step = {**big, "seq": seq, "result": "y" * (4 << 20)}
        log.write(records.frame(RecordKind.FLOW, f"f{seq + 1}".encode(), records.encode_body(step)), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    try:
        store.load_all()
        assert store.stats["load_errors"] == 0 and store.stats["records"] == 10
        rows = store.query("flow_records", "r1")[0]
        assert [len(r["result"]) for r in rows] == [12 << 20] + [4 << 20] * 6
        assert store.memory["flows"].raised_by == 0 and store.memory["flows"].retries >= 7
        assert store.conns["flows"].execute("SELECT current_setting('memory_limit')").fetchone()[0] == "61.0 MiB"
    finally:
        store.close()


def test_a_file_duckdb_invalidated_stops_the_loader_and_asks_for_a_restart(tmp_path, monkeypatch):
    """After a FatalException every statement on the file fails: the loader retried for ever."""
    import threading

    import duckdb

    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    fatal = []
    store.on_fatal = fatal.append

    def invalidated():
        raise duckdb.FatalException("database has been invalidated because of a previous fatal error")

    monkeypatch.setattr(store, "load_once", invalidated)
    loader = threading.Thread(target=store.run_loader)
    loader.start()
    store.wake.set()
    store.urgent.set()
    loader.join(10)
    try:
        assert not loader.is_alive() and len(fatal) == 1 and store.stats["load_errors"] == 1
    finally:
        store.stopping.set()
        store.close()
