"""A compaction pass stopped by the world (a full disk, the bucket out of reach, writer/store not
answering) says so in a WARNING and the next pass tries again; anything else is an ERROR with its
traceback. Each came as "compaction pass failed" and a traceback, every pass, for as long as the
trouble lasted (seen in chaos runs with the bucket going away and with writer/store stalled:
bench/results/2026-12-05-chaos-bucket-outages-fortyfourth/ and
…-chaos-stalls-broker-store-fortyfourth/). The loop runs here with a fake pass; a real rewrite on
a full disk is in test_compaction_helper.py."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from types import SimpleNamespace

import pytest

from broker.requests import BusTimeout
from storage import compaction
from storage.compaction_helper import HelperFailed
from storage.free_space import FreeSpaceFloor
from storage.s3 import S3Unavailable


def passes_failing_with(monkeypatch, tmp_path, failure: Exception) -> int:
    calls = []

    async def failing(writer):
        calls.append(1)
        raise failure

    monkeypatch.setattr(compaction, "compact_once", failing)
    writer = SimpleNamespace(config=SimpleNamespace(storage=SimpleNamespace(compaction_interval_secs=0.01, min_free_bytes=0)),
                             log=logging.getLogger("agent-os.test-compaction"), compaction_io=None,
                             directory=tmp_path, segment_bytes=1 << 60, index=0,    # no room for a reserve:
                             segments=SimpleNamespace(floor=FreeSpaceFloor(tmp_path, 0, 1 << 60)))
    # a full disk's pass then fails once and says so (a reserve's use is test_compaction_reserve.py's)

    async def run():
        # until the second pass has failed, not for a fixed time: beside a busy suite 0.3 s saw one
        task = asyncio.ensure_future(compaction.compaction_loop(writer))
        try:
            for _ in range(1000):   # 10 s at most
                if len(calls) >= 2 or task.done():
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(run())
    return len(calls)


@pytest.mark.parametrize("failure, said", [
    (S3Unavailable("PUT wal/001/x.log: connection refused"), "the bucket is out of reach"),
    (HelperFailed("OSError: [Errno 28] No space left on device", errno.ENOSPC), "no room on the disk"),
    (OSError(errno.ENOSPC, "No space left on device"), "no room on the disk"),
    (BusTimeout("store.query to writer/store: writer/store: unknown within 30s"), "writer/store did not answer"),
])
def test_a_pass_stopped_by_the_disk_or_the_bucket_warns_and_the_next_tries_again(monkeypatch, tmp_path, caplog,
                                                                                   failure, said):
    with caplog.at_level(logging.INFO, logger="agent-os.test-compaction"):
        passes = passes_failing_with(monkeypatch, tmp_path, failure)
    assert passes >= 2
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * passes
    assert all(said in r.getMessage() and r.exc_info is None for r in caplog.records)


def test_any_other_failure_of_a_pass_is_an_error_with_its_traceback(monkeypatch, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="agent-os.test-compaction"):
        passes = passes_failing_with(monkeypatch, tmp_path, HelperFailed("KeyError: 'count'"))
    assert passes >= 2
    assert all(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
