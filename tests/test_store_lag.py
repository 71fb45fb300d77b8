"""writer/store's lag after a restart: what the log held before it started counts (real files, a
real loader thread, no bus)."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from agentos.config import from_dict
from broker.protocol import ProtocolError
from log_frames import frames
from storage import segments
from storage.store_process import StoreService


class _Notice:
    def __init__(self, writer: int, position: int) -> None:
        self.body = {"writer": writer, "position": position, "count": 0}
        self.src = f"writer/log/{writer}"


def test_a_restarted_store_reports_the_backlog_it_resumes_behind(tmp_path):
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=4096, preallocate=False)
    for i in range(0, 40, 4):
        log.write(frames(4, start=i, size=200), sync=True)      # written before the store starts
    end = log.end
    log.close()

    async def go():
        config = from_dict({"storage": {"dir": str(tmp_path)}})
        service = StoreService(config, f"ipc://{tmp_path}/no-broker.sock", logging.getLogger("test"))
        await service.start()
        try:
            # No writer has said where its log is durable: nothing loads, and the lag says why.
            await asyncio.sleep(0.2)
            assert service.lag_bytes() == end
            assert service.lag()[1] > 0.1
            forged = _Notice(0, end + 10**12)
            forged.src = "writer/log/1"
            with pytest.raises(ProtocolError):                   # a log's end said by another log's writer
                service.on_flushed(forged)
            service.on_flushed(_Notice(0, end))                  # writer/log/0 is back
            deadline = time.monotonic() + 10
            while service.lag_bytes() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert service.lag_bytes() == 0 and service.loaded[0] == end
            assert service.lag() == (0, 0.0)
        finally:
            await service.stop()
    asyncio.run(go())
