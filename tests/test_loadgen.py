"""Tests for the closed-loop load generator (bench/loadgen.py) and its HTTP/SSE client.

The client is run against raw asyncio servers (each body framing) and against an in-process
aiohttp fake of the turns API whose behaviour is fixed per session id, so every attempt's class
can be checked exactly. (Its wire decoders are tested in test_http1_wire.py.)
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import defaultdict

import orjson
import pytest
import uvloop
from aiohttp import web

from bench import loadgen
from bench.loadgen import LoadConfig, run_load
from bench.targets import AgentOSTarget, OpencodeTarget
from bench.stats import Attempt, percentile, summarize, window_report
from test_http1_wire import chunk_encode

pytestmark = pytest.mark.timeout(60)


def arun(coro):
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


# ------------------------------------------------------------------------------------ statistics
def test_nearest_rank_percentiles():
    values = list(range(1, 101))
    assert [percentile(values, q) for q in (50, 95, 99, 100)] == [50, 95, 99, 100]
    assert summarize([3.0]) == {"p50": 3.0, "p95": 3.0, "p99": 3.0, "mean": 3.0, "max": 3.0,
                                "n": 1}
    assert summarize([])["n"] == 0 and summarize([])["p50"] is None
    with pytest.raises(ValueError):
        percentile([], 50)


def test_window_report_counts_only_turns_started_in_window():
    attempts = [
        Attempt("ok", 0.5, 0.6, 1.5),  # started in warm-up: not counted
        Attempt("ok", 1.0, 1.1, 1.4),
        Attempt("rejected_429", 1.2, None, 1.21, 429, "HTTP 429 overloaded: busy"),
        Attempt("http_error", 1.3, None, 1.31, 503, "HTTP 503"),
        Attempt("ok", 2.9, 3.0, 3.5),  # ends in the grace period: counted
        Attempt("ok", 2.9, 3.0, 9.0),  # ends after the grace period: not counted
        Attempt("ok", 3.0, 3.1, 3.2),  # starts at the window end: not counted
    ]
    r = window_report(attempts, 1.0, 3.0, grace_secs=1.0, cpu_secs=0.02)
    assert r["counts"] == {"ok": 2, "rejected_429": 1, "failed": 0, "cancelled": 0,
                           "http_error": 1, "broken": 0, "timeout": 0}
    assert r["http_error_by_status"] == {"503": 1}
    assert r["turns_per_sec"] == 1.0 and r["attempts_per_sec"] == 2.0
    assert r["turn_ms"]["n"] == 2 and r["turn_ms"]["max"] == 600.0
    assert r["rejected_latency_ms"]["n"] == 1
    assert r["loadgen_cpu"]["attempts_ended_in_window"] == 4  # 1.5, 1.4, 1.21, 1.31
    assert r["loadgen_cpu"]["cpu_ms_per_turn"] == 5.0


# ------------------------------------------------------------------- client against raw servers
class RawServer:
    """Answers each request with the next canned (response, then_close) pair, byte by byte."""

    def __init__(self, responses: list[tuple[bytes, bool]]):
        self.responses = responses
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                response, then_close = self.responses.pop(0)
                for i in range(len(response)):
                    writer.write(response[i:i + 1])
                    if i % 16 == 0:
                        await writer.drain()
                await writer.drain()
                if then_close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


SSE_BODY = (b": ping\n\nid: 1\nevent: turn.started\ndata: {}\n\n"
            b"id: 2\nevent: delta\ndata: {\"text\": \"a\"}\n\n"
            b"id: 3\nevent: turn.completed\ndata: {\"usage\": {}}\n\n")
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


async def turns_against(server: RawServer, n: int, **cfg_kw) -> list[Attempt]:
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        cfg = LoadConfig(url=f"http://127.0.0.1:{port}", turn_timeout_secs=5, **cfg_kw)
        target = AgentOSTarget(cfg)
        worker = await target.open_worker(0)
        try:
            return [await target.run_turn(worker) for _ in range(n)]
        finally:
            target.close_worker(worker)
    finally:
        srv.close()
        await srv.wait_closed()


def test_client_chunked_keepalive_reuses_one_connection():
    body = chunk_encode(SSE_BODY, random.Random(1))
    resp = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body
    server = RawServer([(resp, False)] * 3)
    attempts = arun(turns_against(server, 3, api_key="k1", session_prefix="a b"))
    assert [a.kind for a in attempts] == ["ok"] * 3
    assert all(a.start < a.first_delta <= a.end for a in attempts)
    assert server.connections == 1
    req = server.requests[0]
    assert req.startswith(b"POST /v1/sessions/a%20b-0/turns HTTP/1.1\r\n")
    assert b"Authorization: Bearer k1\r\n" in req and req.endswith(b'{"input":"Say something."}')


def test_client_content_length_and_close_delimited_bodies():
    length = SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(SSE_BODY) + SSE_BODY
    close = SSE_HEAD + b"Connection: close\r\n\r\n" + SSE_BODY
    server = RawServer([(length, False), (close, True), (close, True)])
    attempts = arun(turns_against(server, 3))
    assert [a.kind for a in attempts] == ["ok"] * 3
    assert server.connections == 2  # a close-delimited body ends the connection: reconnect


def test_client_classifies_rejections_errors_and_truncation():
    err = b'{"error": {"code": "overloaded", "message": "too many turns"}}'
    rejected = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err))
    server_err = b"HTTP/1.1 503 Unavailable\r\nContent-Length: 4\r\n\r\noops"
    truncated = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"20\r\n" + SSE_BODY[:32]
    garbage = b"NOT-HTTP\r\n\r\n"
    server = RawServer([(rejected, False), (server_err, False), (truncated, True),
                        (garbage, False)])
    attempts = arun(turns_against(server, 4))
    assert [(a.kind, a.status) for a in attempts] == [
        ("rejected_429", 429), ("http_error", 503), ("broken", 200), ("broken", 0)]
    assert server.connections == 2
    assert "bad status line" in attempts[3].message
    assert "overloaded: too many turns" in attempts[0].message
    assert "oops" in attempts[1].message


# ----------------------------------------------------------------- the fake turns API (aiohttp)
def behaviour(sid: str) -> str:
    """Fixed per session: the index after the last '-' picks it."""
    return ("ok", "reject", "fail", "break", "cancel", "hang", "error")[int(sid.rsplit("-")[1]) % 7]


def sse(event_id: int, name: str, data: dict) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event_id, name.encode(), orjson.dumps(data))


class FakeTurnsAPI:
    def __init__(self, delay_secs: float = 0.005, deltas: int = 3):
        self.delay_secs, self.deltas = delay_secs, deltas
        self.peers: dict[str, set] = defaultdict(set)
        self.requests: dict[str, int] = defaultdict(int)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/sessions/{sid}/turns", self.turn)
        return app

    async def turn(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        if (await request.json()).get("input") != "Say something.":
            raise web.HTTPBadRequest()
        self.requests[sid] += 1
        self.peers[sid].add(request.transport.get_extra_info("peername"))
        kind = behaviour(sid)
        if kind == "reject":
            return web.json_response({"error": {"code": "overloaded", "message": "busy"}},
                                     status=429, headers={"Retry-After": "1"})
        if kind == "error":
            await asyncio.sleep(self.delay_secs)  # an instant 500 would make its worker spin
            return web.json_response({"error": {"code": "internal", "message": "bad"}},
                                     status=500)
        try:
            return await self.stream(request, sid, kind)
        except ConnectionResetError:  # the load generator closes connections when it stops
            return web.Response()

    async def stream(self, request: web.Request, sid: str, kind: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b": keep-alive\n\n" + sse(1, "turn.started",
                                                  {"turn_id": "t", "session_id": sid}))
        for i in range(self.deltas):
            await asyncio.sleep(self.delay_secs)
            await resp.write(sse(2 + i, "delta", {"text": f" w{i}"}))
        if kind == "break":
            request.transport.abort()
            await asyncio.Event().wait()  # cancelled by aiohttp when the connection is lost
        elif kind == "hang":
            await asyncio.Event().wait()  # the load generator's timeout ends this one
        elif kind == "fail":
            await resp.write(sse(9, "turn.failed", {"error": {"code": "provider", "message": "x"}}))
        elif kind == "cancel":
            await resp.write(sse(9, "turn.cancelled", {}))
        else:
            await resp.write(sse(9, "turn.completed", {"usage": {}, "durations": {}}))
        await resp.write_eof()
        return resp


async def start_fake(api: FakeTurnsAPI) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(api.app(), handler_cancellation=True, shutdown_timeout=1.0,
                           access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


class RecordingTarget(AgentOSTarget):
    """The extension point in use: the same target, remembering each attempt's session."""

    def __init__(self, cfg: LoadConfig):
        super().__init__(cfg)
        self.log: list[tuple[str, Attempt]] = []

    async def run_turn(self, worker):
        attempt = await super().run_turn(worker)
        self.log.append((worker.session_id, attempt))
        return attempt


def test_load_run_classifies_every_session_exactly():
    api = FakeTurnsAPI()

    async def scenario():
        runner, port = await start_fake(api)
        try:
            # A turn timeout of 1 s: with 0.4 s, a loaded machine once stalled this process that
            # long before a hanging session's first delta, which then timed out without one.
            cfg = LoadConfig(url=f"http://127.0.0.1:{port}", concurrency=14, warmup_secs=0.3,
                             duration_secs=2.0, turn_timeout_secs=1.0, session_prefix="mix")
            target = RecordingTarget(cfg)
            return await run_load(cfg, target), target.log
        finally:
            await runner.cleanup()

    report, log = arun(scenario())
    expected = {"ok": "ok", "reject": "rejected_429", "fail": "failed", "break": "broken",
                "cancel": "cancelled", "hang": "timeout", "error": "http_error"}
    per_session: dict[str, set[str]] = defaultdict(set)
    for sid, attempt in log:
        per_session[sid].add(attempt.kind)
        if attempt.kind in ("ok", "failed", "cancelled", "broken", "timeout"):
            assert attempt.first_delta is not None and attempt.start < attempt.first_delta
        if attempt.kind == "ok":
            assert attempt.first_delta <= attempt.end
    assert {sid: kinds for sid, kinds in per_session.items()} == {
        f"mix-{i}": {expected[behaviour(f"mix-{i}")]} for i in range(14)}
    counts = report["counts"]
    assert all(counts[k] > 0 for k in expected.values()), counts
    assert sum(counts.values()) == report["attempts"] <= len(log)
    assert report["http_error_by_status"] == {"500": counts["http_error"]}
    assert report["ttft_ms"]["n"] == report["turn_ms"]["n"] == counts["ok"]
    assert report["ttft_ms"]["max"] <= report["turn_ms"]["max"]
    assert report["ttft_ms"]["p50"] <= report["turn_ms"]["p50"]
    assert report["rejected_latency_ms"]["n"] == counts["rejected_429"]
    assert counts["timeout"] <= 2 * 3  # two hanging sessions, 1 s each, in a 2 s window
    # 429s pause 50 ms: the rejected worker makes at most ~(0.3 + 2 + 1) s / 50 ms attempts.
    assert api.requests["mix-1"] <= 70
    assert report["turns_per_sec"] == pytest.approx(counts["ok"] / report["window_secs"], 1e-3)
    assert {s["kind"] for s in report["error_samples"]} >= {"failed", "broken", "timeout"}
    assert report["loadgen_cpu"]["cpu_seconds"] >= 0
    # Keep-alive: a session whose turns all end cleanly uses a single connection throughout;
    # a breaking one reconnects (ports can be reused after a reset, so not "every time").
    for sid in ("mix-0", "mix-2", "mix-4", "mix-7"):
        assert len(api.peers[sid]) == 1, (sid, api.peers[sid])
    assert len(api.peers["mix-3"]) > 1


def test_connect_errors_are_broken_and_paced():
    async def scenario():
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()  # nothing listens on this port any more
        cfg = LoadConfig(url=f"http://127.0.0.1:{port}", concurrency=2, warmup_secs=0,
                         duration_secs=0.5, pause_after_connect_error_ms=100)
        return await run_load(cfg)

    report = arun(scenario())
    assert report["counts"]["broken"] == report["attempts"] > 0
    assert report["attempts"] <= 2 * 6  # paced by the 100 ms pause, not a spin
    assert "connect failed" in report["error_samples"][0]["message"]


# ------------------------------------------------------------------------- CLI and sync wrapper
@pytest.fixture()
def fake_in_thread():
    """The fake API on its own loop in a thread, for the synchronous run()/main() entry points."""
    api, ready, box = FakeTurnsAPI(), threading.Event(), {}
    loop = asyncio.new_event_loop()

    def serve():
        asyncio.set_event_loop(loop)
        box["runner"], box["port"] = loop.run_until_complete(start_fake(api))
        ready.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "fake server did not start"
    yield api, box["port"]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    assert not thread.is_alive()


def test_main_writes_json_report(fake_in_thread, tmp_path, capsys):
    _, port = fake_in_thread
    out = tmp_path / "out.json"
    code = loadgen.main(["--url", f"http://127.0.0.1:{port}", "--concurrency", "1",
                         # a window no stall of a loaded machine covers whole (0.5 s could be)
                         "--sessions", "1", "--duration", "1.5", "--warmup", "0.1",
                         "--session-prefix", "cli", "--json", str(out)])
    assert code == loadgen.EXIT_OK
    report = json.loads(out.read_text())
    assert report["counts"]["ok"] == report["attempts"] > 0  # session cli-0 always succeeds
    assert report["config"]["concurrency"] == 1
    assert "ok turns/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--concurrency", "4", "--sessions", "5"],
    ["--concurrency", "0"],
    ["--target", "nope"],
    ["--target-option", "provider_id=x"],  # agentos takes no options
    ["--target", "opencode", "--target-option", "colour=blue"],
    ["--url", "ftp://host/"],
])
def test_main_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        loadgen.main(argv)
    assert exc.value.code == loadgen.EXIT_USAGE


def test_opencode_target_against_fake_opencode():
    seen: dict[str, list] = defaultdict(list)

    async def create(request: web.Request) -> web.Response:
        title = (await request.json())["title"]
        return web.json_response({"id": f"ses_{title}", "title": title})

    async def message(request: web.Request) -> web.Response:
        sid, body = request.match_info["sid"], await request.json()
        seen[sid].append(body)
        await asyncio.sleep(0.01)
        info = {"id": "msg_1", "role": "assistant"}
        if sid.endswith("-1"):
            info["error"] = {"name": "APIError", "data": {"message": "mock down"}}
        return web.json_response({"info": info, "parts": [{"type": "text", "text": "hi"}]})

    async def scenario():
        app = web.Application()
        app.router.add_post("/session", create)
        app.router.add_post("/session/{sid}/message", message)
        runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            cfg = LoadConfig(url=f"http://127.0.0.1:{runner.addresses[0][1]}", concurrency=2,
                             # (a window no stall of a loaded machine covers whole)
                             warmup_secs=0.1, duration_secs=1.5, target="opencode",
                             session_prefix="oc", target_options={"provider_id": "p",
                                                                  "model_id": "m"})
            target = loadgen.make_target(cfg)
            assert isinstance(target, OpencodeTarget)
            return await run_load(cfg, target)
        finally:
            await runner.cleanup()

    report = arun(scenario())
    assert report["counts"]["ok"] > 0 and report["counts"]["failed"] > 0
    assert report["counts"]["ok"] + report["counts"]["failed"] == report["attempts"]
    assert report["ttft_ms"]["n"] == 0 and report["turn_ms"]["n"] == report["counts"]["ok"]
    assert "APIError: mock down" in {s["message"] for s in report["error_samples"]}
    assert seen["ses_oc-0"][0] == {"parts": [{"type": "text", "text": "Say something."}],
                                   "model": {"providerID": "p", "modelID": "m"}}
