"""Client for an OpenAI-compatible chat completions endpoint, streaming.

Each actor keeps a pool of keep-alive connections (`actors.http1`) to its provider. A model call
hands text deltas to a callback straight from the socket's `data_received`, with no coroutine
wake-up per chunk, and resolves one future with the whole answer (`ModelResult`). It is the
hottest code of a turn, which is why it is not aiohttp's client (three times the CPU here).

Every way a call can go wrong becomes a `ProviderError` whose `kind` names the cause — the turn
reports it, the metrics count it, and a 429 carries the provider's Retry-After so the scheduler
can back off. A call is bounded by `provider.timeout_secs` overall and between two reads.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from actors.http1 import Endpoint, HttpConnection, ResponseSink, build_request, open_connection, parse_endpoint
from actors.http_wire import HttpProtocolError, SSEParser
from agentos import service
from agentos.config import ProviderConfig
MAX_IDLE_CONNECTIONS = 2048
MAX_ERROR_BODY = 2048


class ProviderError(Exception):
    def __init__(self, kind: str, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.kind in ("rate_limited", "server_error", "disconnect", "connect")


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ModelResult:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""


class _Stream(ResponseSink):
    """One streamed completion: SSE chunks in, text to the callback, the result to a future."""

    __slots__ = ("future", "on_text", "status", "headers", "sse", "error_body", "parts", "calls", "result",
                 "finished", "last_read")

    def __init__(self, future: asyncio.Future, on_text: Callable[[str], None]) -> None:
        self.future = future
        self.on_text = on_text
        self.status = 0
        self.headers: dict[str, str] = {}
        self.sse = SSEParser()
        self.error_body = b""
        self.parts: list[str] = []
        self.calls: dict[int, ToolCall] = {}
        self.result = ModelResult()
        self.finished = False
        self.last_read = time.monotonic()

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def on_body(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        if self.status != 200:
            if len(self.error_body) < MAX_ERROR_BODY:
                self.error_body += data[:MAX_ERROR_BODY]
            return
        if self.finished:
            return
        for event in self.sse.feed(data):
            payload = event.data.strip()
            if payload == b"[DONE]":
                self._done()
                return
            if not payload:
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise HttpProtocolError(f"provider sent a chunk that is not JSON: {payload[:80]!r}") from None
            self._chunk(chunk)

    def _chunk(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if usage:
            self.result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.result.completion_tokens = int(usage.get("completion_tokens") or 0)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                self.result.finish_reason = choice["finish_reason"]
            content = delta.get("content")
            if content:
                self.parts.append(content)
                self.on_text(content)
            for call in delta.get("tool_calls") or ():
                index = call.get("index", 0)
                function = call.get("function") or {}
                entry = self.calls.get(index)
                if entry is None:
                    entry = self.calls[index] = ToolCall(call.get("id") or f"call_{index}", function.get("name") or "")
                elif function.get("name"):
                    entry.name = function["name"]
                entry.arguments += function.get("arguments") or ""

    def _done(self) -> None:
        self.finished = True
        self.result.text = "".join(self.parts)
        self.result.tool_calls = [self.calls[i] for i in sorted(self.calls)]
        if not self.future.done():
            self.future.set_result(self.result)  # the answer is whole; the body's end may follow

    def on_end(self) -> None:
        if self.future.done():
            return
        if self.status != 200:
            self.future.set_exception(_status_error(self.status, self.headers, self.error_body))
        elif self.finished:
            self.future.set_result(self.result)
        else:
            self.future.set_exception(ProviderError("disconnect", "provider stream ended before [DONE]"))

    def on_lost(self, reason: str) -> None:
        if self.future.done():
            return
        if self.finished:
            self.future.set_result(self.result)  # [DONE] arrived; only the connection's end was lost
        elif reason.startswith("protocol error") and "not JSON" in reason:
            self.future.set_exception(ProviderError("bad_response", reason))
        else:
            self.future.set_exception(ProviderError("disconnect", f"provider stream broke: {reason}"))


def _status_error(status: int, headers: dict[str, str], body: bytes) -> ProviderError:
    detail = body[:300].decode(errors="replace")
    if status == 429:
        try:
            retry_after = float(headers.get("retry-after", "1"))
        except ValueError:
            retry_after = 1.0
        return ProviderError("rate_limited", f"provider rate limited (429), retry after {retry_after:g}s",
                             retry_after=retry_after)
    kind = "server_error" if status >= 500 else "bad_request"
    return ProviderError(kind, f"provider answered HTTP {status}: {detail}")


class Provider:
    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.endpoint: Endpoint = parse_endpoint(config.base_url)
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.idle: list[HttpConnection] = []
        self.active: dict[HttpConnection, _Stream] = {}
        self._watchdog: asyncio.Task | None = None

    async def start(self) -> None:
        self._watchdog = service.lifelong(self._watch())

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for conn in [*self.idle, *self.active]:
            conn.close()
        self.idle.clear()

    async def _connection(self) -> HttpConnection:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        try:
            return await open_connection(self.endpoint, self.config.connect_timeout_secs)
        except (OSError, TimeoutError) as exc:
            raise ProviderError("connect", f"cannot connect to provider at {self.config.base_url}: {exc!r}") from None

    async def _watch(self) -> None:
        """Abort calls that went silent longer than the timeout (one sweep instead of a timer per read)."""
        limit = self.config.timeout_secs
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for conn, stream in list(self.active.items()):
                if now - stream.last_read > limit and not stream.future.done():
                    stream.future.set_exception(ProviderError(
                        "timeout", f"provider sent nothing for {limit:g}s"))
                    conn.abort()

    async def call(self, messages: list[dict[str, Any]], on_text: Callable[[str], None],
                   tools: list[dict] | None = None) -> ModelResult:
        """One streamed completion; `on_text` gets each text delta as it arrives."""
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = tools
        request = build_request(self.endpoint, "POST", "/chat/completions", orjson.dumps(body), self.headers)
        conn = await self._connection()
        future = asyncio.get_running_loop().create_future()
        stream = _Stream(future, on_text)
        try:
            conn.send(request, stream)
        except ConnectionError:
            conn = await open_connection(self.endpoint, self.config.connect_timeout_secs)
            conn.send(request, stream)
        self.active[conn] = stream
        try:
            async with asyncio.timeout(self.config.timeout_secs):
                result = await future
        except TimeoutError:
            conn.abort()
            raise ProviderError("timeout", f"provider did not finish within {self.config.timeout_secs:g}s") from None
        except BaseException:
            conn.abort()  # cancelled or failed: the provider stream closes with it
            raise
        finally:
            self.active.pop(conn, None)
        if conn.busy:
            conn.abort()  # [DONE] came but not the end of the body: this connection is not reusable
        elif not conn.closed and len(self.idle) < MAX_IDLE_CONNECTIONS:
            self.idle.append(conn)
        return result
