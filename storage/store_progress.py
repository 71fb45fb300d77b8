"""How far writer/store knows each log to be durable, and how far it has loaded it: the part of
the role (storage/store_process.py) that a `sync` query waits on, and that its lag is read from.

The loader reads no further than the writers say is durable: each `log.flushed` notice moves
that point, a writer that sent none for a while is asked (a notice can be lost), and a `sync`
query asks every writer where its log is durable now and is held until the loader has passed
it (read-your-writes).
"""
from __future__ import annotations

import asyncio
import time

from agentos import metrics
from broker.client import BusError
from broker.protocol import Kind, Message, ProtocolError
from broker.sharding import LOG_WRITER_PREFIX, log_writer
from storage import segment_listing

SYNC_TIMEOUT_SECS = 30.0
KNOWN_WRITER_SECS = 2.0    # how long a `sync` waits for a writer it has heard from before using its files


class LogProgress:
    """A mixin of `StoreService`. Needs its `config`, `bus`, `store`, `loop`, `loaded_notices`
    and the progress it keeps: `flushed`, `loaded`, `files_at_start`, `heard_at`,
    `writers_open`, `pending_flushes` and `waiters`."""

    def on_flushed(self, msg: Message) -> None:
        writer, position = msg.body["writer"], msg.body["position"]
        if msg.src != log_writer(writer):
            raise ProtocolError(f"{msg.src} reported the end of {log_writer(writer)}'s log")
        self.writers_open.add(writer)
        self.heard_at[writer] = time.monotonic()
        if position > self.flushed.get(writer, 0):
            self.flushed[writer] = position
            self.pending_flushes.append((writer, position, int(msg.body.get("count") or 0), time.monotonic()))
        self.store.wake.set()

    def _on_loaded(self, positions: dict[int, int]) -> None:
        self.loaded = positions
        self.loaded_notices.moved(loaded=True)
        while self.pending_flushes and self.pending_flushes[0][1] <= positions.get(self.pending_flushes[0][0], 0):
            writer, _, _, since = self.pending_flushes.popleft()
            metrics.event_db_write_wait.observe((time.monotonic() - since) * 1000.0)
        still = []
        for target, fut in self.waiters:
            if self._caught_up(target):
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((target, fut))
        self.waiters = still

    def _caught_up(self, target: dict[int, int]) -> bool:
        return all(self.loaded.get(w, 0) >= p for w, p in target.items())

    async def caught_up(self, target: dict[int, int]) -> None:
        if self._caught_up(target):
            return
        fut = self.loop.create_future()
        self.waiters.append((target, fut))
        self.store.wake.set()
        self.store.urgent.set()
        await asyncio.wait_for(fut, SYNC_TIMEOUT_SECS)

    async def learn_ends(self) -> None:
        """Ask each writer once where its log is durable (at start, once the bus is up), until it
        answers: a writer answers only once its log is open."""
        async def ask(writer: int) -> None:
            while writer not in self.writers_open:
                try:
                    self._durable(writer, await self._ask_end(writer, SYNC_TIMEOUT_SECS))
                except BusError:
                    await asyncio.sleep(1.0)
        await asyncio.gather(*(ask(w) for w in range(self.config.logs)))

    async def _ask_end(self, writer: int, timeout: float) -> int:
        """Where `writer` says its log is durable (its stats' `end`); it is heard from after this."""
        reply = await self.bus.request(log_writer(writer), Kind.STATS, {"only_end": True}, timeout=timeout)
        self.writers_open.add(writer)
        return int(reply.body.get("stats", {}).get("end") or 0)

    async def ask_quiet(self, writer: int) -> None:
        """Where a log that sent no notice for a while is durable (storage/store_notices.py)."""
        try:
            self._durable(writer, await self._ask_end(writer, KNOWN_WRITER_SECS))
        except (BusError, asyncio.TimeoutError, ValueError, TypeError):
            pass   # restarting, gone or a bad answer: asked again in a second

    def _durable(self, writer: int, end: int) -> None:
        if end > self.flushed.get(writer, 0):
            self.flushed[writer] = end
            self.store.wake.set()

    def on_peer_restarted(self, msg: Message) -> None:
        name = str(msg.body.get("name", ""))
        index = name.removeprefix(LOG_WRITER_PREFIX)
        if name.startswith(LOG_WRITER_PREFIX) and index.isdigit():
            self.writers_open.discard(int(index))
            self.loaded_notices.restarted(int(index))

    async def sync_target(self) -> dict[int, int]:
        """Where the logs are durable now, as each writer answers (not the files: they may hold a
        batch whose fdatasync has not returned, or failed): what a reader was acknowledged is
        there. Also moves the loader's limits, which the notices move only every few milliseconds.

        A writer answers only once its log is open, so one not heard from since it (or this
        process) started is waited for: before that its files may end short of what it is about
        to restore from the bucket. One heard from before that does not answer now (restarting
        after a crash) counts as far as its files go, as its restart will find them."""
        async def end_of(writer: int) -> int:
            known = writer in self.writers_open
            try:
                return await self._ask_end(writer, KNOWN_WRITER_SECS if known else SYNC_TIMEOUT_SECS)
            except (BusError, asyncio.TimeoutError):
                if not known:
                    raise
                ends = await self.loop.run_in_executor(None, self.store.log_ends)
                return ends.get(writer, 0)

        ends = await asyncio.gather(*(end_of(w) for w in range(self.config.logs)))
        for writer, end in enumerate(ends):
            self._durable(writer, end)
        return {w: self.flushed.get(w, 0) for w in range(self.config.logs)}

    def lag(self) -> tuple[int, float]:
        records = sum(c for _, _, c, _ in self.pending_flushes)
        oldest = self.pending_flushes[0][3] if self.pending_flushes else None
        return records, (time.monotonic() - oldest) if oldest is not None else 0.0

    def lag_bytes(self) -> int:
        return self.lag_ends()[0]

    def lag_ends(self) -> tuple[int, dict[int, int]]:
        """Bytes of the logs not loaded yet, and where each log was taken to end: where it is
        durable, where its files ended at this start (a restart's backlog), or where its newest
        segment begins. Notices lag: a store stopped for seconds told the logs an old count before
        it read them, and the logs took appends into the room it needed."""
        starts = {w: start for w in range(self.config.logs)
                  if (start := segment_listing.newest_start(self.store.wal_root / str(w))) is not None}
        ends = {w: max(self.flushed.get(w, 0), self.files_at_start.get(w, 0), starts.get(w, 0))
                for w in self.flushed.keys() | self.files_at_start.keys() | starts.keys()}
        return sum(max(end - self.loaded.get(w, 0), 0) for w, end in ends.items()), ends
