"""A log's spare segments (storage/spares.py): zeroed ahead, kept up to their count while the log
is idle, taken by rotations without zeroing in between, cleaned up when stale or given up."""
from __future__ import annotations

import errno
import threading
import time

import pytest

from log_frames import frames
from storage import segments, spares

SEGMENT = 4096


def _ready(directory) -> list[str]:
    return sorted(p.name for p in directory.glob("spare*.zero") if p.stat().st_size == SEGMENT)


def _fill(log: segments.SegmentLog) -> None:
    """Idle until every spare is zeroed (the one under way, if any, first)."""
    log.spares.wait()
    while log.refill():
        log.spares.wait()


def test_an_idle_log_zeroes_spares_up_to_their_count_and_rotations_take_them(tmp_path, monkeypatch):
    log = segments.SegmentLog(tmp_path, SEGMENT, spares=3)
    assert _ready(tmp_path) == []                        # nothing zeroed at start
    assert not log.refill()                              # nor while no segment has filled
    first = frames(40, start=100, size=300)
    while log.rotations == 0:                            # the first segment fills: the log is busy
        log.write(first.pop(0), sync=True)
    written = 40 - len(first)
    _fill(log)
    assert _ready(tmp_path) == ["spare.1.zero", "spare.2.zero", "spare.zero"]
    assert not log.refill()                              # full: nothing more to zero

    zeroed = []
    real = spares.zero_file
    monkeypatch.setattr(spares, "zero_file", lambda *args: zeroed.append(args[0]) or real(*args))
    for frame in frames(20, size=300):                   # about two segments of records
        log.write(frame, sync=True)
    assert log.rotations == 3
    assert zeroed == []                                  # the burst took spares; nothing was zeroed during it
    assert len(_ready(tmp_path)) == 1
    ids = [r[2] for r in segments.SegmentReader(tmp_path, 0).read(1 << 20)]
    assert ids == [f"id-{i}".encode() for i in range(100, 100 + written)] + [f"id-{i}".encode() for i in range(20)]
    _fill(log)                                           # idle again: back to three
    assert len(_ready(tmp_path)) == 3
    log.close()


def test_with_one_spare_the_next_is_zeroed_at_half_as_before(tmp_path):
    log = segments.SegmentLog(tmp_path, SEGMENT, spares=1)
    for frame in frames(8, size=300):
        log.write(frame, sync=True)
    log.spares.wait()
    assert _ready(tmp_path) == ["spare.zero"]
    log.close()


def test_stale_spares_go_at_open(tmp_path):
    (tmp_path / spares.ZEROING).write_bytes(bytes(100))            # a crash while zeroing
    (tmp_path / "spare.5.zero").write_bytes(bytes(SEGMENT))         # the count was higher before
    (tmp_path / "spare.1.zero").write_bytes(bytes(SEGMENT // 2))    # another segment size before
    log = segments.SegmentLog(tmp_path, SEGMENT, spares=2)
    assert not (tmp_path / spares.ZEROING).exists()
    assert not (tmp_path / "spare.5.zero").exists()
    assert log.spares.ready() is None and not (tmp_path / "spare.1.zero").exists()
    log.close()
    (tmp_path / "spare.zero").write_bytes(bytes(SEGMENT))
    plain = segments.SegmentLog(tmp_path, SEGMENT, preallocate=False, spares=4)
    assert list(tmp_path.glob("spare*")) == []                      # not zeroing: no spare kept
    assert not plain.refill()
    plain.close()


def test_closing_gives_up_a_spare_being_zeroed(tmp_path):
    cancel = threading.Event()
    cancel.set()
    assert spares.zero_file(tmp_path / "f", 8 << 20, cancel) is False
    big = 256 << 20
    log = segments.SegmentLog(tmp_path, big, spares=2)
    log.rotations = 1                                    # as if a segment had filled
    assert log.refill()
    time.sleep(0.05)
    started = time.monotonic()
    log.close()
    assert time.monotonic() - started < 5.0
    assert not (tmp_path / spares.ZEROING).exists()
    assert _ready(tmp_path) == []


def test_each_zeroing_is_counted_by_when_it_happened(tmp_path):
    from prometheus_client import REGISTRY

    def counts() -> dict[str, float]:
        return {when: REGISTRY.get_sample_value("agentos_log_segments_zeroed_total", {"when": when}) or 0.0
                for when in ("at_open", "ahead", "idle", "at_rotation")}

    before = counts()
    log = segments.SegmentLog(tmp_path / "log", SEGMENT, spares=2)   # a new log: its first segment
    for frame in frames(8, size=300):                                # past half: the next one, ahead
        log.write(frame, sync=True)
    log.spares.wait()
    while log.rotations == 0:                                        # the rotation takes it: no zeroing
        log.write(frames(1, size=300)[0], sync=True)
    _fill(log)                                                       # idle: both spares again
    log.close()
    other = tmp_path / "other"
    other.mkdir()
    spares.Spares(other, SEGMENT, 1).take(other / "next.seg")        # none ready: zeroed while waited for
    after = counts()
    assert {when: after[when] - before[when] for when in after} == {"at_open": 1, "ahead": 1, "idle": 2,
                                                                    "at_rotation": 1}


def test_a_long_burst_that_took_the_last_spare_has_the_next_zeroed_at_once(tmp_path):
    """Not from half-way through the new segment: a burst longer than the spares would otherwise
    wait for a zeroing at nearly every rotation. A short burst leaves it to the idle gap after it."""
    log = segments.SegmentLog(tmp_path, SEGMENT, spares=2)
    while log.rotations == 0:
        log.write(frames(1, size=300)[0], sync=True)
    _fill(log)
    assert _ready(tmp_path) == ["spare.1.zero", "spare.zero"]
    while log.rotations < 3:                             # a short burst takes both
        log.write(frames(1, size=300)[0], sync=True)
    assert log.size * 2 < SEGMENT and not log.spares.zeroing() and _ready(tmp_path) == []
    _fill(log)
    log.busy_since -= segments.LONG_BURST_SECS           # as if writing without a gap that long
    while log.rotations < 5:                             # a long burst takes both
        log.write(frames(1, size=300)[0], sync=True)
    assert log.size * 2 < SEGMENT                        # just begun
    log.spares.wait()
    assert len(_ready(tmp_path)) == 1                    # the next is zeroed already
    log.close()


def test_a_gap_between_writes_begins_a_new_burst(tmp_path):
    log = segments.SegmentLog(tmp_path, SEGMENT, spares=1)
    log.write(frames(1, size=300)[0], sync=True)
    began = log.busy_since
    log.write(frames(1, size=300)[0], sync=True)
    assert log.busy_since == began                       # no gap: the same burst
    log.last_write_at -= segments.IDLE_SECS              # as if idle that long since
    log.write(frames(1, size=300)[0], sync=True)
    assert log.busy_since > began and log.busy_since == log.last_write_at
    log.close()


def test_an_idle_zeroing_is_held_while_the_log_is_busy_until_its_spare_is_needed(tmp_path):
    busy = threading.Event()
    busy.set()
    pool = spares.Spares(tmp_path, 4 << 20, 2)
    assert pool.refill(busy.is_set)
    time.sleep(0.3)
    assert pool.zeroing() and not (tmp_path / spares.ZEROING).stat().st_size   # held before its first chunk
    busy.clear()                                         # idle again: it goes on
    deadline = time.monotonic() + 20
    while pool.zeroing():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert pool.ready() is not None
    busy.set()
    assert pool.refill(busy.is_set)                      # the second spare, held again…
    time.sleep(0.1)
    assert pool.zeroing()
    assert pool.zero_next() is False                     # …until a rotation wants it: no longer held
    pool.thread.join(20)
    assert not pool.zeroing() and len([p for p in pool.paths if p.exists()]) == 2
    pool.close()


def test_closing_gives_up_a_held_zeroing(tmp_path):
    pool = spares.Spares(tmp_path, 4 << 20, 2)
    assert pool.refill(lambda: True)
    time.sleep(0.05)
    pool.close()
    assert not pool.zeroing() and not (tmp_path / spares.ZEROING).exists()


def test_a_rotation_takes_a_held_spare_once_it_is_whole(tmp_path):
    pool = spares.Spares(tmp_path, 4 << 20, 2)
    assert pool.refill(lambda: True)                     # busy for good: held until needed
    time.sleep(0.05)
    rotation = threading.Thread(target=pool.take, args=(tmp_path / "next.seg",))
    rotation.start()
    rotation.join(20)
    assert not rotation.is_alive(), "a rotation waited on a zeroing that stayed held"
    assert (tmp_path / "next.seg").read_bytes() == bytes(4 << 20)
    pool.close()


def test_no_spare_is_zeroed_below_the_logs_floor_of_free_space(tmp_path):
    """A zeroed spare takes a segment of disk: at the log's floor (storage/free_space.py) that is
    the room writer/store and compaction need to free the disk."""
    room = [False]
    spare = spares.Spares(tmp_path, SEGMENT, 2, room=lambda length: room[0] and length == SEGMENT)
    assert not spare.refill()                            # idle: nothing zeroed, nothing said
    with pytest.raises(OSError) as err:                  # a rotation: appends go to a plain file
        spare.take(tmp_path / "next.seg")
    assert err.value.errno == errno.ENOSPC and not (tmp_path / "next.seg").exists()
    assert spare.zero_next("ahead")                      # half-way through a segment: given up
    spare.wait()
    assert _ready(tmp_path) == [] and not spare.partial.exists()
    room[0] = True                                       # compaction freed the disk
    assert spare.refill()
    spare.wait()
    assert len(_ready(tmp_path)) == 1
