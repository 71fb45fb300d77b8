"""Unit: a turn's SSE pump when its client is gone between two writes (aiohttp has not yet
cancelled the handler, so the write finds the transport closing). Fakes stand in for aiohttp's
response and the bus; the end-to-end disconnect tests are in test_e2e_turns.py."""
import asyncio
import logging

from aiohttp.client_exceptions import ClientConnectionResetError

import gateway.app as app
from agentos.config import Config
from broker.protocol import Kind
from gateway.streams import TurnStream


class ClosingResponse:
    """What aiohttp's StreamResponse does once its transport is closing."""

    def __init__(self, *args, **kwargs) -> None:
        self.writes = 0

    async def prepare(self, request) -> None:
        pass

    async def write(self, data: bytes) -> None:
        self.writes += 1
        raise ClientConnectionResetError("Cannot write to closing transport")


def test_a_client_gone_mid_stream_ends_the_pump_quietly_and_asks_for_the_cancel(monkeypatch):
    monkeypatch.setattr(app, "sse_response", ClosingResponse)
    sent = []
    config = Config()
    config.kernel.disconnect_grace_secs = 7.0
    gateway = app.Gateway(config, "ipc:///nonexistent/bus.sock", 0, logging.getLogger("test"))
    monkeypatch.setattr(gateway.bus, "request_callback", lambda to, kind, body, done, **_: sent.append((to, kind, body)))
    stream = TurnStream("t1", "s1", "actor/0", "default")
    stream.push(Kind.TURN_STARTED, {"turn_id": "t1", "seq": 1, "data": {"turn_id": "t1"}})

    response = asyncio.run(gateway._pump(None, stream))   # no exception for aiohttp to log

    assert isinstance(response, ClosingResponse) and response.writes == 1
    assert sent == [("actor/0", Kind.TURN_CANCEL, {"session": "s1", "turn_id": "t1", "stream": stream.token,
                                                  "reason": "disconnect", "after_secs": 7.0})]
