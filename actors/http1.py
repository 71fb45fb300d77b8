"""A minimal HTTP/1.1 client on asyncio.Protocol, with incremental chunked and SSE decoding.

Owns: one keep-alive connection (`HttpConnection`) that carries one request at a time and hands the
response to a `ResponseSink` as it arrives (its chunked and SSE decoders: actors/http_wire.py).
Never does: retries, redirects, pipelining, TLS policy, timeouts (the caller arms its own timer and
aborts the connection), or any interpretation of what the events mean.

Used by the provider client (every model call of every actor) and by the load generators. Why not
aiohttp's client: both sit on the hot path of a turn, and the load generator shares two cores
with the server under test, so the cost per request must be small. A Protocol that feeds bytes
straight into the decoders, with no StreamReader, no per-line coroutine wake-ups and no header
multidicts, costs ~0.43 ms of CPU per 10-event SSE turn at 1000 connections where aiohttp's
client costs ~1.0 ms (and lags the loop).
"""
from __future__ import annotations

import asyncio
import ssl as _ssl
from typing import NamedTuple
from urllib.parse import urlsplit

from actors.http_wire import ChunkedDecoder, HttpProtocolError

MAX_HEAD_BYTES = 64 * 1024


class ResponseSink:
    """Receives one response. Exactly one of `on_end` or `on_lost` is called, once."""

    __slots__ = ()

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        pass

    def on_body(self, data: bytes) -> None:
        pass

    def on_end(self) -> None:
        pass

    def on_lost(self, reason: str) -> None:
        pass


class BufferedResponse(ResponseSink):
    """Collects a whole (small) response into a future: (status, headers, body)."""

    __slots__ = ("future", "status", "headers", "_body", "_max")

    def __init__(self, future: asyncio.Future, max_body_bytes: int = 8 << 20) -> None:
        self.future = future
        self.status = 0
        self.headers: dict[str, str] = {}
        self._body = bytearray()
        self._max = max_body_bytes

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def on_body(self, data: bytes) -> None:
        if len(self._body) + len(data) > self._max:
            raise HttpProtocolError("response body too large")
        self._body += data

    def on_end(self) -> None:
        if not self.future.done():
            self.future.set_result((self.status, self.headers, bytes(self._body)))

    def on_lost(self, reason: str) -> None:
        if not self.future.done():
            self.future.set_exception(ConnectionError(reason))


_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _IDLE = range(5)


class HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time; `closed` tells the owner to reconnect."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._sink: ResponseSink | None = None
        self._mode = _IDLE
        self._head = b""
        self._remaining = 0
        self._chunked: ChunkedDecoder | None = None
        self._keep_alive = True

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._sink is None:
            self._fail("bytes received with no request outstanding")
            return
        try:
            self._feed(data)
        except HttpProtocolError as exc:
            self._fail(f"protocol error: {exc}")
        except Exception as exc:  # a sink bug must not leave the connection half-parsed
            self._fail(f"response handling failed: {exc!r}")

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost reports to the sink

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        sink, self._sink = self._sink, None
        if sink is None:
            return
        if self._mode == _UNTIL_CLOSE:
            sink.on_end()  # a close-delimited body ends exactly like this
        else:
            sink.on_lost(f"connection closed mid-response ({exc!r})" if exc else
                         "connection closed mid-response")

    # -- owner API
    @property
    def busy(self) -> bool:
        """A response is still being read (its sink has not been told the end yet)."""
        return self._sink is not None

    def send(self, request: bytes, sink: ResponseSink) -> None:
        """Write a complete request; the response goes to `sink`."""
        if self.closed or self.transport is None:
            raise ConnectionError("connection is closed")
        if self._sink is not None:
            raise RuntimeError("a request is already outstanding on this connection")
        self._sink = sink
        self._mode = _HEAD
        self._head = b""
        self.transport.write(request)

    def abort(self) -> None:
        """Drop the connection now (timeouts, shutdown); the sink is told it was lost."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- parsing
    def _fail(self, reason: str) -> None:
        sink, self._sink = self._sink, None
        self.abort()
        if sink is not None:
            sink.on_lost(reason)

    def _finish(self) -> None:
        sink, self._sink = self._sink, None
        self._mode = _IDLE
        if not self._keep_alive:
            self.close()
        if sink is not None:
            sink.on_end()

    def _feed(self, data: bytes) -> None:
        while data:
            mode = self._mode
            if mode == _HEAD:
                data = self._parse_head(data)
            elif mode == _CHUNKED:
                decoder = self._chunked
                for piece in decoder.feed(data):  # type: ignore[union-attr]
                    self._sink.on_body(piece)  # type: ignore[union-attr]
                if not decoder.done:  # type: ignore[union-attr]
                    return
                data = decoder.tail  # type: ignore[union-attr]
                self._finish()
            elif mode == _LENGTH:
                if len(data) < self._remaining:
                    self._remaining -= len(data)
                    self._sink.on_body(data)  # type: ignore[union-attr]
                    return
                self._sink.on_body(data[:self._remaining])  # type: ignore[union-attr]
                data = data[self._remaining:]
                self._finish()
            elif mode == _UNTIL_CLOSE:
                self._sink.on_body(data)  # type: ignore[union-attr]
                return
            else:
                raise HttpProtocolError("bytes after the end of the response")

    def _parse_head(self, data: bytes) -> bytes:
        buf = self._head + data if self._head else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise HttpProtocolError("response head too large")
            self._head = buf
            return b""
        self._head = b""
        lines = buf[:end].split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"bad status line {lines[0][:60]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise HttpProtocolError(f"bad header line {line[:60]!r}")
            key = name.lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        rest = buf[end + 4:]
        if 100 <= status < 200:
            return rest  # interim response: the real head follows
        connection = headers.get("connection", "").lower()
        if parts[0] == b"HTTP/1.0":
            self._keep_alive = "keep-alive" in connection
        else:
            self._keep_alive = "close" not in connection
        self._sink.on_head(status, headers)  # type: ignore[union-attr]
        if status in (204, 304):
            self._finish()
        elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
            self._mode = _CHUNKED
            self._chunked = ChunkedDecoder()
        elif "content-length" in headers:
            length_text = headers["content-length"]
            if not length_text.isdigit():
                raise HttpProtocolError(f"bad Content-Length {length_text[:40]!r}")
            self._remaining = int(length_text)
            self._mode = _LENGTH
            if self._remaining == 0:
                self._finish()
        else:
            self._mode = _UNTIL_CLOSE
            self._keep_alive = False
        return rest


# -------------------------------------------------------------------------------------- endpoint
class Endpoint(NamedTuple):
    host: str
    port: int
    base_path: str  # "" or "/prefix" (no trailing slash)
    host_header: str
    ssl: _ssl.SSLContext | None


def parse_endpoint(url: str) -> Endpoint:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must be http://host[:port][/path] or https://…, got {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    default_port = port == (443 if tls else 80)
    host_text = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return Endpoint(
        host=parts.hostname,
        port=port,
        base_path=parts.path.rstrip("/"),
        host_header=host_text if default_port else f"{host_text}:{port}",
        ssl=_ssl.create_default_context() if tls else None,
    )


def build_request(ep: Endpoint, method: str, path: str, body: bytes | None,
                  headers: dict[str, str] | None = None) -> bytes:
    """Serialise a request once; callers re-send the same bytes turn after turn."""
    lines = [f"{method} {ep.base_path}{path} HTTP/1.1", f"Host: {ep.host_header}"]
    for name, value in (headers or {}).items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


async def open_connection(ep: Endpoint, timeout_secs: float) -> HttpConnection:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_secs):
        _, conn = await loop.create_connection(HttpConnection, ep.host, ep.port, ssl=ep.ssl)
    return conn
