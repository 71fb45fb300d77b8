"""A log rebuilt on an empty disk from the bucket's batch objects (storage/bucket_restore.py),
against a real S3 endpoint (moto's server): whole objects land as they were; one read back
damaged is read again; one damaged in the bucket is written as it is, at its positions, and
named; the bucket going away part way is waited out and the restore goes on from where it got."""
import asyncio
import logging
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentos import metrics
from agentos.config import S3Config
from log_frames import frames
from storage import bucket_restore, log_cluster, segments
from storage.s3 import ObjectStore, S3Unavailable

IDS = [f"id-{i}".encode() for i in range(20)]


@pytest.fixture
def store(s3):
    return ObjectStore(S3Config(bucket=s3.new_bucket()), s3=s3.client())


def shipped(store, data, per_object=3):
    """The frames as batch objects of `per_object` records each, as the shipper puts them."""
    at = 0
    for i in range(0, len(data), per_object):
        body = b"".join(data[i:i + per_object])
        store.put_batch(0, at, at + len(body), 1, body)
        at += len(body)
    return at


def read_all(directory, limit):
    reader = segments.SegmentReader(directory, 0)
    ids = []
    while batch := reader.read(1 << 20, limit):
        ids += [r[2] for r in batch]
    return ids, reader.damaged


def restored(directory, store):
    log = segments.SegmentLog(directory, segment_bytes=1 << 20)
    try:
        bucket_restore.restore(log, store, store.chain(0), log.end)
        return log.end
    finally:
        log.close()


class Reads:
    """The store, with the bodies of some reads changed on their way (a list of functions per key)."""

    def __init__(self, store, **changes):
        self.store, self.changes, self.gets = store, changes, []

    def get(self, key, purpose="recovery"):
        self.gets.append(key)
        data = self.store.get(key, purpose)
        change = self.changes.get(key) and self.changes[key].pop(0)
        return change(data) if change else data

    def __getattr__(self, name):
        return getattr(self.store, name)


def flipped(at):
    return lambda data: data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def damaged_count():
    return metrics.log_damaged.labels("restored")._value.get()


@pytest.mark.parametrize("zeros", [False, True])
def test_whole_objects_and_a_compacted_segment_are_restored_as_they_were(tmp_path, store, caplog, zeros):
    data = frames(20)
    end = shipped(store, data)
    # a compaction's object for the first six records' range, id-2 dropped (and zeros to its end)
    span = sum(map(len, data[:6]))
    compacted = b"".join(data[:2] + data[3:6])
    store.put_batch(0, 0, span, 2, compacted + bytes(span - len(compacted) if zeros else 0))
    with caplog.at_level(logging.WARNING, "agent-os.storage"):
        assert restored(tmp_path, store) == end
    assert read_all(tmp_path, end) == ([i for i in IDS if i != b"id-2"], 0)
    assert not caplog.records


def test_an_object_read_back_damaged_is_read_again(tmp_path, store, caplog):
    data = frames(20)
    end = shipped(store, data)
    key = store.chain(0)[2].key
    reads = Reads(store, **{key: [flipped(150), flipped(40)]})
    before = damaged_count()
    with caplog.at_level(logging.WARNING, "agent-os.storage"):
        assert restored(tmp_path, reads) == end
    assert reads.gets.count(key) == 3
    assert read_all(tmp_path, end) == (IDS, 0)
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "at its read 3" in caplog.text
    assert damaged_count() == before


def test_an_object_damaged_in_the_bucket_is_written_as_it_is_and_named(tmp_path, store, caplog):
    data = frames(20)
    end = shipped(store, data)
    broken = store.chain(0)[3]                 # id-9, id-10, id-11: id-10 damaged
    body = store.get(broken.key)
    store.put_batch(0, broken.start, broken.end, 1, flipped(len(data[9]) + 20)(body))
    reads = Reads(store)
    before = damaged_count()
    with caplog.at_level(logging.WARNING, "agent-os.storage"):
        assert restored(tmp_path, reads) == end
    assert reads.gets.count(broken.key) == bucket_restore.GETS_PER_OBJECT
    assert read_all(tmp_path, end) == ([i for i in IDS if i != b"id-10"], 1)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.module == "bucket_restore"]
    assert len(errors) == 1 and broken.key in errors[0] and f"position {broken.start + len(data[9]):,}" in errors[0]
    assert damaged_count() == before + 1


def test_an_object_longer_than_its_range_keeps_the_log_at_its_positions(tmp_path, store, caplog):
    data = frames(20)
    end = shipped(store, data)
    first = store.chain(0)[0]
    store.put_batch(0, first.start, first.end, 1, store.get(first.key) + data[3])
    with caplog.at_level(logging.ERROR, "agent-os.storage"):
        assert restored(tmp_path, store) == end
    assert read_all(tmp_path, end) == (IDS, 0)
    assert "more than the" in caplog.text


def test_the_bucket_going_away_part_way_is_waited_out(tmp_path, store, caplog):
    """writer/log's side (storage/log_cluster.py): the restore goes on from the log's end."""
    data = frames(20)
    end = shipped(store, data)
    chain = store.chain(0)

    def away(_):
        raise S3Unavailable("GET: injected")

    reads = Reads(store, **{chain[4].key: [away]})
    directory = tmp_path / "log"
    directory.mkdir()
    log = segments.SegmentLog(directory, segment_bytes=1 << 20)
    writer = types.SimpleNamespace(io=ThreadPoolExecutor(1), segments=log, object_store=reads, index=0,
                                   log=logging.getLogger("agent-os.storage"))
    try:
        with caplog.at_level(logging.INFO, "agent-os.storage"):
            asyncio.run(_restore(writer, chain))
        assert log.end == end
    finally:
        log.close()
        writer.io.shutdown()
    assert read_all(directory, end) == (IDS, 0)
    assert reads.gets.count(chain[4].key) == 2
    assert all(reads.gets.count(batch.key) == 1 for batch in chain[:4])   # what was written stays
    assert [r.levelname for r in caplog.records] == ["ERROR", "INFO"]
    assert "unavailable while restoring log 0" in caplog.records[0].getMessage()
    assert f"restored {end} bytes of log 0 from the bucket ({len(chain)} objects)" in caplog.records[1].getMessage()


async def _restore(writer, chain):
    await log_cluster.ClusterSide._restore(writer, asyncio.get_running_loop(), chain)
