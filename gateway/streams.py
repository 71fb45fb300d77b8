"""Turn streams held by the gateway: the events of one turn on their way to an SSE response.

Events arrive from the actor numbered; a stream accepts them strictly in order. One that comes
early waits in a small reorder buffer; if the gap persists, the gateway asks the actor to replay
from the last number it has (see `Gateway.probe`). Duplicates are dropped. So a stream never
skips or repeats an event, whatever the bus lost or re-sent.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import orjson
from aiohttp import web

from broker.protocol import TURN_TERMINAL, Kind

SSE_EVENT_NAMES = {
    Kind.TURN_STARTED: b"turn.started",
    Kind.TURN_DELTA: b"delta",
    Kind.TURN_TOOL: b"tool",
    Kind.TURN_DONE: b"turn.completed",
    Kind.TURN_FAILED: b"turn.failed",
    Kind.TURN_CANCELLED: b"turn.cancelled",
}
KEEPALIVE = b": keep-alive\n\n"
_MAX_REORDER = 1024


def event_data(kind: Kind, body: dict[str, Any], session_id: str | None = None) -> dict[str, Any]:
    """The JSON `data:` of an SSE event, from the bus message body (`session_id`: as the client
    names the session)."""
    if kind is Kind.TURN_DELTA:
        return {"text": body["text"]}
    if kind is Kind.TURN_TOOL:
        return {"phase": body["phase"], "name": body["name"], **(body.get("data") or {})}
    if kind is Kind.TURN_FAILED:
        return {"turn_id": body["turn_id"], "error": {"code": body["code"], "message": body["message"]}}
    if kind is Kind.TURN_CANCELLED:
        return {"turn_id": body["turn_id"], "reason": body["reason"]}
    data = body.get("data") or {"turn_id": body["turn_id"]}
    if session_id is not None and "session_id" in data:
        data = {**data, "session_id": session_id}
    return data


class SseResponse(web.StreamResponse):
    # The status line and headers go out with the first event instead of in a write of their own
    # (aiohttp's documented opt-in for buffering the headers).
    _send_headers_immediately = False


def sse_response() -> SseResponse:
    return SseResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                "X-Accel-Buffering": "no"})


def render(seq: int, name: bytes, data: dict[str, Any]) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, name, orjson.dumps(data))


class TurnStream:
    __slots__ = ("turn_id", "session", "actor", "tenant", "last_seq", "chunks", "waiter", "last_event_at",
                 "terminal", "reorder", "gap_since", "probing", "failed_probes", "external_session",
                 "token")

    def __init__(self, turn_id: str, session: str, actor: str, tenant: str, external_session: str | None = None) -> None:
        self.turn_id = turn_id
        self.session = session
        self.external_session = external_session
        self.actor = actor
        self.tenant = tenant
        self.last_seq = 0
        self.chunks: list[bytes] = []
        self.waiter: asyncio.Future | None = None
        self.last_event_at = time.monotonic()
        self.terminal: Kind | None = None
        self.reorder: dict[int, tuple[Kind, dict]] = {}
        self.gap_since = 0.0
        self.probing = False
        self.failed_probes = 0
        # names this stream to the actor (TURN_START's `stream`), unique across gateways and restarts
        self.token = os.urandom(8).hex()

    def push(self, kind: Kind, body: dict[str, Any]) -> None:
        seq = body["seq"]
        self.last_event_at = time.monotonic()
        if seq <= self.last_seq or self.terminal is not None:
            return
        if seq != self.last_seq + 1:
            if len(self.reorder) < _MAX_REORDER:
                self.reorder[seq] = (kind, body)
            if not self.gap_since:
                self.gap_since = self.last_event_at
            return
        self._accept(kind, body)
        while self.reorder and self.terminal is None:
            nxt = self.reorder.pop(self.last_seq + 1, None)
            if nxt is None:
                break
            self._accept(*nxt)
        if not self.reorder:
            self.gap_since = 0.0
        self._wake()

    def _accept(self, kind: Kind, body: dict[str, Any]) -> None:
        self.last_seq = body["seq"]
        self.chunks.append(render(body["seq"], SSE_EVENT_NAMES[kind], event_data(kind, body, self.external_session)))
        if kind in TURN_TERMINAL:
            self.terminal = kind
            self.reorder.clear()

    def fail(self, code: str, message: str) -> None:
        """End the stream from the gateway's side (its actor lost the turn or is gone)."""
        if self.terminal is not None:
            return
        self._accept(Kind.TURN_FAILED, {"turn_id": self.turn_id, "seq": self.last_seq + 1,
                                        "code": code, "message": message})
        self._wake()

    def interrupted(self) -> None:
        """End the stream with `turn.interrupted`: the turn goes on in the background after a
        restart of its actor, and its result will be in the session's transcript."""
        if self.terminal is not None:
            return
        self.last_seq += 1
        self.chunks.append(render(self.last_seq, b"turn.interrupted", {
            "turn_id": self.turn_id, "code": "resumed_in_background",
            "message": "the server restarted during this turn; it is finishing in the background and its result "
                       "will be in the session's transcript (GET /v1/sessions/{sid}/messages)"}))
        self.terminal = Kind.TURN_FAILED
        self.reorder.clear()
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_chunks(self, keepalive_secs: float) -> list[bytes]:
        """What is ready to write; a keep-alive comment if nothing came for a while."""
        if not self.chunks:
            loop = asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            timer = loop.call_later(keepalive_secs, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self.waiter = None
            if not self.chunks:
                return [KEEPALIVE]
        chunks, self.chunks = self.chunks, []
        return chunks


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
