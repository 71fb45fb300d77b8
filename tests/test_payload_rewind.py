"""A batch of payloads whose rows did not commit gives its room back (storage/payload_segments.py
`rewind`): on a disk the logs shared with DuckDB, a load that failed for want of room and kept
the payloads it had copied left every retry less room, and writer/store never caught up."""
import errno
import os
from types import SimpleNamespace

import duckdb
import pytest

from storage import payload_compaction, payload_segments, records, segments
from storage.payload_segments import PayloadSegments
from storage.records import RecordKind
from storage.store import Store


def on_disk(directory):
    """{name: bytes} of the payload segment files in `directory` (none being freed)."""
    return {p.name: p.stat().st_size for p in directory.iterdir()}


def opened(directory, segment_bytes):
    """An empty payload directory, opened, and its loader's appender."""
    payloads = PayloadSegments(directory, segment_bytes=segment_bytes)
    payloads.open({})
    return payloads, payloads.loader


def test_a_rewound_batch_that_spanned_segments_leaves_only_what_was_there(tmp_path):
    payloads, loader = opened(tmp_path, 100)
    kept = loader.append(b"k" * 40)
    loader.sync()
    before = on_disk(tmp_path)
    mark = loader.mark()
    for i in range(7):              # 420 bytes: the rest of segment 0, then 1, 2, 3
        loader.append(bytes([i]) * 60)
    loader.sync()
    assert len(on_disk(tmp_path)) == 4
    loader.rewind(mark)
    assert on_disk(tmp_path) == {**before, "00000003": 0}   # the one being written: emptied, written on
    assert payloads.sealed_segments() == {0: 40} and payloads.total_bytes == 40
    again = [loader.append(bytes([i]) * 60) for i in range(3)]
    loader.sync()
    assert payloads.read(*kept) == b"k" * 40
    assert [payloads.read(*at) for at in again] == [bytes([i]) * 60 for i in range(3)]
    assert sum(on_disk(tmp_path).values()) == payloads.total_bytes == 220
    loader.close()


def test_a_rewound_batch_within_one_segment_is_cut_off(tmp_path):
    payloads, loader = opened(tmp_path, 1000)
    loader.append(b"k" * 40)
    loader.sync()
    mark = loader.mark()
    loader.append(b"x" * 500)
    loader.sync()
    loader.rewind(mark)
    assert on_disk(tmp_path) == {"00000000": 40} and payloads.total_bytes == 40
    loader.close()


def test_a_mark_before_any_segment_rewinds_to_nothing(tmp_path):
    payloads, loader = opened(tmp_path, 100)
    mark = loader.mark()
    for i in range(3):
        loader.append(bytes([i]) * 80)
    loader.sync()
    loader.rewind(mark)
    assert sum(on_disk(tmp_path).values()) == 0 and payloads.total_bytes == 0
    assert payloads.sealed_segments() == {}
    loader.close()


def blob(session, seq, payload):
    return records.encode_body({"session": session, "tenant": "t", "key": f"k{seq}", "seq": seq, "payload": payload,
                                "at": 1.0})


def twenty_sessions(tmp_path, segment_bytes=32 << 10, min_free_bytes=0):
    """A store over a log of twenty sessions' 10 KB checkpoints, none loaded yet."""
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    payloads = {i: os.urandom(10_000) for i in range(20)}
    log.write(b"".join(records.frame(RecordKind.BLOB, f"b{i}".encode(), blob(f"s{i}", i, p))
                       for i, p in payloads.items()), sync=True)
    log.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64, payload_segment_bytes=segment_bytes,
                  min_free_bytes=min_free_bytes)
    store.open()
    return store, list(payloads.values())


def test_a_load_duckdb_could_not_commit_gives_its_payloads_room_back(tmp_path, monkeypatch):
    """Payload segments of 32 KB: the refused load's copies go, the retry loads every one, and the
    files hold what the rows name."""
    store, payloads = twenty_sessions(tmp_path)
    real_commit, refused = store._commit, []

    def full_once(db, *args, **kwargs):
        if db == "messages" and not refused:
            refused.append(db)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_commit(db, *args, **kwargs)

    monkeypatch.setattr(store, "_commit", full_once)
    directory = tmp_path / "db" / "payloads"
    with pytest.raises(OSError):
        store.load_once()
    assert sum(on_disk(directory).values()) == 0 and store.payloads.total_bytes == 0
    store.load_all()
    assert [store.query("blob_latest", f"s{i}")[0][0]["payload"] for i in range(20)] == payloads
    assert sum(on_disk(directory).values()) == store.payloads.total_bytes == 200_000
    store.close()


def test_a_load_whose_copies_would_take_the_logs_margin_fails_as_on_a_full_disk_and_gives_its_room_back(tmp_path):
    """The logs' margin (storage.min_free_bytes) is compaction's room for a segment's rewrite: a
    store that loaded into it left compaction none, and the disk stayed full for good. With room
    above the margin for two of its 32 KB segments but not the batch's 200 KB, the load fails with
    ENOSPC (the retry path of a full disk), keeps none of its copies, and loads once there is room."""
    store, payloads = twenty_sessions(tmp_path, min_free_bytes=8 << 20)
    directory = tmp_path / "db" / "payloads"
    room = {"above": 64 << 10}    # free above the margin, less what the payload files hold

    def statvfs(_path):
        free = (8 << 20) + room["above"] - sum(on_disk(directory).values())
        return SimpleNamespace(f_frsize=1, f_blocks=1 << 30, f_bavail=free)
    store.payloads.loader.floor.__self__.statvfs = statvfs   # the store's own floor, on a disk we tell
    with pytest.raises(OSError) as err:
        store.load_once()
    assert err.value.errno == errno.ENOSPC and "shares with the logs" in err.value.strerror
    assert sum(on_disk(directory).values()) == 0 and store.payloads.total_bytes == 0
    assert store.query("count", "")[0][0]["checkpoints"] == 0
    room["above"] = 1 << 20       # compaction freed the log's superseded records
    store.load_all()
    assert [store.query("blob_latest", f"s{i}")[0][0]["payload"] for i in range(20)] == payloads
    store.close()


def test_payloads_of_a_commit_duckdb_made_durable_before_a_fatal_error_stay(tmp_path, monkeypatch):
    """DuckDB can invalidate its file after a durable COMMIT (an autocheckpoint that failed): the
    rows name the payloads, so they must not go with the error; the store restarts and reads them."""
    store, payloads = twenty_sessions(tmp_path)
    real_append = store._append

    def durable_then_fatal(db, *args, **kwargs):
        real_append(db, *args, **kwargs)
        if db == "messages":
            raise duckdb.FatalException("autocheckpoint failed")

    monkeypatch.setattr(store, "_append", durable_then_fatal)
    with pytest.raises(duckdb.FatalException):
        store.load_once()
    store.close()
    again = Store(tmp_path, writers=1, memory_limit_mb=64, payload_segment_bytes=32 << 10)
    again.open()
    again.load_all()
    assert [again.query("blob_latest", f"s{i}")[0][0]["payload"] for i in range(20)] == payloads
    again.close()


def test_a_payload_compaction_that_could_not_commit_gives_its_copies_room_back(tmp_path, monkeypatch):
    store, payloads = twenty_sessions(tmp_path, segment_bytes=1 << 20)
    store.load_all()
    store.close()
    store = Store(tmp_path, writers=1, memory_limit_mb=64, payload_segment_bytes=1 << 20)
    store.open()     # a restart seals the segment; small, so a pass merges it
    directory = tmp_path / "db" / "payloads"
    before = on_disk(directory)
    plan = payload_compaction.copy_live(store, 0)
    assert plan is not None and sum(on_disk(directory).values()) == 400_000
    real_run = store.memory["messages"].run
    monkeypatch.setattr(store.memory["messages"], "run", lambda con, work: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError):
        payload_compaction.swap(store, plan)
    assert sum(on_disk(directory).values()) == sum(before.values())
    monkeypatch.setattr(store.memory["messages"], "run", real_run)
    payload_compaction.swap(store, payload_compaction.copy_live(store, 0))
    assert sum(on_disk(directory).values()) == store.payloads.total_bytes == 200_000
    assert [store.query("blob_latest", f"s{i}")[0][0]["payload"] for i in range(20)] == payloads
    store.close()


def test_a_segment_the_disk_had_no_room_to_begin_leaves_nothing_behind(tmp_path, monkeypatch):
    payloads, loader = opened(tmp_path, 100)
    loader.append(b"k" * 90)
    loader.sync()
    mark = loader.mark()
    fds = len(os.listdir("/proc/self/fd"))
    real_fsync_dir = payload_segments.fsync_dir

    def full(directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(payload_segments, "fsync_dir", full)
    loader.append(b"x" * 50)                  # the rest of segment 0
    with pytest.raises(OSError):
        loader.append(b"y" * 50)              # segment 1 cannot be begun
    loader.rewind(mark)
    assert on_disk(tmp_path) == {"00000000": 90} and len(os.listdir("/proc/self/fd")) == fds - 1   # 0's closed
    monkeypatch.setattr(payload_segments, "fsync_dir", real_fsync_dir)
    at = loader.append(b"z" * 50)
    loader.sync()
    assert payloads.read(*at) == b"z" * 50 and payloads.sealed_segments() == {0: 90}
    loader.close()
