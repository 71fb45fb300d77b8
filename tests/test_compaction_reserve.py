"""The log's compaction reserve (storage/compaction_reserve.py): room for one segment's rewrite,
made only where the disk has it twice over, and given to a rewrite the disk has no room for
(storage/compaction.py `_pass_with_reserve`). End to end, a disk the log filled freeing itself:
test_e2e_full_disk.py."""
import asyncio
import errno
import logging
import os
from types import SimpleNamespace

import pytest

from storage import compaction, compaction_reserve
from storage.free_space import FreeSpaceFloor
from disk_filling import tmpfs

NO_FLOOR = SimpleNamespace(storage=SimpleNamespace(min_free_bytes=0))


def test_the_reserve_is_made_where_the_disk_has_room_for_it_twice(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        assert not compaction_reserve.keep(disk, 600 << 10)        # 1.2 MiB: no
        assert not list(disk.iterdir())
        assert compaction_reserve.keep(disk, 256 << 10)
        reserve = disk / compaction_reserve.NAME
        assert reserve.stat().st_size == 256 << 10
        assert os.statvfs(disk).f_bfree * os.statvfs(disk).f_frsize <= (768 << 10)   # allocated, not a hole
        assert compaction_reserve.keep(disk, 256 << 10)            # kept as it is
        assert compaction_reserve.release(disk) == 256 << 10
        assert compaction_reserve.release(disk) == 0 and not reserve.exists()


def test_the_reserve_leaves_the_logs_floor_of_free_space(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        assert not compaction_reserve.keep(disk, 256 << 10, min_free_bytes=600 << 10)   # 512 KiB + 600: no
        assert not list(disk.iterdir())
        assert compaction_reserve.keep(disk, 256 << 10, min_free_bytes=256 << 10)
        assert (disk / compaction_reserve.NAME).stat().st_size == 256 << 10


def fake_writer(directory, floor=None):
    return SimpleNamespace(index=0, compaction_io=None, directory=directory, segment_bytes=4096, config=NO_FLOOR,
                           log=logging.getLogger("agent-os.test-reserve"),
                           segments=SimpleNamespace(floor=floor or FreeSpaceFloor(directory, 0, 4096)))


def passes(monkeypatch, directory, failures, floor=None):
    """One compaction pass (compaction._pass_with_reserve) whose first `failures` runs of
    compact_once fail for want of room; (how it ended, how many runs there were)."""
    runs = []

    async def compact_once(writer):
        runs.append(1)
        if len(runs) <= failures:
            raise OSError(errno.ENOSPC, "No space left on device")
        return 3

    monkeypatch.setattr(compaction, "compact_once", compact_once)
    writer = fake_writer(directory, floor)
    try:
        asyncio.run(compaction._pass_with_reserve(writer))
        return None, len(runs)
    except OSError as exc:
        return exc, len(runs)


def test_a_pass_the_disk_has_no_room_for_gets_the_reserve_and_runs_again(monkeypatch, tmp_path, caplog):
    """Not only a segment's rewrite: a pass once went on failing at the file of its mark (a few
    bytes), its rewrites all done, and never took the reserve."""
    floor = FreeSpaceFloor(tmp_path, 0, 4096)       # the floor off: appends to the last byte…
    with caplog.at_level(logging.WARNING, "agent-os.test-reserve"):
        assert passes(monkeypatch, tmp_path, 1, floor) == (None, 2)      # the reserve is made at its start
    assert not (tmp_path / compaction_reserve.NAME).exists()
    assert "the log's compaction reserve (4,096 bytes) goes to it, and it runs again" in caplog.text
    # …but not into the room the pass took: the writes still arriving took it, and every pass
    # after had no room for a rewrite (under load, the disk of a test stayed full for good)
    assert floor.reserve_missing == 4096
    # the next pass makes it again (the disk has room), and with it spent, a full disk stops the pass
    failed, runs = passes(monkeypatch, tmp_path, 2, floor)
    assert isinstance(failed, OSError) and runs == 2 and not (tmp_path / compaction_reserve.NAME).exists()
    assert passes(monkeypatch, tmp_path, 0, floor) == (None, 1) and (tmp_path / compaction_reserve.NAME).exists()
    assert floor.reserve_missing == 0                # made again: the appends have the room back


def test_a_reserve_writer_store_took_keeps_its_room_until_it_is_made_again(monkeypatch, tmp_path):
    log_dir = tmp_path / "0"
    log_dir.mkdir()
    floor = FreeSpaceFloor(log_dir, 0, 4096)
    assert passes(monkeypatch, log_dir, 0, floor) == (None, 1) and floor.reserve_missing == 0
    assert compaction_reserve.release_to_store(tmp_path, tmp_path, OSError(errno.ENOSPC, "full"),
                                               logging.getLogger("agent-os.test-reserve")) == 4096
    monkeypatch.setattr(compaction_reserve, "keep", lambda *args: False)     # no room to make it again
    passes(monkeypatch, log_dir, 0, floor)
    assert floor.reserve_missing == 4096


def test_other_failures_do_not_take_the_reserve(monkeypatch, tmp_path):
    async def broken(writer):
        raise KeyError("count")

    monkeypatch.setattr(compaction, "compact_once", broken)
    writer = fake_writer(tmp_path)
    with pytest.raises(KeyError):
        asyncio.run(compaction._pass_with_reserve(writer))
    assert (tmp_path / compaction_reserve.NAME).exists()


def test_a_store_that_cannot_load_for_want_of_room_gets_every_logs_reserve(tmp_path, caplog):
    """Compaction drops only what writer/store has loaded: a store stuck on a full disk kept every
    pass from dropping anything, and so from ever failing for room and taking a reserve itself."""
    for name in ("0", "1"):
        (tmp_path / name).mkdir()
        assert compaction_reserve.keep(tmp_path / name, 4096)
    log = logging.getLogger("agent-os.test-reserve")
    assert compaction_reserve.release_to_store(tmp_path, tmp_path, MemoryError("out of memory"), log) == 0
    assert all((tmp_path / name / compaction_reserve.NAME).exists() for name in ("0", "1"))
    with caplog.at_level(logging.WARNING, "agent-os.test-reserve"):
        full = OSError(errno.ENOSPC, "No space left on device")
        with tmpfs(tmp_path / "elsewhere", "1m") as elsewhere:     # another disk than the logs'
            assert compaction_reserve.release_to_store(tmp_path, elsewhere, full, log) == 0
        assert compaction_reserve.release_to_store(tmp_path, tmp_path, full, log) == 8192
    assert not list(tmp_path.glob("*/" + compaction_reserve.NAME))
    assert "the logs' compaction reserves (8,192 bytes) go to it" in caplog.text
