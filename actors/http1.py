"""A minimal HTTP/1.1 client on asyncio.Protocol, with incremental chunked and SSE decoding.

Owns: one keep-alive connection (`HttpConnection`) that carries one request at a time and hands the
response to a `ResponseSink` as it arrives; the chunked transfer decoder; the SSE event parser.
Never does: retries, redirects, pipelining, TLS policy, timeouts (the caller arms its own timer and
aborts the connection), or any interpretation of what the events mean.

Used by the provider client (every model call of every actor) and by the load generators. Why not
aiohttp's client: both sit on the hot path of a turn, and the load generator shares two cores
with the server under test, so the cost per request must be small. A Protocol that feeds bytes straight into the decoders, with no
StreamReader, no per-line coroutine wake-ups and no header multidicts, costs ~0.43 ms of CPU per
10-event SSE turn at 1000 connections where aiohttp's client costs ~1.0 ms (and lags the loop).
"""
from __future__ import annotations

import asyncio
import re
import ssl as _ssl
from typing import NamedTuple
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_LINE_BYTES = 4 * 1024
_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")


class HttpProtocolError(Exception):
    """The peer sent bytes that are not valid HTTP/1.1 (or an SSE stream we cannot frame)."""


# --------------------------------------------------------------------------------------- chunked
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedDecoder:
    """Incremental `Transfer-Encoding: chunked` decoder.

    `feed(data)` returns the body pieces found so far (possibly none); after the last chunk and
    its trailers `done` is True and `tail` holds any bytes past the end of the message.
    """

    __slots__ = ("_buf", "_state", "_remaining", "done", "tail")

    def __init__(self) -> None:
        self._buf = b""
        self._state = _SIZE
        self._remaining = 0
        self.done = False
        self.tail = b""

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        if self.done:
            self.tail += data
            return out
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos, n = 0, len(buf)
        while pos < n:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, n - pos)
                # Slicing the whole buffer returns the same object in CPython: no copy in the
                # common case of one chunk per read.
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if n - pos < 2:
                    if buf[pos:] != b"\r":
                        raise HttpProtocolError("chunk data not followed by CRLF")
                    self._buf = buf[pos:]
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise HttpProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._state = _SIZE
            else:  # _SIZE or _TRAILER: both are CRLF-terminated lines
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > MAX_LINE_BYTES:
                        raise HttpProtocolError("chunk line too long")
                    self._buf = buf[pos:]
                    break
                line = buf[pos:eol]
                pos = eol + 2
                if state == _TRAILER:
                    if not line:
                        self._state = _DONE
                        self.done = True
                        self.tail = buf[pos:]
                        break
                    continue  # trailer fields are ignored
                size_text = line.split(b";", 1)[0].strip()  # drop chunk extensions
                # int(x, 16) would also accept "0x", "+", "_": validate first.
                if not _HEX_SIZE.fullmatch(size_text):
                    raise HttpProtocolError(f"bad chunk size {line[:40]!r}")
                size = int(size_text, 16)
                if size == 0:
                    self._state = _TRAILER
                else:
                    self._state = _DATA
                    self._remaining = size
        return out


# ------------------------------------------------------------------------------------------- SSE
class SSEEvent(NamedTuple):
    event: bytes  # b"message" when the block had no `event:` field
    data: bytes  # `data:` lines joined by b"\n"
    id: bytes | None  # last event id seen on the stream so far


class SSEParser:
    """Incremental Server-Sent Events parser working on bytes (WHATWG framing).

    Lines end with LF, CRLF or CR; a blank line ends an event; lines starting with ':' are
    comments (counted in `comments`, never returned). Deviation from the spec, on purpose: a block
    with an `event:` field but no `data:` is still dispatched, because a terminal event such as
    `turn.cancelled` must end the turn even if the server sends it without data.
    Values stay bytes: the caller decodes only the few events whose payload it needs.
    """

    __slots__ = ("_buf", "_cr", "comments", "last_id", "max_event_bytes")

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        self._buf = b""
        self._cr = False  # the previous feed ended in CR: it may be the first half of CRLF
        self.comments = 0
        self.last_id: bytes | None = None
        self.max_event_bytes = max_event_bytes

    def feed(self, data: bytes) -> list[SSEEvent]:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if b"\r" in data:
            if data.endswith(b"\r"):
                self._cr = True
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + data if self._buf else data
        events: list[SSEEvent] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            event = self._parse_block(buf[start:end])
            if event is not None:
                events.append(event)
            start = end + 2
        self._buf = buf[start:] if start else buf
        if len(self._buf) > self.max_event_bytes:
            raise HttpProtocolError("SSE event too large")
        return events

    def _parse_block(self, block: bytes) -> SSEEvent | None:
        name: bytes | None = None
        data_lines: list[bytes] = []
        for line in block.split(b"\n"):
            if not line:
                continue  # a leading LF left over from a blank line between events
            if line[0] == 0x3A:  # ':'
                self.comments += 1
                continue
            field, sep, value = line.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data_lines.append(value)
            elif field == b"event":
                name = value
            elif field == b"id":
                if b"\0" not in value:
                    self.last_id = value
            # `retry` and unknown fields are ignored, as the spec says.
        if name is None and not data_lines:
            return None
        return SSEEvent(name or b"message", b"\n".join(data_lines), self.last_id)


# ------------------------------------------------------------------------------------ connection
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
