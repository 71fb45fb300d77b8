"""The segment listing is read from the disk once per change of its directory, and never misses one."""
from __future__ import annotations

import os
import time
import types

import pytest

from storage import records, segment_listing, segments
from storage.records import RecordKind
from storage.segment_listing import list_segments, segment_name, segments_from


@pytest.fixture
def scans(monkeypatch):
    """How many times a directory was read from the disk."""
    count = [0]
    real = segment_listing.scan

    def counted(*args):
        count[0] += 1
        return real(*args)
    monkeypatch.setattr(segment_listing, "scan", counted)
    return count


def make(directory, *positions):
    for position in positions:
        (directory / segment_name(position)).write_bytes(b"")


def age(directory, secs=3600):
    """As if the directory last changed `secs` ago (a listing of it can then be kept)."""
    then = time.time() - secs
    os.utime(directory, (then, then))


def test_an_unchanged_directory_is_listed_once(tmp_path, scans):
    make(tmp_path, 0, 100, 250)
    age(tmp_path)
    first = list_segments(tmp_path)
    assert [start for start, _ in first] == [0, 100, 250]
    assert first[1][1] == tmp_path / segment_name(100)
    for _ in range(5):
        assert list_segments(tmp_path) == first
    assert scans[0] == 1


def test_a_segment_created_after_a_kept_listing_is_seen(tmp_path, scans):
    make(tmp_path, 0)
    age(tmp_path)
    assert [s for s, _ in list_segments(tmp_path)] == [0]
    make(tmp_path, 40)                     # the directory's time moves on
    assert [s for s, _ in list_segments(tmp_path)] == [0, 40]
    (tmp_path / segment_name(0)).unlink()
    assert [s for s, _ in list_segments(tmp_path)] == [40]
    assert scans[0] == 3


def test_a_listing_in_the_same_clock_tick_as_a_change_is_not_kept(tmp_path, scans, monkeypatch):
    # Created, listed and created again within milliseconds: the second file may carry the
    # directory's old time, so the first listing must not be trusted.
    make(tmp_path, 0)
    stamp = os.stat(tmp_path).st_mtime_ns
    # the listing 1 ms after the change, however long this machine stalls between the two
    monkeypatch.setattr(segment_listing, "time", types.SimpleNamespace(time_ns=lambda: stamp + 1_000_000))
    assert [s for s, _ in list_segments(tmp_path)] == [0]
    make(tmp_path, 7)
    os.utime(tmp_path, ns=(stamp, stamp))   # stamped with the same (coarse) time as the first
    assert [s for s, _ in list_segments(tmp_path)] == [0, 7]
    assert scans[0] == 2


def test_whole_second_times_get_a_wider_margin(tmp_path, scans, monkeypatch):
    # A filesystem with times in whole seconds: a listing 1.5 s after such a time is racy.
    make(tmp_path, 0)
    whole = int(time.time()) - 1
    monkeypatch.setattr(segment_listing, "time", types.SimpleNamespace(time_ns=lambda: whole * 10**9 + 1_500_000_000))
    os.utime(tmp_path, ns=(whole * 10**9, whole * 10**9))
    list_segments(tmp_path)
    list_segments(tmp_path)
    assert scans[0] == 2
    os.utime(tmp_path, ns=((whole - 10) * 10**9, (whole - 10) * 10**9))
    list_segments(tmp_path)
    list_segments(tmp_path)
    assert scans[0] == 3


def test_what_is_not_a_segment_is_left_out(tmp_path):
    make(tmp_path, 5)
    (tmp_path / "spare.zero").write_bytes(b"")
    (tmp_path / "compacted").write_text("5")
    (tmp_path / "x.seg").write_bytes(b"")
    assert [s for s, _ in list_segments(tmp_path)] == [5]
    assert list_segments(tmp_path / "missing") == []
    assert segments_from(tmp_path / "missing", 3) == []


def test_segments_from_a_position(tmp_path):
    make(tmp_path, 0, 100, 250)
    age(tmp_path)

    def starts(position):
        return [s for s, _ in segments_from(tmp_path, position)]
    assert starts(0) == [0, 100, 250]
    assert starts(99) == [0, 100, 250]
    assert starts(100) == [100, 250]
    assert starts(180) == [100, 250]
    assert starts(10**12) == [250]
    (tmp_path / segment_name(0)).unlink()
    assert starts(0) == [100, 250]         # a position before the first segment: all of them


def test_a_reader_follows_rotations_it_did_not_list(tmp_path):
    """The store's reader, with its listing kept between reads, still reaches every record a
    writer appends across rotations, and a position read from disk again from the start."""
    frames = [records.frame(RecordKind.EVENT, f"r{i}".encode(), b"x" * 300) for i in range(40)]
    log = segments.SegmentLog(tmp_path, segment_bytes=1000, preallocate=False)
    reader = segments.SegmentReader(tmp_path, 0)
    seen = []
    for i in range(0, 40, 4):
        age(tmp_path)                      # each rotation below happens long after the last listing
        end = log.write(frames[i:i + 4], sync=True)
        while reader.position < end:
            got = reader.read(1 << 20, limit=end)
            seen += [rid for _, _, rid, _, _ in got]
            if not got:
                break
    assert seen == [f"r{i}".encode() for i in range(40)]
    assert len(list_segments(tmp_path)) >= 10
    again = segments.SegmentReader(tmp_path, 0)
    everything = []
    while got := again.read(1 << 20):
        everything += got
    assert [rid for _, _, rid, _, _ in everything] == seen
    assert segments.log_end(tmp_path) == log.end == segments.log_end(tmp_path, everything[-5][0])
    log.close()


def test_the_sealed_segments_follow_the_listing(tmp_path):
    make(tmp_path, 0, 100, 250)
    age(tmp_path)
    assert segment_listing.sealed(tmp_path) == [(0, 100, tmp_path / segment_name(0)),
                                                (100, 250, tmp_path / segment_name(100))]
    assert segment_listing.sealed(tmp_path) == segment_listing.sealed(tmp_path)
    make(tmp_path, 400)                               # the segment at 250 is sealed now
    assert [(s, e) for s, e, _ in segment_listing.sealed(tmp_path)] == [(0, 100), (100, 250), (250, 400)]
    assert segment_listing.sealed(tmp_path / "missing") == []
