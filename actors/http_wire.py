"""HTTP/1.1 wire decoders that work on bytes as they arrive: chunked bodies and Server-Sent Events.

Owns: `ChunkedDecoder` (`Transfer-Encoding: chunked`), `SSEParser` (WHATWG event framing) and the
error both raise. Never does: sockets, requests or what the events mean (actors/http1.py feeds
them; the provider client and the load generators read what they return).
"""
from __future__ import annotations

import re
from typing import NamedTuple

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
