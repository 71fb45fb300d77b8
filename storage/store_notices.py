"""How a log writer tells writer/store where its log ends: `log.flushed` notices, coalesced.

One notice per batch would cost two bus hops and a loader wake per fsync, and the store loads in
big batches anyway; a `sync` query reads the log's end from the files. So a writer sends at most
one notice per `EVERY_SECS`, carrying the newest end and the records written since the last one.
"""
from __future__ import annotations

import asyncio
import time

from broker.client import Bus
from broker.protocol import Kind
from broker.sharding import STORE

EVERY_SECS = 0.01


class StoreNotices:
    def __init__(self, bus: Bus, writer_index: int) -> None:
        self.bus = bus
        self.index = writer_index
        self.pending: list[int] = [0, 0]            # (position, records) the store has not been told of
        self.timer: asyncio.TimerHandle | None = None
        self.sent_at = 0.0
        self.closed = False

    def written(self, end: int, count: int) -> None:
        self.pending = [end, self.pending[1] + count]
        if self.timer is not None or self.closed:
            return
        wait = self.sent_at + EVERY_SECS - time.monotonic()
        if wait <= 0:
            self._send()
        else:
            self.timer = asyncio.get_running_loop().call_later(wait, self._send)

    def _send(self) -> None:
        self.timer = None
        self.sent_at = time.monotonic()
        end, count = self.pending
        self.pending = [end, 0]
        self.bus.send(STORE, Kind.LOG_FLUSHED, {"writer": self.index, "position": end, "count": count})

    def close(self) -> None:
        """Send what is pending now and no more: the writer's bus is about to close, and a notice
        timer firing after it would find no bus (the store reads the log's end on its own)."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self._send()
