"""The notices between the logs and writer/store, coalesced: `log.flushed` and `log.loaded`.

A log writer tells the store where its log ends (`log.flushed`). One notice per batch would cost
two bus hops and a loader wake per fsync, and the store loads in big batches anyway; a `sync`
query reads the log's end from the files. So a writer sends at most one notice per `EVERY_SECS`,
carrying the newest end and the records written since the last one.

The store tells each log how many bytes of the logs it has yet to load (`log.loaded`), and where
it took that log to end: a log on the store's disk keeps room for that and for what it wrote
past there (storage/free_space.py). The store counts a log at least to its newest segment's
start, whatever notices it has read: a store that was stopped or starved reads them late. At
most one round per `LOADED_EVERY_SECS`: the log adds what the disk lost since on its own. Each load is told (what the
disk lost before it is in the store's count now); with nothing loaded, what a log was told already
is told again only after `RETELL_SECS`, or at once after it restarted (it knows nothing).

A `log.flushed` notice can be lost: the broker bounces what is sent to a peer it has not heard
from for `broker.peer_timeout_secs` (a store stopped or starved that long), and one that dies
drops what it held. A log that then goes quiet sends no other, and the store loaded no further
than the lost notice's end for good: on a disk the logs share with it, they kept the room for
what it would not load and refused every append (by hand: the store had heard of 509 bytes
of the 5.6 MB written). So the store asks a log it has not heard from for `ASK_QUIET_SECS`
where it ends.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from broker.client import Bus
from broker.protocol import Kind
from broker.sharding import STORE, log_writer

EVERY_SECS = 0.01
LOADED_EVERY_SECS = 0.1
RETELL_SECS = 5.0
ASK_QUIET_SECS = 1.0


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


class LoadedNotices:
    """writer/store's side: `moved(loaded=True)` whenever it has loaded more, `moved()` now and
    then; `behind()` gives the bytes of the logs it has yet to load and where it took each log to
    end (a log adds what it wrote past that: `counted`), `open_logs()` the logs to tell."""

    def __init__(self, bus: Bus, behind: Callable[[], tuple[int, dict[int, int]]],
                 open_logs: Callable[[], set[int]]) -> None:
        self.bus, self.behind, self.open_logs = bus, behind, open_logs
        self.timer: asyncio.TimerHandle | None = None
        self.sent_at = float("-inf")
        self.told: dict[int, tuple[int, float]] = {}   # log -> what it was told last, and when
        self.loaded = False   # loaded more since the last round: every log is told
        self.closed = False

    def moved(self, loaded: bool = False) -> None:
        self.loaded |= loaded
        if self.timer is None and not self.closed:
            wait = self.sent_at + LOADED_EVERY_SECS - time.monotonic()
            self.timer = asyncio.get_running_loop().call_later(max(wait, 0.0), self._send)

    def _send(self) -> None:
        self.timer = None
        self.sent_at = time.monotonic()
        (behind, ends), loaded, self.loaded = self.behind(), self.loaded, False
        for index in sorted(self.open_logs()):
            last, at = self.told.get(index, (None, float("-inf")))
            if loaded or behind != last or self.sent_at - at >= RETELL_SECS:
                self.told[index] = (behind, self.sent_at)
                self.bus.send(log_writer(index), Kind.LOG_LOADED, {"behind": behind, "counted": ends.get(index, 0)})

    def restarted(self, index: int) -> None:
        self.told.pop(index, None)
        self.moved()

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def ask_quiet_logs(logs: int, heard_at: dict[int, float], ask: Callable[[int], Awaitable[None]]) -> None:
    """writer/store's side, forever: every ASK_QUIET_SECS, `ask(log)` (where it ends) of each of
    the `logs` not heard from (`heard_at`, by `time.monotonic`) for as long. A log that writes
    sends a notice every few milliseconds and is not asked; a quiet one is, once a second."""
    while True:
        await asyncio.sleep(ASK_QUIET_SECS)
        now = time.monotonic()
        quiet = [w for w in range(logs) if now - heard_at.get(w, float("-inf")) >= ASK_QUIET_SECS]
        await asyncio.gather(*(ask(w) for w in quiet))
