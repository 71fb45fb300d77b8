"""How a load-generator worker talks to one kind of server, and how its answers are classified.

`AgentOSTarget` speaks our SSE turn API; `OpencodeTarget` speaks opencode's server API (a session
per worker, `POST /session/{id}/message` blocking until the whole turn is done). A new target is a
`Target` subclass added to `TARGETS`. The worker loop and the window live in `bench.loadgen`.
"""
from __future__ import annotations

import asyncio
from time import perf_counter
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import quote

import orjson

from actors.http1 import (
    BufferedResponse, Endpoint, HttpConnection, ResponseSink, build_request, open_connection, parse_endpoint,
)
from actors.http_wire import SSEParser
from bench.stats import Attempt

if TYPE_CHECKING:
    from bench.loadgen import LoadConfig

_TERMINAL = {b"turn.completed": "ok", b"turn.failed": "failed", b"turn.cancelled": "cancelled"}


class SetupError(Exception):
    """A worker could not prepare its session; the worker retries after a pause."""


def _error_message(body: bytes) -> str:
    """`{"error": {"code", "message"}}` → "code: message"; anything else → its text, shortened."""
    try:
        err = orjson.loads(body)["error"]
        return f"{err.get('code')}: {err.get('message')}"
    except Exception:  # not the JSON error shape: show the raw text instead
        return body[:200].decode("utf-8", "replace")


class TurnSink(ResponseSink):
    """Turns one response into one Attempt; targets subclass it for their success bodies."""

    __slots__ = ("future", "start", "first_delta", "end", "kind", "status", "message", "_body")
    max_body_bytes: ClassVar[int] = 64 * 1024  # error bodies: enough for the message

    def __init__(self, future: asyncio.Future) -> None:
        self.future = future
        self.start = 0.0
        self.first_delta: float | None = None
        self.end = 0.0
        self.kind: str | None = None  # set once the outcome is known, before the response ends
        self.status = 0
        self.message: str | None = None
        self._body = bytearray()

    def _resolve(self, kind: str, message: str | None = None, end: float | None = None) -> None:
        if not self.future.done():
            self.future.set_result(Attempt(kind, self.start, self.first_delta,
                                           end or perf_counter(), self.status, message))

    def _collect(self, data: bytes) -> None:
        if len(self._body) < self.max_body_bytes:
            self._body += data

    def _resolve_error_status(self) -> None:
        kind = "rejected_429" if self.status == 429 else "http_error"
        self._resolve(kind, f"HTTP {self.status} {_error_message(bytes(self._body))}")

    def on_lost(self, reason: str) -> None:
        if self.kind is not None:  # the outcome arrived; only the connection's tail was lost
            self._resolve(self.kind, self.message, self.end)
        else:
            self._resolve("broken", reason)

    def on_timeout(self, conn: HttpConnection, timeout_secs: float) -> None:
        if self.kind is not None:
            self._resolve(self.kind, self.message, self.end)
        else:
            self._resolve("timeout", f"no outcome within {timeout_secs:g}s")
        conn.abort()  # the connection is in an unknown state: never reuse it


class SSETurnSink(TurnSink):
    """The Agent OS contract: 200 + text/event-stream, deltas, exactly one terminal event."""

    __slots__ = ("_sse",)

    def __init__(self, future: asyncio.Future) -> None:
        super().__init__(future)
        self._sse: SSEParser | None = None

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        if 200 <= status < 300 and headers.get("content-type", "").startswith("text/event-stream"):
            self._sse = SSEParser()

    def on_body(self, data: bytes) -> None:
        if self._sse is None:
            self._collect(data)
            return
        if self.kind is not None:
            return  # anything after the terminal event is not part of the turn
        for event in self._sse.feed(data):
            name = event.event
            if name == b"delta":
                if self.first_delta is None:
                    self.first_delta = perf_counter()
            elif name in _TERMINAL:
                self.end = perf_counter()
                self.kind = _TERMINAL[name]
                if self.kind == "failed":
                    self.message = _error_message(event.data)
                elif self.kind == "cancelled":
                    self.message = "turn.cancelled"
                return

    def on_end(self) -> None:
        if self._sse is not None:
            if self.kind is not None:
                self._resolve(self.kind, self.message, self.end)
            else:
                self._resolve("broken", "stream ended before a terminal event")
        elif 200 <= self.status < 300:
            self._resolve("broken", f"HTTP {self.status} without text/event-stream")
        else:
            self._resolve_error_status()


class JsonTurnSink(TurnSink):
    """A blocking turn that answers with one JSON document (opencode): only total time exists."""

    __slots__ = ()
    max_body_bytes: ClassVar[int] = 16 << 20  # the whole turn's messages come back here

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        self._collect(data)

    def on_end(self) -> None:
        if not 200 <= self.status < 300:
            self._resolve_error_status()
            return
        try:
            error = (orjson.loads(self._body).get("info") or {}).get("error")
        except Exception:
            self._resolve("broken", "response is not a JSON object")
            return
        if not error:
            self._resolve("ok")
        elif isinstance(error, dict):  # opencode: {"name": …, "data": {"message": …}}
            data = error.get("data")
            detail = data.get("message") if isinstance(data, dict) else data
            self._resolve("failed", f"{error.get('name')}: {detail}")
        else:
            self._resolve("failed", str(error))


# ------------------------------------------------------------------------------------- targets
class Worker:
    """Per-worker state a target keeps: its connection, its session and its request bytes."""

    __slots__ = ("index", "conn", "session_id", "request")

    def __init__(self, index: int, session_id: str, request: bytes = b"") -> None:
        self.index, self.session_id, self.request = index, session_id, request
        self.conn: HttpConnection | None = None


class Target:
    """How a worker talks to one kind of server — the extension point for other servers.

    A target prepares a worker's session (`open_worker`, may do requests; raise SetupError to have
    it retried), runs one turn and returns its Attempt (`run_turn`, never raises for a server
    fault), and releases the worker (`close_worker`, synchronous, also runs on cancellation).
    `close` releases shared resources once at the end. Add a new target to TARGETS.
    """

    name: ClassVar[str] = ""

    def __init__(self, cfg: LoadConfig, **options: str) -> None:
        if options:
            raise ValueError(f"target {self.name!r} takes no options, got {sorted(options)}")
        self.cfg = cfg
        self.endpoint: Endpoint = parse_endpoint(cfg.url)
        self.headers = {"Content-Type": "application/json"}
        if cfg.api_key:
            self.headers["Authorization"] = f"Bearer {cfg.api_key}"

    async def open_worker(self, index: int) -> Worker:
        raise NotImplementedError

    async def run_turn(self, worker: Worker) -> Attempt:
        raise NotImplementedError

    def close_worker(self, worker: Worker) -> None:
        if worker.conn is not None:
            worker.conn.close()
            worker.conn = None

    async def close(self) -> None:
        pass

    # -- helpers for targets on the raw client
    async def _connect(self, worker: Worker) -> HttpConnection:
        if worker.conn is None or worker.conn.closed:
            worker.conn = await open_connection(self.endpoint, self.cfg.connect_timeout_secs)
        return worker.conn

    async def _exchange(self, worker: Worker, request: bytes, sink: TurnSink) -> Attempt:
        """Send `request` on the worker's connection; the sink classifies, a timer bounds it."""
        t0 = perf_counter()
        try:
            conn = await self._connect(worker)
        except (OSError, TimeoutError) as exc:
            return Attempt("broken", t0, None, perf_counter(), 0, f"connect failed: {exc!r}",
                           connect_failed=True)
        timeout = self.cfg.turn_timeout_secs
        timer = asyncio.get_running_loop().call_later(timeout, sink.on_timeout, conn, timeout)
        sink.start = perf_counter()
        try:
            conn.send(request, sink)
            return await sink.future
        finally:
            timer.cancel()

    async def _request_json(self, worker: Worker, method: str, path: str, body: bytes) -> dict:
        """A small setup request; failures become SetupError."""
        try:
            conn = await self._connect(worker)
            future = asyncio.get_running_loop().create_future()
            conn.send(build_request(self.endpoint, method, path, body, self.headers),
                      BufferedResponse(future))
            async with asyncio.timeout(self.cfg.turn_timeout_secs):
                status, _, payload = await future
        except (OSError, TimeoutError) as exc:
            if worker.conn is not None:
                worker.conn.abort()
            raise SetupError(f"{method} {path}: {exc!r}") from exc
        if not 200 <= status < 300:
            raise SetupError(f"{method} {path}: HTTP {status} {_error_message(payload)}")
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise SetupError(f"{method} {path}: response is not JSON") from exc


class AgentOSTarget(Target):
    """POST /v1/sessions/{sid}/turns, SSE back. Sessions need no setup: the id is ours."""

    name = "agentos"

    async def open_worker(self, index: int) -> Worker:
        sid = f"{self.cfg.session_prefix}-{index}"
        headers = dict(self.headers, Accept="text/event-stream")
        body = orjson.dumps({"input": self.cfg.input_text})
        path = f"/v1/sessions/{quote(sid, safe='')}/turns"
        return Worker(index, sid, build_request(self.endpoint, "POST", path, body, headers))

    async def run_turn(self, worker: Worker) -> Attempt:
        future = asyncio.get_running_loop().create_future()
        return await self._exchange(worker, worker.request, SSETurnSink(future))


class OpencodeTarget(Target):
    """opencode serve: POST /session makes a session, POST /session/{id}/message blocks for the
    whole turn and answers JSON — no TTFT. Options: provider_id, model_id."""

    name = "opencode"

    def __init__(self, cfg: LoadConfig, provider_id: str = "mock", model_id: str = "mock") -> None:
        super().__init__(cfg)
        self.provider_id, self.model_id = provider_id, model_id

    async def open_worker(self, index: int) -> Worker:
        worker = Worker(index, "")
        title = orjson.dumps({"title": f"{self.cfg.session_prefix}-{index}"})
        created = await self._request_json(worker, "POST", "/session", title)
        if not isinstance(created, dict) or not isinstance(created.get("id"), str):
            self.close_worker(worker)
            raise SetupError("POST /session: no session id in the response")
        worker.session_id = created["id"]
        body = orjson.dumps({
            "parts": [{"type": "text", "text": self.cfg.input_text}],
            "model": {"providerID": self.provider_id, "modelID": self.model_id},
        })
        path = f"/session/{quote(worker.session_id, safe='')}/message"
        worker.request = build_request(self.endpoint, "POST", path, body, self.headers)
        return worker

    async def run_turn(self, worker: Worker) -> Attempt:
        future = asyncio.get_running_loop().create_future()
        return await self._exchange(worker, worker.request, JsonTurnSink(future))


TARGETS: dict[str, type[Target]] = {"agentos": AgentOSTarget, "opencode": OpencodeTarget}


def make_target(cfg: LoadConfig) -> Target:
    return TARGETS[cfg.target](cfg, **cfg.target_options)
