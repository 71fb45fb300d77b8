"""The checkpoint routes without aiohttp: a front protocol on every gateway connection.

`PUT /v1/sessions/{sid}/checkpoints/{key}` and `GET /v1/sessions/{sid}/checkpoints/latest` are
what an external agent runtime calls after every step, so their cost per request bounds the
checkpoint rate on a small machine. Measured here (a PUT of 21 KB answered with a small JSON body,
10 keep-alive connections): aiohttp's server took 170–220 µs of CPU per request, a bare
asyncio.Protocol about 40 µs. So each connection starts on `FrontConnection`, which parses plain
requests itself and serves those two routes with the same checks, answers, access rows and
metrics as the aiohttp handlers (they share gateway/history.py and gateway/access.py).

Anything else — another route, a query string, a percent-escape, chunked bodies, `Expect`,
`Upgrade`, `Connection: close`, HTTP/1.0, a body over the checkpoint limit, a head we cannot
parse — goes to aiohttp on the same connection: the front hands its transport, with the bytes it
holds, to an aiohttp request handler, which serves that connection from then on. So aiohttp
remains the one place that answers malformed or unusual HTTP.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Callable

import orjson

from agentos import service
from gateway import access
from gateway.answer_polling import AnswerPolling
from gateway.errors import ApiError, error_body
from gateway.history import LATEST_ROUTE, PUT_ROUTE, check_key
from gateway.tenancy import check_session_id, internal

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.latest_checkpoints import Checkpoint

_TARGET = re.compile(r"/v1/sessions/([^/?#%]+)/checkpoints/([^/?#%]+)")
MAX_HEAD_BYTES = 8190                      # aiohttp's own limit: a longer head is its to refuse
IDLE_SECS = 75.0                           # aiohttp's keep-alive timeout
SWEEP_SECS = 15.0
_PREFIXES = (b"PUT /v1/sessions/", b"GET /v1/sessions/")
_PREFIX_BYTES = len(_PREFIXES[0])
_HAND_OVER_HEADERS = frozenset({"transfer-encoding", "expect", "upgrade"})
# What aiohttp refuses in a head, so the fast path hands it over rather than accept it: a header
# name that is not a token (RFC 9110), a control character (HTAB aside), a CR or LF on its own
# (and, below, a request without Host).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")      # matched against lowercased names
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n")

log = logging.getLogger("agent-os.gateway")


_PHRASES = {s.value: s.phrase for s in HTTPStatus}   # looked up per answer: an Enum call is not cheap


def _phrase(status: int) -> str:
    return _PHRASES.get(status, "Unknown")


class _Request:
    __slots__ = ("method", "route", "sid", "key", "authorization", "length", "started")

    def __init__(self, method: str, route: str, sid: str, key: str, authorization: str, length: int) -> None:
        self.method, self.route, self.sid, self.key = method, route, sid, key
        self.authorization, self.length = authorization, length
        self.started = time.monotonic()


class FrontServer:
    """The gateway's listening socket: connections start on the fast path (see the module doc)."""

    def __init__(self, gateway: "Gateway", aiohttp_factory: Callable[[], asyncio.Protocol]) -> None:
        self.gateway = gateway
        self.aiohttp_factory = aiohttp_factory
        self.connections: set[FrontConnection] = set()
        self.server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task | None = None
        self._date = (0, "")
        self.polling = AnswerPolling(gateway.config.gateway.poll_after_answer_usecs / 1e6)

    async def start(self, host: str, port: int, backlog: int) -> int:
        loop = self.polling.loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: FrontConnection(self), host, port, backlog=backlog,
                                               reuse_address=True)
        self._sweeper = service.lifelong(self._sweep())
        return self.server.sockets[0].getsockname()[1]

    async def close(self, grace_secs: float = 5.0) -> None:
        """Stop listening; close idle connections now and busy ones once answered (or after the grace)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + grace_secs
        while True:
            for conn in list(self.connections):
                if conn.request is None:
                    conn.close()
            if not self.connections or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.close()

    def date(self) -> str:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECS)
            cutoff = time.monotonic() - IDLE_SECS
            for conn in list(self.connections):
                if conn.request is None and conn.last_active < cutoff:
                    conn.close()


class FrontConnection(asyncio.Protocol):
    def __init__(self, front: FrontServer) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: _Request | None = None      # parsed, waiting for its body
        self.request: _Request | None = None   # being answered
        self.task: asyncio.Future | None = None
        self.paused = False
        self.eof = False
        self.write_paused = False
        self.last_active = time.monotonic()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.front.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.last_active = time.monotonic()
        if self.request is None and not self.write_paused:
            self._next()
        if (not self.paused and self.transport is not None
                and len(self.buf) > self.front.gateway.config.storage.max_checkpoint_bytes + MAX_HEAD_BYTES):
            self.paused = True            # pipelined requests pile up: let TCP push back
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        return self.request is not None   # half-closed: answer what is in hand and queued, then close

    def pause_writing(self) -> None:
        self.write_paused = True          # a client not reading its answers: read no more requests

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.request is None:
            self._next()

    def connection_lost(self, exc) -> None:
        self.front.connections.discard(self)
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- requests ---------------------------------------------------------------------------

    def _next(self) -> None:
        """Take the next whole request off the buffer: answer it here or hand the connection over."""
        if self.paused and self.transport is not None and not self.write_paused:
            self.paused = False
            self.transport.resume_reading()
        while self.request is None and self.transport is not None and not self.write_paused:
            if self.head is None:
                buf = self.buf
                if not (buf.startswith(_PREFIXES) if len(buf) >= _PREFIX_BYTES
                        else any(prefix.startswith(buf) for prefix in _PREFIXES)):
                    self._hand_over()     # not ours (or not HTTP): aiohttp answers it at once
                    return
                end = self.buf.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
                if end < 0:
                    # a head ended by bare LFs never shows CRLF CRLF: aiohttp refuses it at once
                    if len(self.buf) > MAX_HEAD_BYTES or self.buf.find(b"\n\n", 0, MAX_HEAD_BYTES) >= 0:
                        self._hand_over()
                    return
                self.head = self._parse_head(self.buf[:end])
                if self.head is None:
                    self._hand_over()
                    return
                del self.buf[:end + 4]
            length = self.head.length
            if len(self.buf) < length:
                return
            if len(self.buf) == length:
                payload = bytes(self.buf)      # the usual case, the body is all there is: one copy
                self.buf.clear()
            else:
                with memoryview(self.buf) as view:
                    payload = bytes(view[:length])
                del self.buf[:length]
            request, self.head = self.head, None
            if request.method == "GET" and self._answer_cached(request):
                continue          # answered already: the next request may be whole in the buffer too
            self.request = request
            if request.method == "PUT":
                self._put(request, payload)   # answered now if refused: then the next request may go on
            else:
                self.task = asyncio.ensure_future(self._answer(request, payload))  # held: the loop keeps weak refs

    def _parse_head(self, raw: bytes | bytearray) -> _Request | None:
        """The request if it is one of ours in its plain form, else None (aiohttp's to serve)."""
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
        if _CONTROL.search(text) is not None:
            return None
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] != "HTTP/1.1" or parts[0] not in ("PUT", "GET"):
            return None
        method, target = parts[0], parts[1]
        match = _TARGET.fullmatch(target)
        if match is None:
            return None
        sid, key = match.group(1), match.group(2)
        if method == "GET" and key != "latest":
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            name = name.lower()
            if not sep or _TOKEN.fullmatch(name) is None or name in headers or name in _HAND_OVER_HEADERS:
                return None
            headers[name] = value.strip()
        if "host" not in headers:
            return None               # HTTP/1.1 requires it: aiohttp answers 400
        connection = headers.get("connection")
        if connection is not None and connection.lower() != "keep-alive":
            return None
        raw_length = headers.get("content-length", "0" if method == "GET" else "")
        if not raw_length.isdigit() or len(raw_length) > 12:
            return None
        length = int(raw_length)
        if length > (self.front.gateway.config.storage.max_checkpoint_bytes if method == "PUT" else 0):
            return None
        return _Request(method, PUT_ROUTE if method == "PUT" else LATEST_ROUTE, sid, key,
                        headers.get("authorization", ""), length)

    def _answer_cached(self, request: _Request) -> bool:
        """A GET of a checkpoint the gateway holds, answered in this call — no task, no wait (an
        agent runtime reads its latest checkpoint before each step). False leaves it to `_answer`:
        a miss, which asks the store, or a request with something to refuse."""
        gateway = self.front.gateway
        try:
            tenant = gateway.tenant_for(request.authorization)
            sid = internal(tenant, check_session_id(request.sid))
        except ApiError:
            return False
        latest = gateway.history.latest.hit(sid)
        if latest is None:
            return False
        self.transport.writelines((self._checkpoint_head(latest), latest.payload))
        gateway.access.record(request.method, request.route, 200, tenant, request.sid, request.started)
        self.last_active = time.monotonic()
        self.front.polling.answered()
        return True

    def _put(self, request: _Request, payload: bytes) -> None:
        """A checkpoint PUT without a task: handed to the log with a callback that answers it in the
        loop iteration its fdatasync returns in (a task would wake one iteration later, and cost
        one to start)."""
        gateway = self.front.gateway
        tenant = ""
        try:
            tenant = gateway.tenant_for(request.authorization)
            sid = internal(tenant, check_session_id(request.sid))
            gateway.history.save_checkpoint_then(
                tenant, sid, request.sid, check_key(request.key), payload,
                lambda body, error: self._put_done(request, tenant, body, error))
        except ApiError as exc:
            self._done(request, tenant, exc.status, self._error(exc))

    def _put_done(self, request: _Request, tenant: str, body: dict | None, error: Exception | None) -> None:
        try:
            self._answer_put(request, tenant, body, error)
        except Exception:
            # A bug of ours while answering (this runs as the log's callback, which only logs what
            # it raises): the client must not wait for an answer that will never come, nor the
            # requests queued behind it on the connection.
            log.exception("answering %s %s/%s failed; closing its connection", request.method, request.sid,
                          request.key)
            self.request = None
            self.close()          # what was written goes first; what is queued behind it is not read
            return
        self._go_on()

    def _answer_put(self, request: _Request, tenant: str, body: dict | None, error: Exception | None) -> None:
        if error is None:
            self._done(request, tenant, 200, self._response(200, "application/json", orjson.dumps(body)))
        elif isinstance(error, ApiError):
            self._done(request, tenant, error.status, self._error(error))
        else:
            log.error("unhandled error in %s %s/%s", request.method, request.sid, request.key, exc_info=error)
            self._done(request, tenant, 500, self._response(500, "application/json",
                                                            error_body("internal", "internal error")))

    async def _answer(self, request: _Request, payload: bytes) -> None:
        """A GET the gateway's cache could not answer: it asks the store."""
        gateway = self.front.gateway
        tenant = ""
        status, response = access.CLIENT_CLOSED, b""   # unless answered below (a cancelled task is not)
        try:
            try:
                tenant = gateway.tenant_for(request.authorization)
                latest = await gateway.history.latest_checkpoint(tenant, internal(tenant, check_session_id(request.sid)))
                status, response = 200, self._checkpoint_head(latest) + latest.payload
            except ApiError as exc:
                status, response = exc.status, self._error(exc)
            except Exception:
                log.exception("unhandled error in %s %s/%s", request.method, request.sid, request.key)
                status = 500
                response = self._response(500, "application/json", error_body("internal", "internal error"))
        finally:
            self._done(request, tenant, status, response)
        self._go_on()

    def _done(self, request: _Request, tenant: str, status: int, response: bytes) -> None:
        """Send the answer to `request` unless its client left (or it has none), and count it."""
        if not response or self.transport is None or self.transport.is_closing():
            status = access.CLIENT_CLOSED
        else:
            self.transport.write(response)
        self.front.gateway.access.record(request.method, request.route, status, tenant, request.sid, request.started)
        self.request = None
        self.last_active = time.monotonic()
        self.front.polling.answered()

    def _go_on(self) -> None:
        """After an answer given later than its request came: the requests that came in behind it."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self.write_paused:
            self._next()          # requests that came in behind this one, a half-closed client's too
        if self.eof and self.request is None:
            self.close()          # half-closed and nothing left whole to answer

    def _error(self, exc: ApiError) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in exc.headers.items())
        return self._response(exc.status, "application/json", error_body(exc.code, exc.message), extra)

    def _response(self, status: int, content_type: str, body: bytes, extra: str = "") -> bytes:
        return self._head(status, content_type, len(body), extra) + body

    def _checkpoint_head(self, latest: "Checkpoint") -> bytes:
        """The head of a 200 answering GET …/checkpoints/latest (the payload follows it as is)."""
        return self._head(200, "application/octet-stream", len(latest.payload),
                          f"X-Checkpoint-Key: {latest.key}\r\nX-Checkpoint-Seq: {latest.seq}\r\n")

    def _head(self, status: int, content_type: str, length: int, extra: str = "") -> bytes:
        return (f"HTTP/1.1 {status} {_phrase(status)}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {length}\r\nDate: {self.front.date()}\r\nServer: agent-os\r\n{extra}\r\n"
                ).encode("latin-1")

    def _hand_over(self) -> None:
        """From here on aiohttp serves this connection, starting with the bytes held here."""
        transport, data = self.transport, bytes(self.buf)
        self.front.connections.discard(self)
        self.transport, self.buf = None, bytearray()
        if self.paused:
            transport.resume_reading()
        handler = self.front.aiohttp_factory()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if data:
            handler.data_received(data)
