"""The actor's side of provider permits: acquire before a model call, release after it.

A request is re-sent until granted (the scheduler de-duplicates by permit id), and a periodic
sync tells the scheduler what this incarnation holds and waits for, which is how permits of a
crashed or cancelled holder come back, and what is left of a provider's back-off. A grant that
arrives for a permit nobody waits for any more (its turn was cancelled meanwhile) is released at
once.
"""
from __future__ import annotations

import asyncio
import time

from agentos import metrics
from broker.client import Bus
from broker.sharding import SCHEDULER
from broker.protocol import Kind, Message

_RESEND_SECS = 2.0
_SYNC_SECS = 2.0


class PermitClient:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.waiting: dict[str, tuple[asyncio.Future, str, float]] = {}
        self.held: set[str] = set()
        self.paused_until = 0.0   # monotonic: the end of the provider's last back-off
        self._counter = 0

    async def acquire(self, tenant: str, session: str = "", turn: str = "") -> str:
        self._counter += 1
        permit_id = f"{self.bus.name}.{self.bus.incarnation:x}.{self._counter}"
        fut = asyncio.get_running_loop().create_future()
        now = time.monotonic()
        self.waiting[permit_id] = (fut, tenant, now)
        self.bus.send(SCHEDULER, Kind.PERMIT_REQUEST, {"permit_id": permit_id, "tenant": tenant},
                      session=session, turn=turn)
        try:
            await fut
        except asyncio.CancelledError:
            self.waiting.pop(permit_id, None)
            if fut.done() and not fut.cancelled():
                self.held.discard(permit_id)
            self.bus.send(SCHEDULER, Kind.PERMIT_RELEASE, {"permit_id": permit_id})
            raise
        metrics.observe(metrics.permit_wait, (time.monotonic() - now) * 1000.0)
        return permit_id

    def release(self, permit_id: str, backoff_secs: float = 0.0, session: str = "", turn: str = "") -> None:
        self.held.discard(permit_id)
        body: dict = {"permit_id": permit_id}
        if backoff_secs > 0:
            body["backoff_secs"] = backoff_secs
            self.paused_until = max(self.paused_until, time.monotonic() + backoff_secs)
        self.bus.send(SCHEDULER, Kind.PERMIT_RELEASE, body, session=session, turn=turn)

    def on_grant(self, msg: Message) -> None:
        permit_id = msg.body["permit_id"]
        entry = self.waiting.pop(permit_id, None)
        if entry is None or entry[0].done():
            if permit_id not in self.held:
                self.bus.send(SCHEDULER, Kind.PERMIT_RELEASE, {"permit_id": permit_id})
            return
        self.held.add(permit_id)
        entry[0].set_result(None)

    async def sync_loop(self) -> None:
        self._sync()  # a new incarnation: the scheduler drops whatever the last one held
        while True:
            await asyncio.sleep(_SYNC_SECS)
            now = time.monotonic()
            for permit_id, (_, tenant, since) in list(self.waiting.items()):
                if now - since > _RESEND_SECS:
                    self.bus.send(SCHEDULER, Kind.PERMIT_REQUEST, {"permit_id": permit_id, "tenant": tenant})
            self._sync()

    def _sync(self) -> None:
        body = {"held": list(self.held), "waiting": list(self.waiting), "incarnation": self.bus.incarnation}
        left = self.paused_until - time.monotonic()
        if left > 0:   # the release that carried it is one-way and may have been lost
            body["backoff_secs"] = left
        self.bus.send(SCHEDULER, Kind.PERMIT_SYNC, body)
