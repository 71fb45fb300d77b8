"""How a planned reply of the mock model server (bench/mock_llm.py) goes on the wire.

This module owns the bytes the mock sends: OpenAI `chat.completion.chunk` SSE events, the
non-stream `chat.completion` body, OpenAI-style error bodies, the loop that releases stream
events on schedule, and the two connection faults that live inside a reply (a stream cut
mid-way, a stream that never ends). It never parses requests, keeps statistics or decides
which fault a request gets: bench/mock_plan.py decides the Plan and bench/mock_llm.py hands
it over finished.

Why pre-encoded templates: the mock is the load source of every benchmark and shares two cores
with the server under test, so a streamed token must cost a bytes concatenation, not a
json.dumps of a nested dict. Everything that is the same for all tokens of a request (id,
created, model) is encoded once per request into a `head`; everything that is the same for all
requests (the token texts, the role and finish deltas) is encoded once at import as constants.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import orjson
from aiohttp import web

# The token texts cycle through these words, so a test can predict a reply with expected_text().
WORDS = (" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit")

# Tool-call arguments are streamed in pieces of this many characters, like a real model would.
ARG_PIECE_CHARS = 8

DONE = b"data: [DONE]\n\n"
JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

_N_WORDS = len(WORDS)
_TOKEN_TAILS = tuple(
    b'{"index":0,"delta":{"content":' + orjson.dumps(w) + b'},"finish_reason":null}]}\n\n'
    for w in WORDS
)
_ROLE_TAIL = b'{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
_FINISH_TAILS = {
    reason: b'{"index":0,"delta":{},"finish_reason":"' + reason.encode() + b'"}]}\n\n'
    for reason in ("stop", "tool_calls")
}


def expected_text(tokens: int) -> str:
    """The assistant text of a reply of `tokens` tokens (what a client concatenates)."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return "".join(WORDS[i % _N_WORDS] for i in range(tokens))


def tool_arguments(query: str) -> str:
    """The arguments JSON of every mock tool call: the user's question, shortened."""
    return orjson.dumps({"q": query}).decode()


def tool_event_count(tools: int, arguments: str) -> int:
    """How many chunks ChunkEncoder.tool_calls() yields: the completion_tokens of a tool reply."""
    return tools * (1 + -(-len(arguments) // ARG_PIECE_CHARS))


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ChunkEncoder:
    """Builds the SSE events of one streamed completion from a per-request head."""

    __slots__ = ("head",)

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        # Key order follows OpenAI's chunks: id, object, created, model, choices.
        self.head = (
            b'data: {"id":' + orjson.dumps(completion_id)
            + b',"object":"chat.completion.chunk","created":' + str(created).encode()
            + b',"model":' + orjson.dumps(model) + b',"choices":['
        )

    def role(self) -> bytes:
        return self.head + _ROLE_TAIL

    def text(self, index: int) -> bytes:
        """The content chunk of token number `index` (0-based)."""
        return self.head + _TOKEN_TAILS[index % _N_WORDS]

    def finish(self, reason: str) -> bytes:
        return self.head + _FINISH_TAILS[reason]

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        # `choices` is empty in OpenAI's usage chunk; the head ends inside that list.
        return (self.head + b'],"usage":' + orjson.dumps(_usage(prompt_tokens, completion_tokens))
                + b"}\n\n")

    def tool_calls(self, call_ids: Sequence[str], names: Sequence[str],
                   arguments: str) -> list[bytes]:
        """All chunks of a tool-call reply: per call one header chunk, then argument pieces."""
        events: list[bytes] = []
        pieces = [arguments[i:i + ARG_PIECE_CHARS]
                  for i in range(0, len(arguments), ARG_PIECE_CHARS)]
        for index, (call_id, name) in enumerate(zip(call_ids, names)):
            first = {"index": index, "id": call_id, "type": "function",
                     "function": {"name": name, "arguments": ""}}
            events.append(self._tool_delta(first))
            for piece in pieces:
                events.append(self._tool_delta({"index": index, "function": {"arguments": piece}}))
        return events

    def _tool_delta(self, call: dict) -> bytes:
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
        return self.head + orjson.dumps(choice) + b"]}\n\n"


def completion_body(completion_id: str, created: int, model: str, message: dict,
                    finish_reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
    """A non-stream `chat.completion` response body."""
    return orjson.dumps({
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": _usage(prompt_tokens, completion_tokens),
    })


def text_message(tokens: int) -> dict:
    return {"role": "assistant", "content": expected_text(tokens)}


def tool_message(call_ids: Sequence[str], names: Sequence[str], arguments: str) -> dict:
    calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
             for call_id, name in zip(call_ids, names)]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


class _Cursor:
    """One stream's place in the Pacer: which event is next and when."""

    __slots__ = ("direct", "done", "event", "first_at", "index", "interval", "transport")

    def __init__(self, transport: asyncio.Transport, event: Callable[[int], bytes], direct: int,
                 first_at: float, interval: float, done: asyncio.Future[None]) -> None:
        self.transport = transport
        self.event = event
        self.index = 0
        self.direct = direct
        self.first_at = first_at
        self.interval = interval
        self.done = done


class Pacer:
    """Releases the content events of every open stream from one shared timer.

    Why not `await asyncio.sleep()` per token: at 1000 streams a task wake-up, a timer and
    aiohttp's four-layer write path per token cost more than the send itself. Here a token is a
    list append and one chunk-framed transport.write, done from a loop.call_at callback that
    serves every stream due in the same millisecond (no task of its own). The handler sleeps on
    one future for the whole stream and writes the last event itself through aiohttp, so
    aiohttp's response state (chunked terminator, keep-alive) stays its own.
    """

    # Events are released on whole milliseconds (rounded to the nearest), the resolution of
    # uvloop's timers anyway: streams due in the same millisecond share one wake-up.
    TICKS_PER_SEC = 1000

    def __init__(self) -> None:
        self._slots: dict[int, list[_Cursor]] = {}  # tick -> cursors due then
        self._ticks: list[int] = []                  # heap of the keys of _slots
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tick = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, transport: asyncio.Transport, event: Callable[[int], bytes], direct: int,
            first_at: float, interval: float) -> asyncio.Future[None]:
        """Write event(i) for i < direct at first_at + i * interval straight to the transport
        (the response must use chunked encoding), then resolve the returned future at
        first_at + direct * interval. Cancel the future to stop early."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        done = self._loop.create_future()
        self._push(first_at, _Cursor(transport, event, direct, first_at, interval, done))
        return done

    def _push(self, when: float, cursor: _Cursor) -> None:
        tick = int(when * self.TICKS_PER_SEC + 0.5)
        slot = self._slots.get(tick)
        if slot is not None:
            slot.append(cursor)
            return
        self._slots[tick] = [cursor]
        heapq.heappush(self._ticks, tick)
        if tick < self._timer_tick:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(tick)

    def _arm(self, tick: int) -> None:
        loop = self._loop
        if loop is None:
            raise RuntimeError("Pacer armed before run()")
        self._timer_tick = tick
        self._timer = loop.call_at(tick / self.TICKS_PER_SEC, self._fire)

    def _fire(self) -> None:
        # No tick is below -1, so _push arms nothing while we run; we arm once at the end.
        self._timer, self._timer_tick = None, -1
        slots, ticks, push = self._slots, self._ticks, self._push
        now = int(self._loop.time() * self.TICKS_PER_SEC + 0.5)  # type: ignore[union-attr]
        while ticks and ticks[0] <= now:
            for cursor in slots.pop(heapq.heappop(ticks)):
                done = cursor.done
                if done.done():  # the handler was cancelled: the client went away
                    continue
                index = cursor.index
                if index == cursor.direct:
                    done.set_result(None)
                    continue
                transport = cursor.transport
                if transport.is_closing():
                    done.set_exception(ConnectionResetError("client went away mid-stream"))
                    continue
                chunk = cursor.event(index)
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))  # one HTTP/1.1 chunk
                cursor.index = index = index + 1
                push(cursor.first_at + index * cursor.interval, cursor)
        self._timer_tick = math.inf
        if ticks:
            self._arm(ticks[0])


# ---------------------------------------------------------------------------------------------
# Replies

class Plan(NamedTuple):
    """Everything about one reply, decided before the first byte (by mock_plan.plan_reply).
    A NamedTuple rather than a frozen dataclass: built once per request, and tuple creation
    is several times cheaper than a frozen dataclass's __init__."""

    model: str
    stream: bool
    include_usage: bool
    ttft_secs: float             # until the first content token (a `slow` fault is already in)
    interval_secs: float         # between later tokens
    tokens: int
    fault: str | None            # injected fault kind, or None
    tool_names: tuple[str, ...]  # empty: answer with text
    query: str                   # the user's text without the marker (for tool arguments)
    prompt_tokens: int


class _SseResponse(web.StreamResponse):
    # aiohttp sends a StreamResponse's headers alone at prepare(); holding them back until the
    # role chunk saves a send() per stream. Harmless if a later aiohttp drops this attribute.
    _send_headers_immediately = False


async def stream_reply(request: web.BaseRequest, plan: Plan, completion_id: str,
                       call_ids: Sequence[str],
                       pacer: Pacer) -> tuple[web.StreamResponse, int, bool]:
    """Stream a reply; returns (response, tokens sent, whether it was written to the end)."""
    enc = ChunkEncoder(completion_id, int(time.time()), plan.model)
    resp = _SseResponse(headers=_SSE_HEADERS)
    resp.enable_chunked_encoding()  # the Pacer writes HTTP chunks itself
    await resp.prepare(request)
    await resp.write(enc.role())
    if plan.fault == "hang":
        await _until_cancelled()
    first_at = asyncio.get_running_loop().time() + plan.ttft_secs
    if plan.tool_names:
        events = enc.tool_calls(call_ids, plan.tool_names, tool_arguments(plan.query))
        event, count, reason = events.__getitem__, len(events), "tool_calls"
    else:
        event, count, reason = enc.text, plan.tokens, "stop"
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("client went away before the first token")
    if plan.fault == "disconnect":
        await pacer.run(transport, event, count // 2, first_at, plan.interval_secs)
        _abort(request)
        return resp, count // 2, False
    await pacer.run(transport, event, max(count - 1, 0), first_at, plan.interval_secs)
    tail = enc.finish(reason)
    if plan.include_usage:
        tail += enc.usage(plan.prompt_tokens, count)
    # The last event, the finish/usage/[DONE] events and the chunked terminator: one send.
    await resp.write_eof((event(count - 1) if count else b"") + tail + DONE)
    return resp, count, True


async def whole_reply(request: web.BaseRequest, plan: Plan, completion_id: str,
                      call_ids: Sequence[str]) -> tuple[web.StreamResponse, int, bool]:
    """Answer a non-stream request once the whole reply would have been generated."""
    if plan.fault == "hang":
        await _until_cancelled()
    if plan.tool_names:
        arguments = tool_arguments(plan.query)
        message, reason = tool_message(call_ids, plan.tool_names, arguments), "tool_calls"
        count = tool_event_count(len(call_ids), arguments)
    else:
        message, reason, count = text_message(plan.tokens), "stop", plan.tokens
    if plan.fault == "disconnect":
        await asyncio.sleep(plan.ttft_secs + max(count // 2 - 1, 0) * plan.interval_secs)
        _abort(request)
        # aiohttp wants a response back; writing it to the dropped connection quietly fails.
        return web.Response(status=499), count // 2, False
    await asyncio.sleep(plan.ttft_secs + max(count - 1, 0) * plan.interval_secs)
    body = completion_body(completion_id, int(time.time()), plan.model, message, reason,
                           plan.prompt_tokens, count)
    return await send(request, web.Response(body=body, content_type=JSON)), count, True


def error_response(status: int, message: str,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    kind = {400: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    code = "rate_limit_exceeded" if status == 429 else None
    return web.Response(status=status, body=error_body(message, kind, code), content_type=JSON,
                        headers=headers)


async def send(request: web.BaseRequest, resp: web.Response) -> web.Response:
    """Write a whole response now rather than after the handler returns, so the caller's
    bookkeeping (the `current` gauge) ends after the last byte is on its way."""
    await resp.prepare(request)
    await resp.write_eof()
    return resp


async def _until_cancelled() -> None:
    """Wait forever; aiohttp cancels the handler when the client disconnects
    (the app runs with handler_cancellation=True), so nothing is left behind."""
    await asyncio.get_running_loop().create_future()


def _abort(request: web.BaseRequest) -> None:
    """Drop the connection at once, so the client sees a reply cut without its terminator."""
    transport = request.transport
    if transport is not None:
        transport.abort()
