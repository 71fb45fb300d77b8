"""The log's compaction reserve (storage/compaction_reserve.py): room for one segment's rewrite,
made only where the disk has it twice over, and given to a rewrite the disk has no room for
(storage/compaction.py run_job). End to end, a disk the log filled freeing itself:
test_e2e_full_disk.py."""
import asyncio
import errno
import logging
import os
from types import SimpleNamespace

import pytest

from storage import compaction, compaction_reserve
from storage.compaction_helper import HelperFailed
from test_e2e_full_disk import tmpfs


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


class Rewriter:
    def __init__(self, failures):
        self.failures, self.jobs = failures, []

    def call(self, job):
        self.jobs.append(job)
        if self.failures:
            self.failures -= 1
            raise HelperFailed("OSError: [Errno 28] No space left on device", errno.ENOSPC)
        return {"count": 3}


def rewrite(directory, failures):
    writer = SimpleNamespace(index=0, compaction_io=None, rewriter=Rewriter(failures), directory=directory,
                             log=logging.getLogger("agent-os.test-reserve"))
    try:
        return asyncio.run(compaction.run_job(writer, {"op": "rewrite", "path": str(directory / "0.seg"),
                                                       "drop": {}})), writer.rewriter.jobs
    except HelperFailed as exc:
        return exc, writer.rewriter.jobs


def test_a_rewrite_the_disk_has_no_room_for_gets_the_reserve_once(tmp_path, caplog):
    assert compaction_reserve.keep(tmp_path, 4096)
    with caplog.at_level(logging.WARNING, "agent-os.test-reserve"):
        result, jobs = rewrite(tmp_path, 1)
    assert result == {"count": 3} and len(jobs) == 2
    assert not (tmp_path / compaction_reserve.NAME).exists()
    assert "compaction reserve (4,096 bytes) goes to the rewrite of 0.seg" in caplog.text
    # with the reserve spent, a full disk stops the rewrite (the pass says so: test_compaction_pass_failures.py)
    result, jobs = rewrite(tmp_path, 2)
    assert isinstance(result, HelperFailed) and len(jobs) == 1


def test_other_failures_do_not_take_the_reserve(tmp_path):
    assert compaction_reserve.keep(tmp_path, 4096)

    class Broken(Rewriter):
        def call(self, job):
            self.jobs.append(job)
            raise HelperFailed("KeyError: 'count'")

    writer = SimpleNamespace(index=0, compaction_io=None, rewriter=Broken(0), directory=tmp_path,
                             log=logging.getLogger("agent-os.test-reserve"))
    with pytest.raises(HelperFailed):
        asyncio.run(compaction.run_job(writer, {"op": "cut", "path": str(tmp_path / "0.seg")}))
    assert (tmp_path / compaction_reserve.NAME).exists() and len(writer.rewriter.jobs) == 1
