"""The write-ahead log on disk: frames, segments, the reader, in-process (no bus). Its DuckDB
projection: tests/test_store_load.py."""
import os

import pytest

from log_frames import flip, frames, torn
from storage import records, segments, spares
from storage.records import RecordKind, TornRecord


def test_frame_round_trip_and_corruption_is_detected():
    f = records.frame(RecordKind.BLOB, b"rid", b"body")
    assert records.parse(f, 0) == (RecordKind.BLOB, b"rid", b"body", len(f))
    for broken in (f[:-1], f[:5], f[:8] + b"\x09" + f[9:], b"\xff" * 20):
        with pytest.raises(TornRecord):
            records.parse(broken, 0)
    assert [r[2] for r in records.scan(f + f + f[:-3])] == [b"rid", b"rid"]


def test_a_record_the_log_could_not_read_back_is_never_framed(monkeypatch):
    """A record over MAX_RECORD_BYTES reads back as torn: written, it would end its log there."""
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 1000)
    whole = records.frame(RecordKind.FLOW, b"ok", b"x" * (1000 - 4))
    assert records.parse(whole, 0)[2] == b"x" * 996
    with pytest.raises(ValueError, match="over the log's limit"):
        records.frame(RecordKind.FLOW, b"no", b"x" * 997)


def test_a_list_of_frames_lands_as_if_joined_however_many_buffers_it_takes(tmp_path, monkeypatch):
    data = frames(12)
    lists = segments.SegmentLog(tmp_path / "lists", segment_bytes=1 << 20)
    joined = segments.SegmentLog(tmp_path / "joined", segment_bytes=1 << 20)
    monkeypatch.setattr(segments, "IOV_MAX", 4)   # more frames than one pwritev takes: joined instead
    for chunk in (data[:3], data[3:4], [], data[4:12]):
        assert lists.write(list(chunk), sync=True) == joined.write(b"".join(chunk), sync=True)
    lists.close()
    joined.close()
    ((_, a),), ((_, b),) = segments.list_segments(tmp_path / "lists"), segments.list_segments(tmp_path / "joined")
    assert a.read_bytes() == b.read_bytes()
    assert [rid for _, _, rid, _, _ in records.scan(a.read_bytes())] == [f"id-{i}".encode() for i in range(12)]


def test_a_reader_given_a_limit_returns_no_record_that_ends_past_it(tmp_path):
    data = frames(12, size=300)
    log = segments.SegmentLog(tmp_path, segment_bytes=6 * len(data[0]) + 50)
    for i in range(0, 12, 3):
        log.write(data[i:i + 3], sync=True)          # two segments of six
    log.close()
    ends = [sum(map(len, data[:i + 1])) for i in range(6)] + \
           [segments.list_segments(tmp_path)[1][0] + sum(map(len, data[6:i + 1])) for i in range(6, 12)]
    reader = segments.SegmentReader(tmp_path, 0)
    assert [r[2] for r in reader.read(1 << 20, limit=ends[1] + 10)] == [b"id-0", b"id-1"]   # id-2 half inside
    assert reader.position == ends[1] and reader.read(1 << 20, limit=ends[1] + 10) == []
    assert [r[2] for r in reader.read(10, limit=ends[3])] == [b"id-2"]    # past its budget, not its limit
    got = []
    while batch := reader.read(1 << 20, limit=ends[7]):
        got += [r[2] for r in batch]
    assert got == [b"id-3", b"id-4", b"id-5", b"id-6", b"id-7"]            # on into the next segment
    assert [r[2] for r in reader.read(1 << 20)] == [f"id-{i}".encode() for i in range(8, 12)]


def test_one_read_goes_on_across_small_segments_until_its_budget_is_used(tmp_path):
    """A store catching up over many small (or compacted) segments gets a full batch per read,
    not one segment's records (after a short read it waits a batch interval)."""
    data = frames(60, size=300)
    log = segments.SegmentLog(tmp_path, segment_bytes=2 * len(data[0]) + 10, preallocate=False)
    for i in range(0, 60, 2):
        log.write(data[i:i + 2], sync=True)           # thirty segments of two records
    assert len(segments.list_segments(tmp_path)) == 30
    ids = [f"id-{i}".encode() for i in range(60)]
    reader = segments.SegmentReader(tmp_path, 0)
    got = reader.read(25 * len(data[0]))             # about 25 records' worth: into the thirteenth segment
    assert [r[2] for r in got] == ids[:len(got)] and 24 <= len(got) <= 26
    assert reader.position == got[-1][4]
    ends = {r[2]: r[4] for r in segments.SegmentReader(tmp_path, 0).read(1 << 20)}
    assert len(ends) == 60                            # one read, the whole log
    more = reader.read(1 << 20, limit=ends[b"id-44"])  # a limit in a later segment: up to it
    assert [r[2] for r in more] == ids[len(got):45]
    assert reader.read(1 << 20, limit=ends[b"id-44"]) == []
    assert [r[2] for r in reader.read(1 << 20)] == ids[45:]
    log.close()


def sized(size: int) -> bytes:
    """A record `size` bytes long in all."""
    return records.frame(RecordKind.EVENT, b"", b"x" * (size - 10))


@pytest.mark.parametrize("preallocate", [False, True])
def test_a_read_whose_first_look_ends_on_a_records_end_reads_on(tmp_path, preallocate):
    """A reader's first look at a segment is FIRST_READ bytes. When a record ended exactly there,
    that was taken for the end of the data: a sealed segment's remaining records were skipped
    (never loaded into DuckDB), and `log_end` fell short of the newest segment's end."""
    lead = [sized(1024) for _ in range(segments.FIRST_READ // 1024)]   # ends exactly at FIRST_READ
    tail = [sized(700) for _ in range(40)]
    sealed_bytes = sum(map(len, lead + tail))
    log = segments.SegmentLog(tmp_path, segment_bytes=sealed_bytes + 100, preallocate=preallocate)
    log.write(lead + tail, sync=True)
    log.write(lead + tail, sync=True)                  # a second segment: the first is sealed
    assert len(segments.list_segments(tmp_path)) == 2
    got = segments.SegmentReader(tmp_path, 0).read(8 << 20)
    assert len(got) == 2 * (len(lead) + len(tail)) and got[-1][4] == log.end
    assert segments.log_end(tmp_path) == log.end == segments.log_end(tmp_path, sealed_bytes)
    log.close()


def test_records_a_reader_returned_stay_whole_when_it_reads_again_into_the_same_buffer(tmp_path):
    log = segments.SegmentLog(tmp_path, segment_bytes=1 << 20)
    data = frames(20, size=3000)
    log.write(b"".join(data), sync=True)
    log.close()
    reader = segments.SegmentReader(tmp_path, 0)
    first = reader.read(4 * len(data[0]))       # a few records, then the rest over the same buffer
    rest = reader.read(1 << 20)
    assert reader.buffer and len(first) + len(rest) == 20
    assert [(rid, body) for _, _, rid, body, _ in first + rest] == [records.parse(f, 0)[1:3] for f in data]
    assert all(type(body) is bytes for _, _, _, body, _ in first)


def test_segments_rotate_and_a_torn_tail_is_cleared_on_open(tmp_path):
    log = segments.SegmentLog(tmp_path, segment_bytes=2000)
    data = frames(40)
    for i in range(0, 40, 4):
        log.write(b"".join(data[i:i + 4]), sync=True)
    end = log.end
    log.close()
    segs = segments.list_segments(tmp_path)
    assert len(segs) > 3 and segs[0][0] == 0
    assert all(path.stat().st_size == 2000 for _, path in segs)     # pre-zeroed, whatever they hold
    # A write torn half-way through its last record: its last sector never reached the disk.
    last = segs[-1][1]
    at = end - segs[-1][0] - len(data[-1])
    big = frames(1, start=39, size=700)[0]      # the last record again, over two sectors
    with open(last, "r+b") as f:
        f.seek(at)
        f.write(torn(big, at))
    reopened = segments.SegmentLog(tmp_path, segment_bytes=2000)
    assert reopened.recovery.truncated_bytes == len(torn(big, at).rstrip(b"\0"))
    assert reopened.end == end - len(data[-1])
    reopened.write(data[-1], sync=True)
    reopened.close()
    read = segments.SegmentReader(tmp_path, 0).read(1 << 20)
    ids = []
    reader = segments.SegmentReader(tmp_path, 0)
    while True:
        batch = reader.read(1 << 20)
        if not batch:
            break
        ids += [r[2] for r in batch]
    assert ids == [f"id-{i}".encode() for i in range(40)]
    assert read and read[0][0] == 0


def _read_all(reader, limit=None):
    ids = []
    while batch := reader.read(1 << 20, limit):
        ids += [r[2] for r in batch]
    return ids + [r[2] for r in reader.read(1 << 20, limit)]


@pytest.mark.parametrize("where", ["sealed", "last"])
def test_a_reader_passes_a_damaged_record_and_says_so(tmp_path, caplog, where):
    """A flipped byte in data known whole: before, a sealed segment's records after it were never
    read and the last segment's reader stopped there for good, both without a word."""
    data = frames(20)
    log = segments.SegmentLog(tmp_path, segment_bytes=sum(map(len, data[:10])) + 10)
    for d in data:
        log.write(d, sync=True)
    end = log.end
    log.close()
    segs = segments.list_segments(tmp_path)
    damaged = 4 if where == "sealed" else 13
    start, path = segs[0] if where == "sealed" else segs[-1]
    flip(path, sum(map(len, data[:damaged])) - start + 12)
    reader = segments.SegmentReader(tmp_path, 0)
    with caplog.at_level("ERROR", logger="agent-os.storage"):
        ids = _read_all(reader, end)
    assert ids == [f"id-{i}".encode() for i in range(20) if i != damaged]
    assert reader.damaged == 1 and reader.position == end
    assert segments.recent_ids(tmp_path, 1 << 20) == ids      # a restarted writer's de-duplication too
    assert f"the record at position {sum(map(len, data[:damaged]))} is damaged" in caplog.text


def reopened_after_a_flip(directory, caplog, which):
    """Ten records in a segment, a byte of record `which` flipped, the log opened again: (the
    frames, the damaged record's position, the file its bytes were kept in, the open's log)."""
    data = frames(10)
    log = segments.SegmentLog(directory, segment_bytes=1 << 20)
    log.write(data, sync=True)
    log.close()
    path = segments.list_segments(directory)[0][1]
    at = sum(map(len, data[:which]))
    flip(path, at + 12)
    with caplog.at_level("WARNING", logger="agent-os.storage"):
        reopened = segments.SegmentLog(directory, segment_bytes=1 << 20)
    reopened.close()
    assert reopened.end == at
    return data, at, path.with_name(f"{path.name}.damaged-{at}")


def test_recovery_keeps_the_bytes_it_clears_when_whole_records_follow(tmp_path, caplog):
    data, at, kept = reopened_after_a_flip(tmp_path, caplog, 6)
    assert records.parse(kept.read_bytes(), len(data[6]))[1] == b"id-7"   # the records after it, whole
    assert len(kept.read_bytes()) == sum(map(len, data[6:])) and "kept in" in caplog.text
    # a torn write (the first sectors of the last record, then zeros) keeps nothing
    path = segments.list_segments(tmp_path)[0][1]
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(torn(frames(1, start=6, size=700)[0], at))
    caplog.clear()
    with caplog.at_level("WARNING", logger="agent-os.storage"):
        segments.SegmentLog(tmp_path, segment_bytes=1 << 20).close()
    assert sorted(p.name for p in tmp_path.iterdir() if "damaged" in p.name) == [kept.name]
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "a torn tail" in caplog.text


def test_recovery_keeps_a_last_record_that_is_all_there_but_damaged(tmp_path, caplog):
    """Nothing after it, so it looked like a write torn by a crash and went with a WARNING; but a
    torn write leaves a sector of its record zeros, and this one has every sector: it was written
    whole, and may have been acknowledged before its byte flipped."""
    data, _, kept = reopened_after_a_flip(tmp_path, caplog, 9)
    assert len(kept.read_bytes()) == len(data[9])
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
    assert "is all on the disk" in caplog.records[0].getMessage() and "the damaged tail" in caplog.text


def test_zeroed_segments_end_at_their_last_whole_record(tmp_path):
    log = segments.SegmentLog(tmp_path, segment_bytes=1500)
    data = frames(30)
    assert not (tmp_path / spares.SPARE).exists()                 # nothing zeroed ahead at start
    for i in range(0, 30, 3):
        log.write(b"".join(data[i:i + 3]), sync=True)
    assert log.size * 2 >= 1500                                      # past half: the next one is zeroed ahead
    log.spares.wait()
    assert (tmp_path / spares.SPARE).stat().st_size == 1500
    assert segments.log_end(tmp_path) == log.end
    assert segments.log_end(tmp_path, hint=log.end - len(data[-1])) == log.end
    assert segments.log_end(tmp_path, hint=log.end) == log.end
    # Shipping a range that spans sealed segments carries their records, never their zero tails.
    assert log.read_range(0, log.end) == b"".join(data)
    log.close()


def test_without_zeroing_segments_hold_their_records_and_recover_a_torn_tail(tmp_path):
    """storage.zero_segments: false — plain appends, no spare, and a leftover spare goes."""
    (tmp_path / spares.SPARE).write_bytes(bytes(1500))           # zeroed under the other setting
    log = segments.SegmentLog(tmp_path, segment_bytes=1500, preallocate=False)
    assert not (tmp_path / spares.SPARE).exists()
    data = frames(30)
    for i in range(0, 30, 3):
        log.write(b"".join(data[i:i + 3]), sync=True)
    assert not (tmp_path / spares.SPARE).exists()                 # past half, nothing zeroed ahead
    segs = segments.list_segments(tmp_path)
    assert len(segs) > 2
    assert sum(path.stat().st_size for _, path in segs) == log.end == sum(map(len, data))   # no zero tails
    log.close()
    last = segs[-1][1]
    os.truncate(last, last.stat().st_size - 7)                      # the last record torn
    reopened = segments.SegmentLog(tmp_path, segment_bytes=1500, preallocate=False)
    assert reopened.recovery.end == log.end - len(data[-1])
    reopened.write(b"".join(frames(1, start=30)), sync=True)
    reopened.close()
    got = []
    reader = segments.SegmentReader(tmp_path, 0)
    while batch := reader.read(1 << 20):
        got += [r[2] for r in batch]
    assert got == [f"id-{i}".encode() for i in [*range(29), 30]]


def test_reader_resumes_mid_log_and_clamps_after_a_truncation(tmp_path):
    log = segments.SegmentLog(tmp_path, segment_bytes=1 << 20)
    data = frames(10)
    log.write(b"".join(data), sync=True)
    middle = sum(len(f) for f in data[:5])
    assert [r[2] for r in segments.SegmentReader(tmp_path, middle).read(1 << 20)] == \
        [f"id-{i}".encode() for i in range(5, 10)]
    os.truncate(segments.list_segments(tmp_path)[-1][1], log.end)   # an old, unzeroed segment
    reader = segments.SegmentReader(tmp_path, log.end + 500)   # beyond the end: a truncated tail
    assert reader.read(1 << 20) == [] and reader.position == log.end
    log.write(b"".join(frames(2, start=10)), sync=True)
    assert [r[2] for r in reader.read(1 << 20)] == [b"id-10", b"id-11"]
    log.close()


def test_recent_ids_for_deduplication(tmp_path):
    log = segments.SegmentLog(tmp_path, segment_bytes=1500)
    for f in frames(20):
        log.write(f, sync=False)
    log.close()
    assert segments.recent_ids(tmp_path, 1 << 20)[-3:] == [b"id-17", b"id-18", b"id-19"]
