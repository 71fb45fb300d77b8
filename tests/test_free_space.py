"""The log's floor of free space (storage/free_space.py): appends stop a margin before the disk
is full, so writer/store and compaction keep the room to free it."""
import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from storage import free_space, segments
from storage.free_space import FreeSpaceFloor

BLOCK = 4096


class FakeDisk:
    def __init__(self, total: int, free: int) -> None:
        self.total, self.free, self.reads = total, free, 0
        self.now = 0.0

    def statvfs(self, _path):
        self.reads += 1
        return SimpleNamespace(f_frsize=BLOCK, f_blocks=self.total // BLOCK, f_bavail=self.free // BLOCK)

    def floor(self, setting: int, segment_bytes: int = 1 << 20, directory="unused") -> FreeSpaceFloor:
        return FreeSpaceFloor(directory, setting, segment_bytes, clock=lambda: self.now, statvfs=self.statvfs)


def refusal(floor, length) -> str:
    """Why `floor` refuses an append of `length` bytes ("" if it does not)."""
    try:
        floor.check(length)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC and "would be left free on the log's disk" in exc.strerror
        return exc.strerror
    return ""


def refused(floor, length) -> bool:
    return bool(refusal(floor, length))


def test_an_append_that_would_leave_less_than_the_margin_is_refused_as_a_full_disk():
    disk = FakeDisk(total=1 << 30, free=10 << 20)
    floor = disk.floor(8 << 20)
    assert not refused(floor, (2 << 20) - BLOCK)
    disk.now += 1
    assert refused(floor, 3 << 20)          # would leave 7 MiB
    disk.free = 20 << 20                     # compaction freed some: appends go on
    disk.now += 1
    assert not refused(floor, 3 << 20)


def test_after_a_refusal_the_next_append_reads_the_disk_again():
    """A refused append once left the slack of the reading before it: the appends of the next
    50 ms went on unread, into a disk that had no room."""
    disk = FakeDisk(total=1 << 30, free=100 << 20)
    floor = disk.floor(8 << 20)
    floor.check(4096)                        # lots of slack
    disk.free, disk.now = 8 << 20, free_space.CHECK_SECS
    assert refused(floor, 4096)
    disk.now += 0.001
    assert refused(floor, 100) and disk.reads == 3


def test_the_automatic_margin_is_two_segments_or_a_twentieth_of_a_small_volume():
    big = FakeDisk(total=100 << 30, free=1 << 30)
    floor = big.floor(free_space.AUTO, segment_bytes=64 << 20)
    floor.check(1)
    assert floor.margin == 128 << 20
    small = FakeDisk(total=12 << 20, free=4 << 20)
    floor = small.floor(free_space.AUTO, segment_bytes=64 << 20)
    floor.check(1)
    assert floor.margin == (12 << 20) // 20
    small.free, small.now = (12 << 20) // 20, 1.0
    assert refused(floor, 1)


def test_far_above_the_margin_free_space_is_read_now_and_then_near_it_at_every_append():
    disk = FakeDisk(total=1 << 30, free=100 << 20)
    floor = disk.floor(10 << 20)
    for _ in range(100):
        floor.check(4096)
    assert disk.reads == 1                   # 90 MiB above it: nothing to fear from 400 KB
    disk.now += free_space.CHECK_SECS        # …but others write to the disk too: read again in a while
    floor.check(4096)
    assert disk.reads == 2
    disk.free = (10 << 20) + (16 << 10)
    disk.now += free_space.CHECK_SECS
    for _ in range(3):
        floor.check(4096)
    assert disk.reads == 2 + 3               # 16 KiB above it: every append reads the disk again…
    assert refused(floor, 20 << 10)          # …and the one that would cross it is refused


def test_off_and_unknown_refuse_nothing():
    disk = FakeDisk(total=1 << 30, free=0)
    floor = disk.floor(0)
    assert not refused(floor, 1 << 20) and disk.reads == 0

    def broken(_path):
        raise OSError(errno.EIO, "no")
    floor = FreeSpaceFloor("unused", free_space.AUTO, 1 << 20, statvfs=broken)
    assert not refused(floor, 1 << 20)       # the write itself says if the disk is full


def test_a_log_refuses_an_append_below_its_floor_and_writes_nothing(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal", segment_bytes=1 << 20, min_free_bytes=1 << 60)
    path = tmp_path / "wal" / segments.segment_name(0)
    before = path.read_bytes()
    with pytest.raises(OSError) as err:
        log.write(b"x" * 100, sync=True)
    assert err.value.errno == errno.ENOSPC
    assert log.end == 0 and path.read_bytes() == before
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    roomy = segments.SegmentLog(tmp_path / "wal2", segment_bytes=1 << 20, min_free_bytes=max(free // 4, 1))
    assert roomy.write(b"x" * 100, sync=True) == 100
    log.close()
    roomy.close()


def test_a_spare_segment_zeroed_ahead_must_leave_the_margin_too():
    disk = FakeDisk(total=1 << 30, free=10 << 20)
    floor = disk.floor(8 << 20)
    assert floor.leaves_margin(2 << 20) and not floor.leaves_margin((2 << 20) + BLOCK)
    assert disk.floor(0).leaves_margin(1 << 40)


def test_on_the_stores_volume_room_is_kept_for_what_it_has_yet_to_load(tmp_path):
    """A store behind by most of a small disk had no room for its copies of the checkpoints it
    keeps when the log wrote down to the margin alone: the disk stayed full for good."""
    disk = FakeDisk(total=1 << 30, free=40 << 20)
    floor = disk.floor(8 << 20, directory=tmp_path / "wal")
    floor.count_store(tmp_path / "db")                  # not there yet: the volume it will be on
    floor.store_told(10 << 20)                          # 10 MiB of the logs not loaded, 40 MiB free
    assert not refused(floor, 1 << 20)                  # 11 MiB behind: 39 left >= 8 + 11
    disk.free, disk.now = 25 << 20, 1                   # the logs wrote 15 MiB the store has not heard of
    assert refused(floor, 1 << 20)                      # 26 behind: 24 < 8 + 26
    assert floor.leaves_margin(0) is False and "writer/store" in refusal(floor, 1 << 20)
    reads = disk.reads
    floor.store_told(0)                                 # it caught up (the disk read as it says so)…
    assert not refused(floor, 1 << 20) and disk.reads == reads + 2   # …and again at the next append
    assert floor.leaves_margin(1 << 20)


def test_what_the_log_wrote_past_where_the_store_counted_it_is_kept_too(tmp_path):
    """A store stopped for seconds told the logs an old count when it ran again, before it read
    the writers' notices: the log took appends into the room the store needed. The store says
    where it took the log to end; the log adds what it wrote past there."""
    disk = FakeDisk(total=1 << 30, free=40 << 20)
    floor = disk.floor(8 << 20, directory=tmp_path / "wal")
    floor.count_store(tmp_path / "db")
    floor.store_told(1 << 20, counted=5 << 20, end=40 << 20)   # 35 MiB it had not heard of
    assert refused(floor, 1 << 20)                      # 36 behind: 39 < 8 + 36
    floor.store_told(1 << 20, counted=40 << 20, end=40 << 20)
    assert not refused(floor, 1 << 20)
    floor.store_told(1 << 20, counted=45 << 20, end=40 << 20)   # past its end (a segment's start): no more
    assert not refused(floor, 1 << 20)


def test_a_store_on_another_volume_or_the_floor_off_keeps_no_room(tmp_path):
    disk = FakeDisk(total=1 << 30, free=30 << 20)
    floor = disk.floor(8 << 20, directory=tmp_path / "wal")
    floor.count_store(Path("/proc"))                    # another file system than the log's
    floor.store_told(1 << 30)
    assert not refused(floor, 1 << 20)
    off = disk.floor(0, directory=tmp_path / "wal")
    off.count_store(tmp_path / "db")
    off.store_told(1 << 30)
    assert not refused(off, 1 << 20) and off.leaves_margin(1 << 20)


def test_while_the_compaction_reserve_is_taken_its_room_is_kept_even_with_the_floor_off():
    disk = FakeDisk(total=1 << 30, free=1 << 20)
    floor = disk.floor(0)                               # to the last byte…
    floor.reserve(False, 256 << 10)                     # (a disk too small for a reserve: nothing kept)
    assert not refused(floor, (1 << 20) - BLOCK) and floor.leaves_margin(1 << 20)
    floor.reserve(True, 256 << 10)
    assert not refused(floor, (1 << 20) - BLOCK)
    floor.reserve(False, 256 << 10)                     # …until a pass (or writer/store) takes the reserve
    assert refused(floor, (1 << 20) - (128 << 10))
    assert not refused(floor, 512 << 10) and not floor.leaves_margin(1 << 20)
    floor.reserve(True, 256 << 10)                      # made again
    assert not refused(floor, (1 << 20) - BLOCK) and floor.leaves_margin(1 << 20)


def test_writer_stores_copies_leave_the_logs_margin_on_their_volume(tmp_path):
    """The store's copies of what it loads may take what it is behind, never the margin: that is
    compaction's room to rewrite a segment without the records the store has loaded."""
    disk = FakeDisk(total=1 << 30, free=10 << 20)

    def floor(setting, wal=tmp_path / "wal", statvfs=disk.statvfs):
        return free_space.LoadFloor(tmp_path / "db", wal, setting, 1 << 20, statvfs=statvfs)
    floor(8 << 20).check(2 << 20)
    with pytest.raises(OSError) as err:
        floor(8 << 20).check((2 << 20) + BLOCK)
    assert err.value.errno == errno.ENOSPC and "fewer than 8,388,608 bytes" in err.value.strerror
    floor(free_space.AUTO).check(8 << 20)                 # automatic: two segments here (2 MiB)
    with pytest.raises(OSError):
        floor(free_space.AUTO).check((8 << 20) + BLOCK)
    floor(8 << 20, wal=Path("/proc")).check(1 << 30)      # the logs on another volume: nothing to keep
    floor(0).check(1 << 40)                               # the floor off

    def broken(_path):
        raise OSError(errno.EIO, "no")
    floor(8 << 20, statvfs=broken).check(1 << 40)         # cannot tell: the write itself says
