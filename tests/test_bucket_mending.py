"""A damaged record in a log mended with the bucket's copy (storage/bucket_mending.py), against a
real S3 endpoint (moto's server): the reader then reads every record, and where the bucket's copy
is missing or no better the log is left as it was and the reader passes over the damage."""
import asyncio
import logging
import threading
import types

import pytest

from agentos.config import S3Config
from log_frames import flip, frames
from storage import bucket_mending, records, segments
from storage.s3 import ObjectStore


def read_all(reader, limit):
    ids = []
    while batch := reader.read(1 << 20, limit):
        ids += [r[2] for r in batch]
    return ids


def shipped_log(directory, store):
    """Twenty records in segments of ten (two sealed, one being written), each one a batch object
    in the bucket as the shipper puts them."""
    data = frames(20)
    log = segments.SegmentLog(directory, segment_bytes=sum(map(len, data[:8])) + 10)
    at = 0
    for frame in data:
        end = log.write(frame, sync=True)
        store.put_batch(0, at, end, 1, frame)
        at = end
    log.close()
    return data, at


@pytest.fixture
def store(s3):
    return ObjectStore(S3Config(bucket=s3.new_bucket()), s3=s3.client())


def damage(directory, data, which):
    """Flip a byte inside record `which`; its position and segment."""
    position = sum(map(len, data[:which]))
    listing, at = segments.locate(directory, position)
    start, path = listing[at]
    flip(path, position - start + 12)
    return position, path


# 3: a record amid a sealed segment; 7: a sealed segment's last (zeros follow it); 17: the newest's
@pytest.mark.parametrize("which", [3, 7, 17])
def test_a_damaged_record_is_mended_and_every_record_reads_back(tmp_path, store, which):
    data, end = shipped_log(tmp_path, store)
    position, path = damage(tmp_path, data, which)
    damaged_bytes = path.read_bytes()
    asked = []

    def mend(at):
        asked.append(at)
        return bucket_mending.mend(tmp_path, store, 0, at, end)[0] > 0

    reader = segments.SegmentReader(tmp_path, 0, mend)
    assert read_all(reader, end) == [f"id-{i}".encode() for i in range(20)]
    assert asked == [position] and reader.mended == 1 and reader.damaged == 0
    kept = path.with_name(f"{path.name}.damaged-{position}").read_bytes()
    listing, at = segments.locate(tmp_path, position)
    offset = position - listing[at][0]
    assert kept.rstrip(b"\0") == damaged_bytes[offset:offset + len(data[which])].rstrip(b"\0")   # a zero tail too
    assert list(records.scan(path.read_bytes()))          # whole again, and nothing else written
    assert bucket_mending.mend(tmp_path, store, 0, position, end) == (0, bucket_mending.WHOLE)


def test_a_segment_the_bucket_holds_as_one_compacted_object_is_mended_too(tmp_path, store):
    """A compaction writes a sealed segment anew without some records, and puts it in the bucket
    as one object, shorter than the range it covers (the rest is zeros)."""
    data, end = shipped_log(tmp_path, store)
    (start, path), (nxt, _) = segments.list_segments(tmp_path)[:2]
    compacted = b"".join(data[:2] + data[3:8])       # id-2 dropped
    with open(path, "r+b") as f:
        f.write(compacted + bytes(nxt - start - len(compacted)))
    store.delete([b.key for b in store.batches(0) if b.end <= nxt])
    store.put_batch(0, start, nxt, 1, compacted)
    position = len(b"".join(data[:2] + data[3:5]))    # id-5, where it is now
    flip(path, position + 12)
    size, _ = bucket_mending.mend(tmp_path, store, 0, position, end)
    assert size == len(data[5])
    assert read_all(segments.SegmentReader(tmp_path, 0), end) == [f"id-{i}".encode() for i in range(20) if i != 2]


def test_damage_the_bucket_cannot_mend_is_left_as_it_is_and_passed_over(tmp_path, store, caplog):
    data, end = shipped_log(tmp_path, store)
    position, path = damage(tmp_path, data, 17)
    before = path.read_bytes()
    # not shipped yet: the bucket is not asked for what it does not hold
    size, why = bucket_mending.mend(tmp_path, store, 0, position, position)
    assert size == 0 and "holds up to" in why
    # the bucket's object is damaged too (or holds other bytes)
    (batch,) = [b for b in store.batches(0) if b.start == position]
    store.put_batch(0, batch.start, batch.end, 1, b"\x01" * (batch.end - batch.start))
    size, why = bucket_mending.mend(tmp_path, store, 0, position, end)
    assert size == 0 and "not whole records either" in why
    # a gap in the bucket
    store.delete([batch.key])
    size, why = bucket_mending.mend(tmp_path, store, 0, position, end)
    assert size == 0 and "does not hold all of" in why
    assert path.read_bytes() == before and not list(tmp_path.glob("*.damaged-*"))
    reader = segments.SegmentReader(tmp_path, 0, lambda at: bucket_mending.mend(tmp_path, store, 0, at, end)[0] > 0)
    with caplog.at_level("ERROR", logger="agent-os.storage"):
        assert read_all(reader, end) == [f"id-{i}".encode() for i in range(20) if i != 17]
    assert reader.damaged == 1 and reader.mended == 0 and "is damaged" in caplog.text


class FakeWriterBus:
    """A log writer's answers to `log.mend`, one per ask, in order (an exception: no answer)."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.asked = []

    async def request(self, dest, kind, body, timeout):
        self.asked.append((dest, kind.value, body))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return types.SimpleNamespace(body=answer)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_the_store_asks_again_while_the_writer_cannot_answer_and_passes_over_only_what_cannot_be_mended(
        loop, monkeypatch):
    monkeypatch.setattr(bucket_mending, "ANSWER_SECS", 30.0)
    stopping = threading.Event()
    log = logging.getLogger("test")
    bus = FakeWriterBus([asyncio.TimeoutError(), {"bytes": 0, "why": "S3 down", "retry": True}, {"bytes": 512}])
    assert bucket_mending.asker(bus, loop, log, stopping, 2)(1, 4096) is True
    assert bus.asked == [("writer/log/1", "log.mend", {"position": 4096})] * 3
    # an earlier ask mended it and its answer was lost: read on
    assert bucket_mending.asker(FakeWriterBus([{"bytes": 0, "whole": True}]), loop, log, stopping, 2)(1, 4096) is True
    # no bucket, or its copy no better: passed over
    assert bucket_mending.asker(FakeWriterBus([{"bytes": 0, "why": "no bucket"}]), loop, log, stopping, 2)(1, 4096) is False
    # a log no writer owns now (an earlier configuration's): not asked, passed over
    unasked = FakeWriterBus([])
    assert bucket_mending.asker(unasked, loop, log, stopping, 2)(2, 4096) is False and not unasked.asked
    # the bucket out of reach for longer than ANSWER_SECS: passed over
    monkeypatch.setattr(bucket_mending, "ANSWER_SECS", 0.0)
    bus = FakeWriterBus([{"bytes": 0, "why": "S3 down", "retry": True}])
    assert bucket_mending.asker(bus, loop, log, stopping, 2)(1, 4096) is False


def test_a_store_stopping_while_it_asks_leaves_the_damage_to_be_asked_about_after_its_restart(tmp_path, loop, store):
    data, end = shipped_log(tmp_path, store)
    position, _ = damage(tmp_path, data, 3)
    stopping = threading.Event()

    class Unanswered(FakeWriterBus):
        async def request(self, dest, kind, body, timeout):
            stopping.set()           # the store stops while the writer has not answered
            await asyncio.sleep(timeout)

    ask = bucket_mending.asker(Unanswered([]), loop, logging.getLogger("test"), stopping, 1)
    reader = segments.SegmentReader(tmp_path, 0, lambda at: ask(0, at))
    assert [r[2] for r in reader.read(1 << 20, end)] == [f"id-{i}".encode() for i in range(3)]
    assert reader.position == position and reader.damaged == 0 and not reader.mend_asked
    # after the restart the writer mends it
    reader = segments.SegmentReader(tmp_path, 0, lambda at: bucket_mending.mend(tmp_path, store, 0, at, end)[0] > 0)
    assert read_all(reader, end) == [f"id-{i}".encode() for i in range(20)]


def compacting_writer(directory, store, shipped):
    """What a compaction pass uses of a LogWriter, its helper's jobs run in this process."""
    from concurrent.futures import ThreadPoolExecutor
    from storage import segment_rewrites
    return types.SimpleNamespace(
        index=0, directory=directory, compaction_io=ThreadPoolExecutor(1), object_store=store,
        shipper=types.SimpleNamespace(shipped=shipped), rewriter=segment_rewrites.InProcess(),
        segment_edits=asyncio.Lock(), damage_said=set(), log=logging.getLogger("test.compaction"),
        config=types.SimpleNamespace(cluster=types.SimpleNamespace(epoch=1)))


@pytest.mark.parametrize("bucket", [True, False])
def test_a_rewrite_stopped_by_a_damaged_record_mends_it_from_the_bucket_or_says_so_once(tmp_path, store, caplog,
                                                                                        bucket):
    """Before, a compaction met a damaged record without a word: the segment kept every record
    the pass meant to drop (closed runs, expired access rows, closed sessions)."""
    from storage import compaction
    from storage.records import RecordKind
    data, end = shipped_log(tmp_path, store)
    position, path = damage(tmp_path, data, 3)
    (start, sealed_end, _), *_ = compaction.sealed_segments(tmp_path)
    writer = compacting_writer(tmp_path, store if bucket else None, end)

    async def rewrite():
        return await compaction.rewrite_segment(writer, start, sealed_end, path, {"kinds": [int(RecordKind.EVENT)]})

    with caplog.at_level("WARNING"):
        counts = [asyncio.run(rewrite()), asyncio.run(rewrite())]
    writer.compaction_io.shutdown()
    if bucket:
        assert counts == [8, 0] and "mended" in caplog.text       # every record of the segment dropped
        assert not list(records.scan(path.read_bytes()))
        assert [(b.start, b.end) for b in store.batches(0) if b.start < sealed_end] == [(start, sealed_end)]
    else:
        assert counts == [0, 0] and not (tmp_path / (path.name + ".compacting")).exists()
        assert caplog.text.count(f"has a damaged record at position {position}") == 1


def test_damage_the_bucket_does_not_hold_yet_is_asked_about_again_not_passed_over(tmp_path, store):
    """The shipper behind (the bucket out of reach for a while): the store is told to ask again."""
    data, end = shipped_log(tmp_path, store)
    position, path = damage(tmp_path, data, 17)
    writer = compacting_writer(tmp_path, store, shipped=position)
    writer.segments = types.SimpleNamespace(end=end)
    size, why = asyncio.run(bucket_mending.mend_held(writer, position))
    assert size == -1 and "for now" in why
    writer.shipper.shipped = end             # shipped since
    assert asyncio.run(bucket_mending.mend_held(writer, position))[0] == len(data[17])
    writer.compaction_io.shutdown()


@pytest.mark.parametrize("mends", [True, False])
def test_writer_store_loads_every_record_once_mended_and_passes_over_what_is_not(tmp_path, store, mends):
    from agentos import metrics
    from storage.store import Store
    wal = tmp_path / "wal" / "0"
    data, end = shipped_log(wal, store)
    position, _ = damage(wal, data, 3)
    projection = Store(tmp_path, writers=1, memory_limit_mb=64)
    asked = []

    def mend(writer, at):
        asked.append((writer, at))
        return mends and bucket_mending.mend(wal, store, writer, at, end)[0] > 0

    projection.mend = mend
    skipped = metrics.log_damaged.labels("skipped")._value.get()
    projection.open()
    try:
        while projection.load_once() or projection.backlog:
            pass
        assert asked == [(0, position)]
        assert projection.query("count", "")[0][0]["events"] == (20 if mends else 19)
        assert projection.stats["bad_records"] == (0 if mends else 1) and projection.loaded == {0: end}
        assert metrics.log_damaged.labels("skipped")._value.get() - skipped == (0 if mends else 1)
    finally:
        projection.close()


@pytest.mark.parametrize("which", [5, 7, 2])      # amid the segment, its last record, one the compaction dropped
def test_a_segment_the_bucket_holds_compacted_while_the_disk_does_not_yet_is_mended_by_its_records(
        tmp_path, store, which):
    """A compaction's install cut short between the bucket and the disk (a stop): the bucket holds
    the segment without a dropped record, the disk the whole old one. Found by
    `2026-12-05-mend-at-scale-fortythird/`: the copy at the same offsets is other records, so the
    damage was left. The records between the damage's whole neighbours are taken instead — or, if
    the compaction dropped the damaged one (id-2 here), there is nothing to mend."""
    data, end = shipped_log(tmp_path, store)
    (start, path), (nxt, _) = segments.list_segments(tmp_path)[:2]
    store.delete([b.key for b in store.batches(0) if b.end <= nxt])
    store.put_batch(0, start, nxt, 1, b"".join(data[:2] + data[3:8]))     # id-2 dropped, in the bucket only
    position, _ = damage(tmp_path, data, which)
    size, why = bucket_mending.mend(tmp_path, store, 0, position, end)
    if which == 2:
        assert size == 0 and "superseded checkpoints" in why
        return
    assert size == len(data[which])
    assert read_all(segments.SegmentReader(tmp_path, 0), end) == [f"id-{i}".encode() for i in range(20)]
