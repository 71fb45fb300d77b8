"""A request's attempts on the bus: the same message id re-sent until a reply or the deadline.

`Bus.request` (a coroutine) and `Bus.request_callback` (for hot paths that avoid a task) both run
on this; the bus's receive path answers an attempt as it would a pending future.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

from broker.protocol import Kind, Message

if TYPE_CHECKING:
    from broker.client import Bus


class BusError(RuntimeError):
    pass


class BusTimeout(BusError):
    """No reply before the request's deadline."""


class Undeliverable(BusError):
    """The broker could not deliver to the destination (unknown, dead or full)."""


class AttemptTimeout(Exception):
    """One attempt had no reply in time (or its peer restarted): send it again."""


def _expire_attempt(fut) -> None:
    if not fut.done():
        fut.set_exception(AttemptTimeout())


class Attempts:
    """One request's attempts: the same id re-sent after each `attempt_secs` without a reply (or
    sooner, after a back-off, when the broker could not deliver it) until `timeout`. The bus sees
    each attempt as a pending future (`done`, `set_result`, `set_exception`), answered in place."""
    __slots__ = ("bus", "dest", "kind", "envelope", "msg_id", "done_cb", "timeout", "deadline", "attempt_secs",
                 "backoff", "last_error", "timer", "finished")

    def __init__(self, bus: "Bus", dest: str, kind: Kind, msg_id: int, envelope: bytes,
                 done: Callable[[Message | None, BaseException | None], None], timeout: float,
                 attempt_secs: float) -> None:
        self.bus, self.dest, self.kind, self.msg_id, self.envelope = bus, dest, kind, msg_id, envelope
        self.done_cb = done
        self.timeout = timeout
        self.deadline = bus._loop.time() + timeout
        self.attempt_secs = attempt_secs
        self.backoff = 0.02
        self.last_error = "no reply"
        self.timer: asyncio.TimerHandle | None = None
        self.finished = False

    def send(self) -> None:
        bus, loop = self.bus, self.bus._loop
        bus._pending[self.msg_id] = self
        bus._pending_dest[self.msg_id] = self.dest
        bus._send_envelope(self.dest, self.envelope)
        self.timer = loop.call_later(max(0.0, min(self.attempt_secs, self.deadline - loop.time())),
                                     _expire_attempt, self)

    # -- the pending-future face the bus's receive path uses --
    def done(self) -> bool:
        return self.finished

    def set_result(self, reply: Message) -> None:
        self._stop()
        self.finished = True
        self.done_cb(reply, None)

    def set_exception(self, exc: BaseException) -> None:
        self._stop()
        loop = self.bus._loop
        if isinstance(exc, Undeliverable):
            self.last_error = str(exc)
            self.timer = loop.call_later(max(0.0, min(self.backoff, self.deadline - loop.time())), self._retry)
            self.backoff = min(self.backoff * 2, 0.5)
        elif isinstance(exc, AttemptTimeout):
            self.last_error = "no reply"
            self._retry()
        else:
            self.finished = True
            self.done_cb(None, exc)

    def _retry(self) -> None:
        self.timer = None
        if self.bus._loop.time() >= self.deadline:
            self.finished = True
            self.done_cb(None, BusTimeout(f"{self.kind} to {self.dest}: {self.last_error} within {self.timeout:g}s"))
            return
        self.bus.retries += 1
        self.send()

    def cancel(self) -> None:
        self._stop()
        self.finished = True

    def _stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.bus._pending.pop(self.msg_id, None)
        self.bus._pending_dest.pop(self.msg_id, None)
