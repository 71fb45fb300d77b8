"""writer/store answers `blob_latest` from where it knows each session's newest external checkpoint
lies (storage/newest_blobs.py); the answer must be the one the DuckDB query gives, whatever came
in between: loads, restarts, closes, payload compactions."""
import random

from storage import payload_compaction, payload_segments, records, segments
from storage.newest_blobs import Newest, NewestBlobs
from storage.records import RecordKind
from storage.store import Store


def row(seq, at=0, writer=0, lsn=0):
    """As a query answers it."""
    return Newest("t", f"k{seq}", seq, at, 10, False, writer, lsn)


def loaded_row(session, seq, at=0, writer=0, lsn=0):
    """As the loader commits it (storage/projection.py, its payload placed)."""
    return (session, "t", "blob", f"k{seq}", seq, True, 0, None, 1.0, writer, lsn, at, 10)


def test_a_sessions_first_checkpoint_is_known_at_once_one_from_before_only_once_a_query_answered():
    known = NewestBlobs()
    known.loaded(loaded_row("new", 5), first=True)
    known.loaded(loaded_row("old", 7), first=False)   # rows from before this process may be newer
    assert known.get("new").seq == 5 and known.get("old") is None
    known.answered("old", row(6), known.removals)   # the query saw 6; the load since brought 7
    assert known.get("old").seq == 7
    known.loaded(loaded_row("new", 4), first=False)   # not newer: kept as it is
    known.loaded(loaded_row("new", 9), first=False)
    assert known.get("new").seq == 9


def test_a_query_answer_is_not_taken_when_an_entry_was_removed_while_it_ran():
    known = NewestBlobs()
    known.loaded(loaded_row("s", 3), first=True)
    before = known.removals
    known.forget("s")              # a close deleted its rows after the query read them
    known.answered("s", row(3), before)
    assert known.get("s") is None
    known.answered("s", row(4), known.removals)
    assert known.get("s").seq == 4


def test_the_bound_pushes_out_the_least_recently_loaded_and_a_compaction_moves_the_rest():
    known = NewestBlobs(max_sessions=2)
    for n, session in enumerate("abc"):
        known.loaded(loaded_row(session, n, at=payload_segments.place(0, n * 10), lsn=n), first=True)
    assert known.get("a") is None and known.removals == 1
    moved = known.moved(payload_segments.place(0, 0), payload_segments.place(1, 0),
                        {(0, 2): payload_segments.place(3, 0)})
    assert moved == 2 and known.get("c").at == payload_segments.place(3, 0)
    assert known.get("b") is None   # not among the rows the compaction kept: read by a query again


def _blob(session, seq, payload):
    return records.encode_body({"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq,
                                "payload": payload, "at": 1.0})


def _close(session, upto):
    return records.encode_body({"session": session, "tenant": "t", "upto": upto, "at": 2.0})


def _by_query(store, session):
    """What the DuckDB query answers (the way every read went before the entries)."""
    found = store.cursors["messages"].execute(
        "SELECT key, seq, payload, payload_at, payload_len FROM checkpoints WHERE session = ? AND kind = 'blob' "
        "ORDER BY seq DESC LIMIT 1", [session]).fetchone()
    return [] if found is None else [{"key": found[0], "seq": found[1], "payload": store._payload(*found[2:])}]


def test_reads_answer_what_the_query_would_through_loads_restarts_closes_and_compactions(tmp_path):
    rng = random.Random(7)
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)

    def opened():
        store = Store(tmp_path, writers=1, memory_limit_mb=64, payload_segment_bytes=40_000)
        store.open()
        store.load_all()
        return store

    store = opened()
    sessions = [f"s{i}" for i in range(12)]
    expected: dict[str, tuple[int, bytes]] = {}
    seq = 0
    served = 0
    for step in range(60):
        frames = []
        for session in rng.sample(sessions, 5):
            for _ in range(rng.randint(1, 3)):   # several of one session in a batch: only the newest is copied
                seq += 1
                payload = bytes([seq % 251]) * rng.randint(500, 3000)
                frames.append(records.frame(RecordKind.BLOB, f"r{seq}".encode(), _blob(session, seq, payload)))
                expected[session] = (seq, payload)
        if step % 7 == 3:
            gone = rng.choice(sessions)
            frames.append(records.frame(RecordKind.CLOSE, b"", _close(gone, [[0, log.end + len(b"".join(frames))]])))
            expected.pop(gone, None)
        log.write(b"".join(frames), sync=True)
        store.load_all()
        if step % 11 == 5:
            store.close()
            store = opened()
        if step % 5 == 4:
            for segment in payload_compaction.order(store):
                plan = payload_compaction.copy_live(store, segment)
                if plan is not None:
                    payload_compaction.swap(store, plan)
        for session in sessions:
            answer = store.query("blob_latest", session)[0]
            assert answer == _by_query(store, session)
            want = expected.get(session)
            assert [(r["seq"], r["payload"]) for r in answer] == ([want] if want else [])
            served += store.newest.get(session) is not None
    assert served > 300   # most reads were answered from the entries, not by the query
    store.close()
    log.close()
