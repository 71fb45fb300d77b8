"""The bus client: the only way a process talks to the bus.

One DEALER socket to the broker, driven from the asyncio loop. It is a plain (sync) zmq socket
whose file descriptor the loop watches, drained until empty on every wake-up: zmq.asyncio costs
about 35 µs per round trip at each end, this costs a few.

What it gives a process:
- `send()` fire-and-forget, `reply()` to a request, and `request()` that waits with a deadline
  and re-sends the same message id on timeout or when the broker says the destination is
  unknown or dead (it may be restarting).
- Receiver-side de-duplication of requests (protocol.REQUESTS): a re-sent request whose reply
  went out gets the same reply again; one still being handled is dropped. So a retry never
  runs a request twice.
- Heartbeats to the broker, which keep this peer in its table of live peers.
- Batching: envelopes for one destination sent within one event-loop iteration leave as one
  frame (`ctl.batch`), so under load a process pays one send, the broker one route and the
  receiver one receive for many messages. At low load a batch is a single envelope.
- Handlers from an explicit table {Kind: callable}; a coroutine handler runs as a task, a plain
  one inline. Malformed messages are counted and logged once, never raised.
- On an ipc bus, big bodies through this process's ring in shared memory, only a small envelope
  through the broker (broker/spill.py); `spill_bytes` sizes the ring, 0 turns it off.
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import random
import time
from typing import Any, Awaitable, Callable, Mapping

import zmq

from broker import codec, frames, spill
from broker.address import BusAddress
from broker.protocol import BROKER, READS, REQUESTS, SENDERS, Kind, Message, ProtocolError, sent_by_its_role
from broker.replies import PENDING, RERUN, Replies
from broker.requests import Attempts, AttemptTimeout, BusError, BusTimeout, Undeliverable

__all__ = ["Bus", "BusError", "BusTimeout", "Undeliverable", "Handler"]

Handler = Callable[[Message], "Awaitable[None] | None"]

_DRAIN_BATCH = 500
POKE_SECS = 1.0


class Bus:
    def __init__(self, name: str, endpoint: "str | BusAddress", handlers: Mapping[Kind, Handler] | None = None, *,
                 role: str | None = None, heartbeat_secs: float = 1.0,
                 log: logging.Logger | None = None, spill_bytes: int = spill.RING_BYTES) -> None:
        self.name = name
        self.role = role or name.split("/")[0]
        self.endpoint = endpoint
        self.heartbeat_secs = heartbeat_secs
        self.incarnation = random.getrandbits(31) | 1
        self.identity = f"{name}#{self.incarnation:x}".encode()
        self.log = log or logging.getLogger(f"agent-os.{name}")
        self._handlers: dict[Kind, Handler] = {}
        self._async: set[Kind] = set()
        for kind, handler in (handlers or {}).items():
            self.on(kind, handler)
        self._counter = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._pending_dest: dict[int, str] = {}
        self._replies = Replies()
        self._outbox: collections.deque[bytes] = collections.deque()
        self._out: dict[str, list[bytes]] = {}
        self._out_scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self._sock: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_scheduled = False
        self._logged_bad: set[str] = set()
        self.sent = 0
        self.received = 0
        self.malformed = 0
        self.retries = 0
        self.handler_errors = 0
        self.restart_hooks: list[Callable[[str], None]] = []   # told of each peer the broker saw restart
        self._spill = spill.Spiller(endpoint.endpoint if isinstance(endpoint, BusAddress) else endpoint,
                                    spill_bytes, self.log)
        self._big_queued = False
        self._reported = None   # metrics.Totals, at the first heartbeat

    def on(self, kind: Kind, handler: Handler) -> None:
        self._handlers[kind] = handler
        if inspect.iscoroutinefunction(handler):
            self._async.add(kind)
        else:
            self._async.discard(kind)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.open()

    def open(self) -> None:
        """`start` for callers that cannot await (it does not block)."""
        self._loop = asyncio.get_running_loop()
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, self.identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.RECONNECT_IVL, 20)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        if isinstance(self.endpoint, BusAddress):
            self.endpoint.secure_client(sock)
            sock.connect(self.endpoint.endpoint)
        else:
            sock.connect(self.endpoint)
        self._sock = sock
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._drain)
        self.send(BROKER, Kind.HELLO, {"role": self.role, "pid": os.getpid()})
        self.spawn(self._heartbeat())
        self.spawn(self._poke())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(BusError("bus closed"))
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.getsockopt(zmq.FD))
            self._sock.close(0)
            self._sock = None
        self._spill.close()

    def spawn(self, coro: Awaitable) -> asyncio.Task:
        """Run `coro` in the background, held until it ends (the loop keeps only weak references
        to tasks) and its exception logged."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.handler_errors += 1
            self.log.error("handler failed", exc_info=task.exception())

    async def _heartbeat(self) -> None:
        body = {"role": self.role, "pid": os.getpid()}
        while True:
            await asyncio.sleep(self.heartbeat_secs)
            self.send(BROKER, Kind.HEARTBEAT, body)
            self._replies.expire(time.monotonic())
            self._spill.forget_gone()
            self._report_counts()

    async def _poke(self) -> None:
        # zmq's descriptor is edge-triggered and a send may consume the edge. Every send here
        # drains after it (`_flush_out`), so this slow drain is only a backstop. At 20 Hz it was
        # most of an idle tree's CPU (bench/results/2026-11-30-startup-idle-*: 7.9% -> 2.1%).
        while True:
            await asyncio.sleep(POKE_SECS)
            self._drain()

    # -- sending -------------------------------------------------------------------------

    def new_id(self) -> int:
        self._counter += 1
        return (self.incarnation << 32) | (self._counter & 0xFFFFFFFF)

    def send(self, dest: str, kind: Kind, body: dict[str, Any], *, session: str = "", turn: str = "",
             reply_to: int = 0, id: int | None = None) -> int:
        msg_id = self.new_id() if id is None else id
        self._send_envelope(dest, codec.encode(dest, kind, body, id=msg_id, reply_to=reply_to,
                                                  session=session, turn=turn))
        return msg_id

    def reply(self, msg: Message, kind: Kind, body: dict[str, Any]) -> None:
        envelope = codec.encode(msg.src, kind, body, id=self.new_id(), reply_to=msg.id,
                                   session=msg.session, turn=msg.turn)
        self._replies.answered((msg.src, msg.id), envelope, keep=msg.kind not in READS)
        self._send_envelope(msg.src, envelope)

    def _send_envelope(self, dest: str, envelope: bytes) -> None:
        if self._sock is None:
            raise BusError("bus not started")
        queued = self._out.get(dest)
        if queued is None:
            self._out[dest] = [envelope]
        else:
            queued.append(envelope)
        if self._spill.wants(envelope):
            self._big_queued = True
        self.sent += 1
        if not self._out_scheduled:
            self._out_scheduled = True
            self._loop.call_soon(self._flush_out)

    def _flush_out(self) -> None:
        """End of a loop iteration: one frame per destination, a batch if several went there."""
        self._out_scheduled = False
        out, self._out = self._out, {}
        if self._sock is None:
            return
        if self._big_queued:
            # spilled at each send, not once: a request sent again must not name a region its
            # receiver has already read and freed
            self._big_queued = False
            spiller = self._spill
            out = {dest: [spiller.out(e) if spiller.wants(e) else e for e in envelopes] if dest != BROKER
                   else envelopes for dest, envelopes in out.items()}   # the broker reads no ring
        for dest, envelopes in out.items():
            if len(envelopes) == 1:
                self._push(envelopes[0])
                continue
            chunk: list[bytes] = []
            size = 0
            for envelope in envelopes:
                # a big one goes alone (a batch would copy it at each end), after what came before it
                alone = len(envelope) >= codec.LARGE_ENVELOPE_BYTES
                if chunk and (alone or size + len(envelope) > codec.MAX_BATCH_BYTES):
                    self._push(codec.encode_batch(dest, chunk) if len(chunk) > 1 else chunk[0])
                    chunk, size = [], 0
                if alone:
                    self._push(envelope)
                    continue
                chunk.append(envelope)
                size += len(envelope) + 4
            if chunk:
                self._push(codec.encode_batch(dest, chunk) if len(chunk) > 1 else chunk[0])
        self._drain()  # a send may have consumed the socket's read edge

    def _push(self, frame: bytes) -> None:
        if self._outbox:
            self._outbox.append(frame)
            return
        try:
            frames.send(self._sock, frame)
        except zmq.Again:
            self._outbox.append(frame)  # high-water mark: keep it, flush on the next wake-up

    def _flush_outbox(self) -> None:
        sock = self._sock
        while self._outbox:
            try:
                frames.send(sock, self._outbox[0])
            except zmq.Again:
                return
            self._outbox.popleft()

    async def request(self, dest: str, kind: Kind, body: dict[str, Any], *, timeout: float = 5.0,
                      attempt_secs: float = 1.0, session: str = "", turn: str = "") -> Message:
        """Send and wait for the reply; re-send the same id until `timeout` runs out."""
        fut = self._loop.create_future()

        def done(reply: Message | None, error: BaseException | None) -> None:
            if not fut.done():
                fut.set_result(reply) if error is None else fut.set_exception(error)
        attempts = self.request_callback(dest, kind, body, done, timeout=timeout, attempt_secs=attempt_secs,
                                         session=session, turn=turn)
        try:
            return await fut
        finally:
            attempts.cancel()

    def request_callback(self, dest: str, kind: Kind, body: dict[str, Any],
                         done: Callable[[Message | None, BaseException | None], None], *, timeout: float = 5.0,
                         attempt_secs: float = 1.0, session: str = "", turn: str = "") -> "Attempts":
        """`request` without a coroutine: `done(reply, None)` or `done(None, BusTimeout)` is called
        from the receive path itself. A hot path (the log client) saves the two loop iterations a
        task costs: one to start sending, one to wake on the reply."""
        msg_id = self.new_id()
        envelope = codec.encode(dest, kind, body, id=msg_id, session=session, turn=turn)
        attempts = Attempts(self, dest, kind, msg_id, envelope, done, timeout, attempt_secs)
        attempts.send()
        return attempts

    def resend_to(self, name: str) -> None:
        """The peer restarted: end the current attempt of every request to it, so it is sent again now."""
        for msg_id, dest in list(self._pending_dest.items()):
            fut = self._pending.get(msg_id)
            if dest == name and fut is not None and not fut.done():
                fut.set_exception(AttemptTimeout())

    # -- receiving -----------------------------------------------------------------------

    def _drain(self) -> None:
        self._drain_scheduled = False
        sock = self._sock
        if sock is None:
            return
        if self._outbox:
            self._flush_outbox()
        recv = frames.recv
        deliver = self._deliver
        for _ in range(_DRAIN_BATCH):
            try:
                envelope = recv(sock)
            except zmq.Again:
                return
            deliver(envelope)
        # More may be waiting: let other callbacks run, then continue.
        self._drain_scheduled = True
        self._loop.call_soon(self._drain)

    def _deliver(self, envelope: bytes) -> None:
        try:
            name, offset = codec.split_name(envelope)
            if envelope[offset + 1:offset + 1 + envelope[offset]] != codec.BATCH_BYTES:
                self.received += 1
                self._dispatch(codec.decode(envelope, None, self._spill.reader))
                return
            src = name.decode()
            inner = codec.split_batch(codec.split_rest(envelope, offset)[2])
        except (ProtocolError, UnicodeDecodeError) as exc:
            self._bad(envelope[6:6 + envelope[5]] if len(envelope) > 6 else b"?", str(exc))
            return
        for one in inner:
            self.received += 1
            try:
                msg = codec.decode(one, src, self._spill.reader)
            except ProtocolError as exc:
                self._bad(src.encode(), str(exc))
                continue
            self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        if not sent_by_its_role(msg.kind, msg.src):
            self._bad(msg.src.encode(), f"{msg.kind} is taken only from {SENDERS[msg.kind]}")
            return
        if msg.kind is Kind.PEER_RESTARTED:
            self.resend_to(msg.body["name"])
            for hook in self.restart_hooks:
                hook(msg.body["name"])
        if msg.kind is Kind.UNDELIVERABLE:
            fut = self._pending.get(msg.id)   # the header is our own request's
            if fut is not None:
                if not fut.done():
                    fut.set_exception(Undeliverable(f"{msg.body['dest']}: {msg.body['reason']}"))
                return
        elif msg.reply_to:
            fut = self._pending.get(msg.reply_to)
            if fut is not None:
                if self._pending_dest.get(msg.reply_to) != msg.src:   # a reply from whom we asked, or none
                    self._bad(msg.src.encode(), f"a reply to a request sent to {self._pending_dest.get(msg.reply_to)}")
                    return
                if not fut.done():
                    fut.set_result(msg)
                return
        if msg.kind in REQUESTS and not self._first_time(msg):
            return
        handler = self._handlers.get(msg.kind)
        if handler is None:
            return  # a late reply or a kind this role does not handle
        if msg.kind in self._async:
            self.spawn(handler(msg))
            return
        try:
            handler(msg)
        except ProtocolError as exc:
            self._bad(msg.src.encode(), str(exc))
        except Exception:
            self.handler_errors += 1
            self.log.exception("handler for %s failed", msg.kind)

    def _first_time(self, msg: Message) -> bool:
        cached = self._replies.first_time((msg.src, msg.id))
        if cached is None or cached is RERUN:
            return True
        if cached is not PENDING:
            self._send_envelope(msg.src, cached)
        return False

    def _bad(self, src: bytes, why: str) -> None:
        self.malformed += 1
        peer = src.decode(errors="replace")
        if peer not in self._logged_bad and len(self._logged_bad) < 1000:
            self._logged_bad.add(peer)
            self.log.warning("dropped malformed message from %s: %s", peer, why)

    def _report_counts(self) -> None:
        from agentos import metrics   # late, as in agentos/service.py: the tree's metrics directory first
        if self._reported is None:
            self._reported = metrics.Totals()
        report, role = self._reported.report, self.role
        report(metrics.bus_malformed.labels(role), self.malformed)
        report(metrics.bus_retries.labels(role), self.retries)
        report(metrics.bus_big_bodies.labels(role, "ring"), self._spill.spilled)
        report(metrics.bus_big_bodies.labels(role, "broker"), self._spill.whole)

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "received": self.received, "malformed": self.malformed,
                "retries": self.retries, "handler_errors": self.handler_errors,
                "pending_requests": len(self._pending), "outbox": len(self._outbox),
                "spilled": self._spill.spilled, "big_whole": self._spill.whole}
