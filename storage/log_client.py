"""The sending side of the write-ahead log, used by every process that writes records.

Records appended within one event-loop iteration to the same writer travel as one
`log.append` message. ASYNC records alone linger up to `ASYNC_LINGER_SECS` so that they ride
the next SYNC append (an access row rides the next request's checkpoint) instead of costing a
message and an ack of their own. A SYNC append returns once its record is durable (the writer's ack);
an ASYNC one returns at once and the record waits in this process's outbox until acked. The
outbox is bounded: when it is full, appends wait for room — nothing durable is ever dropped.
A writer's refusal (a full disk) fails a SYNC record at once, so its caller can say so; an ASYNC
record, or a kept one (`append_kept`: sent at once and waited on, though nobody could be told of
its failure), is sent again until a writer takes it.
A message is re-sent with the same record ids until a writer acknowledges it (the writer
writes a re-sent record once), so a writer restart delays appends but loses none.

Appends go to each writer's direct inbox (storage/log_inbox.py) over a Unix socket of their
own (storage/log_link.py), not through the broker; over tcp they take the broker like
everything else. A process with a log of its own (the gateway, `storage.gateway_log`) appends
all its records there, by a call: they are the gateway's checkpoint PUTs and access rows, which
no other process's records of the same session need to be ordered with.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

from agentos import metrics
from agentos.log_repeats import Repeats
from agentos.running_time import wait_running
from broker.address import direct_log_endpoint
from broker.client import Bus, BusTimeout
from broker.protocol import Kind, Message
from broker.sharding import shard_of, writer_name
from storage import records
from storage.log_link import LogLink
from storage.log_writer import LocalAppend

if TYPE_CHECKING:
    from storage.log_writer import LogWriter

MAX_OUTSTANDING = 20_000
MAX_MESSAGE_BYTES = 4 << 20
ATTEMPT_SECS = 3.0
ASYNC_LINGER_SECS = 0.005
DRAIN_RETRY_SECS = 0.5   # while draining, refused ASYNC records go again at least this often


class LogWriteError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _LocalReply:
    """What an in-process writer answers, shaped like the reply message `acked` reads."""

    __slots__ = ("kind", "body")

    def __init__(self, kind: Kind, body: dict) -> None:
        self.kind, self.body = kind, body


class _Callback:
    """Waits on a SYNC record like the future `append` awaits, but calls back at once when the ack
    arrives: a caller without a task of its own (the gateway's fast path) answers in that same
    loop iteration instead of waking a task one iteration later."""

    __slots__ = ("fn", "log", "started", "finished")

    def __init__(self, fn: Callable[[int | None, BaseException | None], None], log: logging.Logger) -> None:
        self.fn, self.log, self.started, self.finished = fn, log, time.monotonic(), False

    def done(self) -> bool:
        return self.finished

    def set_result(self, position: int) -> None:
        metrics.observe(metrics.log_append_wait, (time.monotonic() - self.started) * 1000.0)
        self._call(position, None)

    def set_exception(self, error: BaseException) -> None:
        self._call(None, error)

    def _call(self, position: int | None, error: BaseException | None) -> None:
        self.finished = True
        try:   # called among the other waiters of a batch: one caller's bug must not keep them waiting
            self.fn(position, error)
        except Exception:
            self.log.exception("a log append's callback failed")


class _Kept(asyncio.Future):
    """The future of a record sent as ASYNC whose appender still waits for its ack: a writer's
    refusal sends it again, like any ASYNC record, instead of failing it."""


_Waiter = asyncio.Future | _Callback   # what a SYNC (or kept) record in the outbox is waited on by


class LogClient:
    def __init__(self, bus: Bus, writers: int, log: logging.Logger | None = None,
                 max_outstanding: int = MAX_OUTSTANDING, own_log: "LogWriter | None" = None) -> None:
        self.bus = bus
        self.writers = writers
        # A process with a log of its own (the gateway's) appends every record there, by a call.
        self.own_log = own_log
        self.log = log or bus.log
        self.max_outstanding = max_outstanding
        self.outstanding = 0
        self.room = asyncio.Event()
        self.room.set()
        self._prefix = f"{bus.name}:{bus.incarnation:x}:".encode()
        self._counter = 0
        self._batches: dict[str, list[tuple[list, _Waiter | None]]] = {}
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._links: dict[str, LogLink] = {}        # writer -> the connection to its inbox
        self.refusals = Repeats()   # a full disk refuses every batch: one line per 10 s, not per batch
        self._retries: dict[int, tuple[asyncio.TimerHandle, Callable[[], None]]] = {}   # refused ASYNC records
        self._retry_token = 0
        self.draining = 0   # drains under way (a shutdown's, closes')
        bus.restart_hooks.append(self._peer_restarted)

    def new_id(self) -> bytes:
        self._counter += 1
        return self._prefix + str(self._counter).encode()

    async def append(self, kind: records.RecordKind, body: dict, session: str, sync: bool = True) -> int | None:
        """Append one record; SYNC returns the log position once it is durable."""
        await self._room()
        fut = asyncio.get_running_loop().create_future() if sync else None
        self._enqueue(self._writer(session), [int(kind), self.new_id(), records.encode_body(body)], fut)
        if fut is None:
            return None
        started = time.monotonic()
        position = await fut
        metrics.observe(metrics.log_append_wait, (time.monotonic() - started) * 1000.0)
        return position

    async def append_kept(self, kind: records.RecordKind, body: dict, session: str) -> int:
        """Append one record that must not be lost to a full disk, though nobody can be told of a
        failure (a flow's journal record that its run goes on without waiting for): like an ASYNC
        one it is sent again until a writer takes it, and like a SYNC one it returns its position
        once durable, however late (a run's end waits for these)."""
        await self._room()
        fut = _Kept(loop=asyncio.get_running_loop())
        self._enqueue(self._writer(session), [int(kind), self.new_id(), records.encode_body(body)], fut)
        return await fut

    async def _room(self) -> None:
        while self.outstanding >= self.max_outstanding:
            self.room.clear()
            await self.room.wait()

    def append_then(self, kind: records.RecordKind, body: dict, session: str,
                    done: Callable[[int | None, BaseException | None], None]) -> None:
        """A SYNC append that calls `done(position, None)` once the record is durable, or `done(None,
        error)`. It does not wait for room in the outbox: its caller holds one request per client
        connection, so these are bounded by the connections."""
        self._enqueue(self._writer(session), [int(kind), self.new_id(), records.encode_body(body)],
                      _Callback(done, self.log))

    def append_nowait(self, kind: records.RecordKind, body: dict, session: str) -> None:
        """An ASYNC append for callers that cannot wait (it may go past the outbox bound)."""
        self._enqueue(self._writer(session), [int(kind), self.new_id(), records.encode_body(body)], None)

    def log_of(self, session: str) -> int:
        """The index of the log a session's records go to (the one whose positions `done` names)."""
        return self.own_log.index if self.own_log is not None else shard_of(session, self.writers)

    def _writer(self, session: str) -> str:
        return self.own_log.bus.name if self.own_log is not None else writer_name(session, self.writers)

    def _enqueue(self, writer: str, record: list, fut: _Waiter | None) -> None:
        self._batches.setdefault(writer, []).append((record, fut))
        self.outstanding += 1
        if self._flush_scheduled:
            return
        if fut is None:
            if self._linger is None:
                self._linger = asyncio.get_running_loop().call_later(ASYNC_LINGER_SECS, self._flush)
            return
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._flush_scheduled = True
        loop = self._loop
        if loop is None:   # looked up once: get_running_loop costs a getpid() per call on Linux
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        batches, self._batches = self._batches, {}
        for writer, items in batches.items():
            if self.own_log is not None and writer == self.own_log.bus.name:
                self._ship(writer, items)     # a call has no message limit: one batch, one fdatasync
                continue
            chunk: list = []
            size = 0
            for item in items:
                chunk.append(item)
                size += len(item[0][2]) + 64
                if size >= MAX_MESSAGE_BYTES:
                    self._ship(writer, chunk)
                    chunk, size = [], 0
            if chunk:
                self._ship(writer, chunk)

    def _ship(self, writer: str, items: list[tuple[list, _Waiter | None]], backoff: float = 0.5) -> None:
        """Until acknowledged: SYNC records fail fast on a writer error, ASYNC ones wait and retry.
        Callbacks rather than a task: the message leaves in this loop iteration and the records'
        futures resolve in the one its ack arrives in (a task costs one iteration each way)."""
        def acked(reply: Message | None, error: BaseException | None) -> None:
            if isinstance(error, BusTimeout):
                self.log.warning("%s has not acknowledged %d records yet (%s); still trying", writer, len(items), error)
                self._ship(writer, items, backoff)   # the same record ids: the writer keeps one copy
                return
            if error is None and reply.kind is not Kind.ERROR:
                position = reply.body["position"]
                for _, fut in items:
                    if fut is not None and not fut.done():
                        fut.set_result(position)
                self._release(len(items))
                return
            if error is None:
                error = LogWriteError(reply.body["code"], reply.body["message"])
            refused = isinstance(error, LogWriteError)
            rest = []
            for item in items:
                fut = item[1]
                if refused and (fut is None or type(fut) is _Kept):
                    rest.append(item)
                elif fut is not None and not fut.done():
                    fut.set_exception(error)
            self._release(len(items) - len(rest))
            if rest:
                more = self.refusals.due()
                if more is not None:
                    self.log.warning("%s refused %d ASYNC records (%s); retrying in %.1fs%s", writer, len(rest),
                                     error, backoff, more)
                self._retry_later(writer, rest, backoff)

        body = {"records": [record for record, _ in items], "sync": any(fut is not None for _, fut in items)}
        if self.own_log is not None and writer == self.own_log.bus.name:
            self.own_log.on_append(LocalAppend(body, lambda kind, reply: acked(_LocalReply(kind, reply), None),
                                               sum(1 for _, fut in items if fut is not None)))
            return
        self._link(writer).request_callback(writer, Kind.LOG_APPEND, body, acked, timeout=30.0, attempt_secs=ATTEMPT_SECS)

    def _link(self, writer: str) -> Bus:
        link = self._links.get(writer)
        if link is None:
            endpoint = direct_log_endpoint(self.bus.endpoint, int(writer.rpartition("/")[2]))
            if endpoint is None:
                return self.bus
            link = LogLink(self.bus.name, writer, endpoint, self.log)
            link.open()
            self._links[writer] = link
        return link

    def _peer_restarted(self, name: str) -> None:
        """A writer came back: send what waits for its ack again now, not after the attempt timeout."""
        link = self._links.get(name)
        if link is not None:
            link.resend_to(name)

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()
        self._links.clear()

    def _retry_later(self, writer: str, items: list[tuple[list, _Waiter | None]], backoff: float) -> None:
        """Refused ASYNC records go again after `backoff` (doubling to 10 s) — at once if a drain
        begins meanwhile: a shutdown waits 5 s at most, and they must not miss it in their sleep."""
        token = self._retry_token = self._retry_token + 1
        if self.draining:
            backoff = min(backoff, DRAIN_RETRY_SECS)

        def again() -> None:
            del self._retries[token]
            self._ship(writer, items, min(backoff * 2, 10.0))

        self._retries[token] = (asyncio.get_running_loop().call_later(backoff, again), again)

    def _release(self, count: int) -> None:
        self.outstanding -= count
        self.room.set()

    async def drain(self, timeout: float) -> bool:
        """Wait until every record in the outbox is acknowledged (a clean shutdown, a session's
        close), for at most `timeout` seconds of this process's running time (a stall meanwhile
        does not use it up: agentos/running_time.py)."""
        self.draining += 1
        for handle, again in list(self._retries.values()):
            handle.cancel()
            again()
        try:
            await wait_running(lambda: not (self.outstanding or self._batches), timeout)
        finally:
            # a close's drain is over: refused records back off as before (they went again
            # every half second for the rest of the actor's life, hammering a full disk)
            self.draining -= 1
        return not self.outstanding
