"""A log client's connection to one writer's direct inbox (the protocol: storage/log_inbox.py).

A `Bus` whose transport is a Unix stream socket instead of a zmq DEALER, so its requests keep
the bus's attempts, re-sends and deadlines (broker/requests.py) and replies arrive through the
bus's own receive path. It sends only `log.append` requests to its writer, and neither says
hello to nor heartbeats the broker: the writer's liveness is the broker's business, seen through
the log client's main bus. While the connection is down nothing is sent; on every connection
(the first one too) each unanswered request goes out again at once — the writer keeps one copy
of each record, however often it arrives.
"""
from __future__ import annotations

import asyncio
import logging

from broker.client import Bus, BusError
from broker.protocol import ProtocolError
from storage.log_inbox import FrameReader, frame, socket_path

RECONNECT_SECS = (0.02, 0.5)


class _Connection(asyncio.Protocol):
    def __init__(self, link: "LogLink") -> None:
        self.link = link
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.link.connected(transport)

    def data_received(self, data: bytes) -> None:
        try:
            envelopes = self.reader.feed(data)
        except ProtocolError as exc:   # a writer we cannot parse: drop the connection, reconnect
            self.link.log.warning("bad frame from %s's direct inbox: %s", self.link.writer, exc)
            self.transport.abort()
            return
        for envelope in envelopes:
            self.link._deliver(envelope)

    def connection_lost(self, exc) -> None:
        if self.link.transport is self.transport:
            self.link.transport = None
        if not self.lost.done():
            self.lost.set_result(None)


class LogLink(Bus):
    def __init__(self, name: str, writer: str, endpoint: str, log: logging.Logger) -> None:
        # spill_bytes 0: its envelopes go whole down its own socket, to a writer that takes them as they are
        super().__init__(name, endpoint, role="log-client", log=log, spill_bytes=0)
        self.writer = writer
        self.path = socket_path(endpoint)
        self.transport: asyncio.Transport | None = None

    def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = self        # "started", for the bus's send path
        self.spawn(self._keep_connected())

    async def _keep_connected(self) -> None:
        delay = RECONNECT_SECS[0]
        while True:
            try:
                _, conn = await self._loop.create_unix_connection(lambda: _Connection(self), self.path)
            except OSError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_SECS[1])
                continue
            delay = RECONNECT_SECS[0]
            await conn.lost

    def connected(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.write(frame(self.identity))
        self.resend_to(self.writer)

    def _push(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(frame(data))

    def _drain(self) -> None:
        """Replies arrive through `_Connection.data_received`: nothing to poll."""

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(BusError("bus closed"))
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self._sock = None
