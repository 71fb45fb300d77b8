"""Superseded checkpoints leave the log's sealed segments and writer/store's payload file (the store
and the log at their level; with real processes: test_e2e_checkpoint_compaction.py)."""
import os

from storage import compaction, freeing, payload_compaction, payload_segments, records, segment_rewrites, segments
from storage.records import RecordKind
from storage.store import Store


def blob(session, seq, payload):
    return records.encode_body({"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq, "payload": payload,
                                "at": 1.0})


def agent(session, seq, first, messages, full):
    return records.encode_body({"session": session, "tenant": "t", "turn": f"turn{seq}", "seq": seq, "full": full,
                                "first": first, "messages": messages, "at": 2.0})


def message(i):
    return {"role": "user", "content": f"m{i}-" + "x" * 200}


def write_batch(log, frames):
    log.write(b"".join(records.frame(kind, rid.encode(), body) for kind, rid, body in frames), sync=True)


def reads(store):
    """What a reader sees: each session's latest external checkpoint and agent chain."""
    return ({sid: store.query("blob_latest", sid)[0] for sid in ("a", "b")},
            [(r["seq"], r["messages"]) for r in store.query("checkpoint_chain", "c")[0]])


def payload_files(tmp_path):
    return sorted(p.name for p in (tmp_path / "db" / payload_segments.DIR_NAME).iterdir())


def compact_all(store):
    """One pass over every sealed segment, as writer/store's compaction task makes it."""
    freed = 0
    for segment in payload_compaction.order(store):
        plan = payload_compaction.copy_live(store, segment)
        if plan is not None:
            freed += payload_compaction.swap(store, plan)
    return freed


def test_compacting_a_segment_keeps_what_reads_need_across_a_restart(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    # Four load batches: each leaves the newest blob of a and b in the segment, and an agent
    # chain whose full snapshot comes at seq 3 (seqs 1–2 are unreachable after it).
    for n in range(4):
        write_batch(log, [(RecordKind.BLOB, f"a{n}", blob("a", n, b"A" * 3000 + bytes([n]))),
                          (RecordKind.BLOB, f"b{n}", blob("b", n, b"B" * 1000 + bytes([n]))),
                          (RecordKind.CHECKPOINT, f"c{n}", agent("c", n + 1, 0 if n == 2 else n, [message(n)], n == 2))])
        store.load_all()
    before = reads(store)
    assert before[0]["a"][0]["payload"] == b"A" * 3000 + b"\x03" and [s for s, _ in before[1]] == [3, 4]
    assert payload_compaction.order(store) == []      # the loader still writes to segment 0
    store.close()

    store = Store(tmp_path, writers=1, memory_limit_mb=64)   # a restart seals it
    store.open()
    old_size = (tmp_path / "db" / payload_segments.DIR_NAME / "00000000").stat().st_size
    assert payload_compaction.order(store) == [0]
    plan = payload_compaction.copy_live(store, 0)
    assert plan is not None and len(plan.moves[0]) == 4     # a3, b3 and c's chain (seq 3, 4)
    # The loader goes on between the copy and the swap: its rows go to a segment of their own.
    write_batch(log, [(RecordKind.BLOB, "b4", blob("b", 4, b"late"))])
    store.load_all()
    freed = payload_compaction.swap(store, plan)

    after = reads(store)
    assert after[0]["a"] == before[0]["a"] and after[0]["b"][0]["payload"] == b"late"
    assert after[1] == before[1]
    assert payload_files(tmp_path) == ["00000001", "00000002"]   # the compaction's, the loader's
    assert freed == old_size - plan.live_bytes and freed > old_size // 2
    # Every row is still there; the unreachable ones no longer name a payload.
    assert store.query("count", "")[0][0]["checkpoints"] == 13
    (named,) = store.conns["messages"].execute("SELECT count(*) FROM checkpoints WHERE payload_at IS NOT NULL").fetchone()
    # a's newest, c's chain from its full snapshot, b's newest and the one it superseded during
    # the copy (that one goes in a later compaction)
    assert named == 1 + 2 + 2
    store.close()

    again = Store(tmp_path, writers=1, memory_limit_mb=64)   # a restart reads the moved payloads
    again.open()
    assert reads(again) == after
    write_batch(log, [(RecordKind.BLOB, "a9", blob("a", 9, b"after the restart"))])
    log.close()
    again.load_all()
    assert again.query("blob_latest", "a")[0][0]["payload"] == b"after the restart"
    # the two small segments merge into one; what reads see does not change
    compact_all(again)
    assert payload_files(tmp_path) == ["00000003", "00000004"]
    assert again.query("blob_latest", "b")[0][0]["payload"] == b"late"
    assert [(r["seq"], r["messages"]) for r in again.query("checkpoint_chain", "c")[0]] == before[1]
    again.close()


def test_a_compaction_that_stopped_before_or_after_its_commit_loses_nothing(tmp_path, monkeypatch):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    for n in range(3):
        write_batch(log, [(RecordKind.BLOB, f"a{n}", blob("a", n, bytes([n]) * 2000))])
        store.load_all()
    log.close()
    store.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    plan = payload_compaction.copy_live(store, 0)
    assert plan is not None and payload_files(tmp_path) == ["00000000", "00000001"]
    store.close()   # the process ends here, say: the copy is named by no row

    again = Store(tmp_path, writers=1, memory_limit_mb=64)
    again.open()
    assert payload_files(tmp_path) == ["00000000"]
    assert again.query("blob_latest", "a")[0][0]["payload"] == b"\x02" * 2000
    plan = payload_compaction.copy_live(again, 0)
    monkeypatch.setattr(again.payloads, "drop", lambda number: None)   # ends after its COMMIT
    payload_compaction.swap(again, plan)
    again.close()
    monkeypatch.undo()

    third = Store(tmp_path, writers=1, memory_limit_mb=64)
    third.open()
    assert payload_files(tmp_path) == ["00000002"]    # segment 0 was named by no row any more
    assert third.query("blob_latest", "a")[0][0]["payload"] == b"\x02" * 2000
    third.close()


def test_a_single_payload_file_of_an_older_version_becomes_segment_zero(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    write_batch(log, [(RecordKind.BLOB, "a0", blob("a", 0, b"zero"))])
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    store.close()
    # as an older version left it: generation 1 in force, its file, and a leftover generation 0
    (tmp_path / "db" / payload_segments.DIR_NAME / "00000000").rename(tmp_path / "db" / "messages.payloads.1")
    (tmp_path / "db" / "messages.payloads").write_bytes(b"stale")
    import duckdb
    with duckdb.connect(str(tmp_path / "db" / "messages.db")) as con:
        con.execute("INSERT INTO payload_file VALUES (1)")
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    assert not list((tmp_path / "db").glob("messages.payloads*"))
    assert store.query("blob_latest", "a")[0][0]["payload"] == b"zero"
    write_batch(log, [(RecordKind.BLOB, "a1", blob("a", 1, b"one"))])
    log.close()
    store.load_all()
    assert store.query("blob_latest", "a")[0][0]["payload"] == b"one"
    assert payload_files(tmp_path) == ["00000000", "00000001"]
    store.close()


def test_forgetting_superseded_rows_keeps_each_sessions_newest_and_the_progress(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    # a's last record in the log is older than its newest (seq 9 came first): still superseded
    write_batch(log, [(RecordKind.BLOB, f"{sid}{n}", blob(sid, n, b"x")) for n in range(3) for sid in "ab"])
    write_batch(log, [(RecordKind.BLOB, "a9", blob("a", 9, b"newest")), (RecordKind.BLOB, "a5", blob("a", 5, b"late"))])
    end = log.end
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    named = store.superseded_blobs(0, 0, end)
    assert len(named) == 2 + 1 + 2 + 1                                 # a0-a2, a5, b0-b1
    assert store.forget_superseded(0, 0, end, [p for p, _, _ in named]) == 2 + 2 + 1   # not a5: the progress
    left = store.conns["messages"].execute("SELECT session, seq FROM checkpoints ORDER BY lsn").fetchall()
    assert left == [("b", 2), ("a", 9), ("a", 5)]
    assert store.query("blob_latest", "a")[0][0]["payload"] == b"newest"
    store.close()
    again = Store(tmp_path, writers=1, memory_limit_mb=64)   # a restart reads the log again: none come back
    again.open()
    again.load_all()
    assert again.query("count", "")[0][0]["checkpoints"] == 3
    again.close()


def test_a_full_segment_mostly_live_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(payload_compaction, "SMALL_SHARE", 0.0)   # as if it were full
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    write_batch(log, [(RecordKind.BLOB, f"{sid}", blob(sid, 1, b"x" * 1000)) for sid in "abcd"])
    write_batch(log, [(RecordKind.BLOB, "a2", blob("a", 2, b"y" * 1000))])
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    store.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    assert payload_compaction.copy_live(store, 0) is None   # 4 of 5 payloads live
    store.close()


def test_a_segment_loses_exactly_the_checkpoints_named_and_nothing_else(tmp_path):
    frames = [(RecordKind.BLOB, "a1", blob("a", 1, b"old" * 500)),
              (RecordKind.EVENT, "e1", records.encode_body({"session": "a", "type": "x", "at": 1.0})),
              (RecordKind.BLOB, "b1", blob("b", 1, b"only")),
              (RecordKind.BLOB, "a2", blob("a", 2, b"older" * 500)),
              (RecordKind.BLOB, "a3", blob("a", 3, b"newest"))]
    log = segments.SegmentLog(tmp_path, segment_bytes=1 << 20)   # zeroed to 1 MiB ahead of use
    for kind, rid, body in frames:
        log.write(records.frame(kind, rid.encode(), body), sync=True)
    length = log.end
    log.close()
    ((_, path),) = segments.list_segments(tmp_path)
    offsets = {rid.decode(): off for off, _, rid, _, _ in records.scan(path.read_bytes())}
    # a1 and a2 are superseded; the event's offset, one inside a record, and a1's offset under
    # the wrong seq are not those checkpoints
    named = [(offsets["a1"], "a", 1), (offsets["e1"], "a", 1), (offsets["a2"], "a", 2), (offsets["a2"] + 7, "a", 2),
             (offsets["b1"], "b", 7)]
    os.utime(path, (1_000_000_000, 1_000_000_000))   # written long ago
    assert segment_rewrites.cut_records(path, named, length) == (2, 3)
    freeing.replace(path.with_suffix(segment_rewrites.SUFFIX), path)
    data = path.read_bytes()
    assert [rid for _, _, rid, _, _ in records.scan(data)] == [b"e1", b"b1", b"a3"]
    assert path.stat().st_mtime == 1_000_000_000      # still: the access-row retention goes by it
    assert len(data) == length - (offsets["e1"] - offsets["a1"]) - (offsets["a3"] - offsets["a2"])
    # A crash after the rewrite, before the mark moved: the same names again find other records
    # at those offsets (e1 now starts where a1 did) and drop nothing.
    assert segment_rewrites.cut_records(path, [(offsets["a1"], "a", 1), (offsets["a2"], "a", 2)], len(data)) == (0, 2)
    assert path.read_bytes() == data and not path.with_suffix(segment_rewrites.SUFFIX).exists()


def test_access_rows_older_than_the_window_leave_duckdb_but_each_logs_newest_record_stays(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    for n in range(6):   # two a record, one second apart: 100.0 … 105.5
        rows = [[100.0 + n + half, "GET", "/healthz", 200, "t", "", 1.0] for half in (0.0, 0.5)]
        body = records.encode_body({"at": rows[-1][0], "rows": rows})
        log.write(records.frame(RecordKind.ACCESS, f"x{n}".encode(), body), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    assert store.purge_access(103.0) == 6      # 100.0 … 102.5
    assert store.purge_access(103.0) == 0
    assert store.purge_access(1e12) == 4       # all but the newest record's rows: the file's progress
    left = store.conns["access"].execute("SELECT ts FROM access ORDER BY ts").fetchall()
    assert left == [(105.0,), (105.5,)]
    store.close()
    again = Store(tmp_path, writers=1, memory_limit_mb=64)   # nothing comes back from the log
    again.open()
    again.load_all()
    assert again.query("count", "")[0][0]["access"] == 2
    again.close()


def test_the_compaction_mark_survives_and_an_unreadable_one_starts_over(tmp_path):
    assert compaction.read_mark(tmp_path) == 0
    compaction.write_mark(tmp_path, 4096)
    assert compaction.read_mark(tmp_path) == 4096
    (tmp_path / compaction.MARK_FILE).write_text("garbage")
    assert compaction.read_mark(tmp_path) == 0
    compaction.write_mark(tmp_path, 77, compaction.ACCESS_MARK_FILE)   # each pass has its own
    assert compaction.read_mark(tmp_path, compaction.ACCESS_MARK_FILE) == 77 and compaction.read_mark(tmp_path) == 0
    assert segments.list_segments(tmp_path) == []    # the mark is not mistaken for a segment


def test_the_segments_old_enough_to_revisit_are_found_by_their_times(tmp_path):
    old_enough = compaction.old_enough
    sealed = []
    for n in range(9):
        path = tmp_path / f"{n}.seg"
        path.write_bytes(b"")
        os.utime(path, (1000 + n * 10, 1000 + n * 10))    # written in log order
        sealed.append((n * 100, (n + 1) * 100, path))
    assert old_enough(sealed, 1000) == []
    assert old_enough(sealed, 1001) == sealed[:1]
    assert old_enough(sealed, 1045) == sealed[:5]
    assert old_enough(sealed, 1080) == sealed[:8]
    assert old_enough(sealed, 5000) == sealed
    assert old_enough([], 5000) == []


def test_the_store_answers_which_checkpoints_are_superseded_past_its_memory_limit(tmp_path):
    """writer/store's answer to a log writer's compaction pass, at the default memory limit (16 MB
    per DuckDB file), over a table shaped as after the checkpoint benchmark: 5,000 checkpoints of
    500 sessions spread over 100 MB of log positions. DuckDB refused the question for memory (it
    sized a structure by the range of positions: 8 MB for a 64 MB segment), the answer was an
    error, and compaction dropped nothing from the log, every pass. The bus is a fake; the store,
    its files and its query thread are real."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from agentos.config import from_dict
    from broker.protocol import Kind, Message
    from storage.store_process import StoreService

    config = from_dict({"storage": {"dir": str(tmp_path / "data")}})
    service = StoreService(config, "ipc:///nonexistent", logging.getLogger("test"))
    service.store.open()
    service.store.conns["messages"].execute(
        "INSERT INTO checkpoints (session, tenant, kind, key, seq, is_full, first_idx, payload, ts, writer, lsn) "
        "SELECT 'agent-' || (i % 500), 'default', 'blob', (i // 500)::VARCHAR, i, false, 0, NULL, 0, 1, i * 20000 "
        "FROM range(5000) t(i)")
    service.store.conns["messages"].execute("CHECKPOINT")
    replies = []
    service.bus = SimpleNamespace(reply=lambda msg, kind, body: replies.append(body))

    async def ask():
        service.loop = asyncio.get_running_loop()
        await service.on_superseded(Message("gateway/0", Kind.STORE_SUPERSEDED, 1, 0.0, 0, "", "",
                                            {"writer": 1, "start": 0, "end": 64 << 20}))
    try:
        asyncio.run(ask())
    finally:
        service.store.close()
        service.queries.shutdown()
        service.maintenance.shutdown()
    (body,) = replies
    assert "error" not in body, body["error"][:200]
    # the segment's 3,356, every one superseded by a later round of its session
    assert len(body["rows"]) == (64 << 20) // 20000 + 1


def test_a_checkpoint_whose_head_does_not_name_it_is_read_whole_before_it_is_cut(tmp_path):
    """The cut reads a named record's head for its session and seq; a body that puts its payload
    first (not how our writers order it) is read whole, checksum and all."""
    payload_first = records.encode_body({"payload": b"p" * 9000, "session": "a", "tenant": "t", "key": "k1",
                                         "seq": 1, "at": 1.0})
    corrupt = bytearray(records.frame(RecordKind.BLOB, b"c", records.encode_body(
        {"payload": b"q" * 9000, "session": "c", "seq": 1, "at": 1.0})))
    corrupt[-1] ^= 0xFF                                       # its checksum no longer holds
    log = segments.SegmentLog(tmp_path, segment_bytes=1 << 20)
    log.write(records.frame(RecordKind.BLOB, b"a1", payload_first), sync=True)
    log.write(bytes(corrupt), sync=True)
    log.write(records.frame(RecordKind.BLOB, b"a2", blob("a", 2, b"new")), sync=True)
    length = log.end
    log.close()
    ((_, path),) = segments.list_segments(tmp_path)
    data = path.read_bytes()
    second = records.parse(data, 0)[3]
    # a1 goes, found by its whole body; the corrupt record is skipped, not cut on its head's word
    assert segment_rewrites.cut_records(path, [(0, "a", 1), (second, "c", 1)], length) == (1, 1)
    freeing.replace(path.with_suffix(segment_rewrites.SUFFIX), path)
    assert path.read_bytes() == data[second:length]


def test_forgetting_deletes_the_rows_the_pass_was_named_not_those_superseded_since(tmp_path):
    """Between a pass's question and its forgetting, the log drops what it was named; a checkpoint
    superseded meanwhile is still in the log, so its row stays for the next pass to name (had it
    gone, no pass would ever drop its record)."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    write_batch(log, [(RecordKind.BLOB, f"a{n}", blob("a", n, b"x")) for n in range(2)])
    end = log.end
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    named = store.superseded_blobs(0, 0, end)
    assert [seq for _, _, seq in named] == [0]
    write_batch(log, [(RecordKind.BLOB, "a2", blob("a", 2, b"newest"))])   # a1 superseded now
    log.close()
    store.load_all()
    assert store.forget_superseded(0, 0, end, [position for position, _, _ in named]) == 1
    assert [seq for _, _, seq in store.superseded_blobs(0, 0, end)] == [1]   # the next pass names a1
    assert store.forget_superseded(0, 0, end, [position for position, _, _ in store.superseded_blobs(0, 0, end)]) == 1
    assert store.query("blob_latest", "a")[0][0]["payload"] == b"newest"
    assert store.query("count", "")[0][0]["checkpoints"] == 1
    store.close()
