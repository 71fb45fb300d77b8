"""Client for an OpenAI-compatible chat completions endpoint, streaming.

One pooled aiohttp session per actor process. A model call yields text deltas as they arrive and
ends with a `ModelResult` (text, tool calls, usage). Every way a call can go wrong becomes a
`ProviderError` whose `kind` names the cause: the turn reports it, the metrics count it, and a
429 carries the provider's Retry-After so the scheduler can back off.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import aiohttp
import orjson

from agentos.config import ProviderConfig


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


class Provider:
    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_secs, connect=self.config.connect_timeout_secs,
                                        sock_read=self.config.timeout_secs)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                                             timeout=timeout, json_serialize=lambda o: orjson.dumps(o).decode())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                     result: ModelResult | None = None) -> AsyncIterator[str]:
        """Yield text deltas; fill `result` with the whole answer when the stream ends cleanly."""
        result = result if result is not None else ModelResult()
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = tools
        try:
            async with self.session.post(self.url, data=orjson.dumps(body), headers=self.headers) as resp:
                if resp.status != 200:
                    raise await _status_error(resp)
                async for text in _read_stream(resp, result):
                    yield text
        except ProviderError:
            raise
        except asyncio.TimeoutError:
            raise ProviderError("timeout", f"provider did not answer within {self.config.timeout_secs:g}s") from None
        except aiohttp.ClientPayloadError as exc:
            raise ProviderError("disconnect", f"provider stream broke: {exc}") from None
        except aiohttp.ServerDisconnectedError:
            raise ProviderError("disconnect", "provider closed the connection mid-stream") from None
        except aiohttp.ClientConnectorError as exc:
            raise ProviderError("connect", f"cannot connect to provider at {self.url}: {exc.os_error}") from None
        except aiohttp.ClientError as exc:
            raise ProviderError("disconnect", f"provider connection failed: {exc!r}") from None


async def _status_error(resp: aiohttp.ClientResponse) -> ProviderError:
    try:
        detail = (await resp.read())[:300].decode(errors="replace")
    except aiohttp.ClientError:
        detail = ""
    if resp.status == 429:
        try:
            retry_after = float(resp.headers.get("Retry-After", "1"))
        except ValueError:
            retry_after = 1.0
        return ProviderError("rate_limited", f"provider rate limited (429), retry after {retry_after:g}s",
                             retry_after=retry_after)
    kind = "server_error" if resp.status >= 500 else "bad_request"
    return ProviderError(kind, f"provider answered HTTP {resp.status}: {detail}")


async def _read_stream(resp: aiohttp.ClientResponse, result: ModelResult) -> AsyncIterator[str]:
    calls: dict[int, ToolCall] = {}
    text_parts: list[str] = []
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            result.text = "".join(text_parts)
            result.tool_calls = [calls[i] for i in sorted(calls)]
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ProviderError("bad_response", f"provider sent a chunk that is not JSON: {data[:80]!r}") from None
        usage = chunk.get("usage")
        if usage:
            result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            result.completion_tokens = int(usage.get("completion_tokens") or 0)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
            content = delta.get("content")
            if content:
                text_parts.append(content)
                yield content
            for call in delta.get("tool_calls") or ():
                index = call.get("index", 0)
                entry = calls.get(index)
                function = call.get("function") or {}
                if entry is None:
                    entry = calls[index] = ToolCall(call.get("id") or f"call_{index}", function.get("name") or "")
                elif function.get("name"):
                    entry.name = function["name"]
                entry.arguments += function.get("arguments") or ""
    raise ProviderError("disconnect", "provider stream ended before [DONE]")
