"""An OpenAI-compatible mock model server: the load source of every benchmark.

It owns the HTTP side of the mock: the routes, the injected fault responses (429, 500), the
`/stats` counters that let a benchmark check how many streams were really open at once, and the
process (signals, port file, descriptor limit, GC tuning). It never calls a real model and keeps
nothing across restarts. What a request asks for (the timing profile, fault injection, per-request
overrides through a `[[mock key=value ...]]` marker in the last user message) is decided in
bench/mock_plan.py; the bytes on the wire, including broken, never-ending and slow streams, are
built in bench/mock_stream.py.

Run it with `python -m bench.mock_llm --port 0 --port-file PATH`; the profile comes from MOCK_*
environment variables (see MockProfile.from_env).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import resource
import signal
import sys
from collections.abc import Mapping

import orjson
import uvloop
from aiohttp import web

from bench import mock_stream as wire
from bench.mock_plan import BadRequest, MockProfile, plan_reply

__all__ = ["build_app", "expected_text", "main"]

expected_text = wire.expected_text  # tests predict replies with it; it lives beside WORDS

SHUTDOWN_GRACE_SECS = 0.25  # open streams get this long (twice, in aiohttp) after SIGTERM;
                           # a `hang` stream would otherwise hold the exit forever
LISTEN_BACKLOG = 4096      # 1000 clients connect at once; the default 128 drops SYNs
MAX_BODY_BYTES = 64 << 20  # long agent conversations exceed aiohttp's default of 1 MiB
GC_THRESHOLDS = (50_000, 50, 50)  # see _tune_gc
EXIT_OK = 0
EXIT_BAD_CONFIG = 2


# ---------------------------------------------------------------------------------------------
# Server

class Stats:
    """Counters behind /stats. `current` spans handler entry to the last byte (or the abort)."""

    __slots__ = ("completed", "current", "errors", "max_concurrent", "requests", "tokens_out")

    def __init__(self) -> None:
        self.current = 0
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.max_concurrent = self.current
        self.completed = 0  # responses written to the end, whatever their status
        self.errors: dict[str, int] = {}  # injected fault kind (or "400") -> count
        self.tokens_out = 0  # content tokens / tool-call chunks of finished or cut replies

    def as_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "current": self.current,
                "max_concurrent": self.max_concurrent, "completed": self.completed,
                "errors": dict(self.errors), "tokens_out": self.tokens_out}


class MockServer:
    """The request handlers; one instance per app, holding the profile, the dice and Stats."""

    def __init__(self, profile: MockProfile, rng: random.Random | None = None) -> None:
        self.profile = profile
        self.rng = rng or random.Random()
        self.stats = Stats()
        self.pacer = wire.Pacer()
        self._ids = 0
        self._id_prefix = f"chatcmpl-mock{os.getpid():x}-"

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        stats.requests += 1
        stats.current += 1
        stats.max_concurrent = max(stats.max_concurrent, stats.current)
        try:
            resp, tokens, finished = await self._answer(request)
            stats.tokens_out += tokens
            if finished:
                stats.completed += 1
            return resp
        except ConnectionError:
            # The client went away between writes; aiohttp only needs a response object back.
            return web.Response(status=499)
        finally:
            stats.current -= 1

    async def _answer(self, request: web.Request) -> tuple[web.StreamResponse, int, bool]:
        try:
            plan = plan_reply(orjson.loads(await request.read()), self.profile, self.rng)
        except orjson.JSONDecodeError:
            return await self._error(request, "400", "request body is not valid JSON")
        except BadRequest as exc:
            return await self._error(request, "400", str(exc))
        if plan.fault == "429":
            headers = {"Retry-After": str(self.profile.retry_after_secs)}
            return await self._error(request, "429", "Rate limit reached (mock)", headers)
        if plan.fault == "500":
            return await self._error(request, "500", "The server had an error (mock)")
        if plan.fault is not None:
            self._count_error(plan.fault)
        self._ids += 1
        completion_id = f"{self._id_prefix}{self._ids}"
        call_ids = [f"call_mock{self._ids}_{i}" for i in range(len(plan.tool_names))]
        if plan.stream:
            return await wire.stream_reply(request, plan, completion_id, call_ids, self.pacer)
        return await wire.whole_reply(request, plan, completion_id, call_ids)

    async def _error(self, request: web.Request, status: str, message: str,
                     headers: Mapping[str, str] | None = None) -> tuple[web.Response, int, bool]:
        self._count_error(status)
        return await wire.send(request, wire.error_response(int(status), message, headers)), 0, True

    def _count_error(self, kind: str) -> None:
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1

    async def models(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"object":"list","data":[{"id":"mock","object":"model"}]}',
                            content_type=wire.JSON)

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats.as_dict()), content_type=wire.JSON)

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return await self.get_stats(request)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"ok":true}', content_type=wire.JSON)


def build_app(profile: MockProfile, rng: random.Random | None = None) -> web.Application:
    """The mock's routes. Serve it with handler_cancellation=True (as main does): a stream only
    learns that its client left by being cancelled, and a `hang` stream ends no other way."""
    server = MockServer(profile, rng)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_routes([
        web.post("/v1/chat/completions", server.chat_completions),
        web.get("/v1/models", server.models),
        web.get("/stats", server.get_stats),
        web.post("/stats/reset", server.reset_stats),
        web.get("/healthz", server.healthz),
    ])
    return app


# ---------------------------------------------------------------------------------------------
# Process

def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)  # readers never see a half-written file


def _raise_fd_limit() -> None:
    # 1000+ streams need more descriptors than the usual soft limit of 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass  # best effort: a benchmark that needs more will fail loudly on accept


def _tune_gc() -> None:
    # Each open stream holds a few dozen container objects for seconds. With the default gen-0
    # threshold (700) they are promoted and then walked again by every older-generation pass:
    # about a tenth of the mock's CPU at 1000 streams. Startup objects are frozen out of
    # collection and collections made rarer; the mock makes few reference cycles.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _set_title() -> None:
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle("agent-os: mock-llm")


async def _serve(host: str, port: int, port_file: str | None, profile: MockProfile) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # handler_cancellation: a client that goes away cancels its handler, which is how a `hang`
    # stream (or any stream) ends without leaking.
    runner = web.AppRunner(build_app(profile), access_log=None, handler_cancellation=True,
                           shutdown_timeout=SHUTDOWN_GRACE_SECS)
    await runner.setup()
    _tune_gc()
    try:
        site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
        await site.start()
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host  # an IPv6 literal needs brackets in a URL
        print(f"mock-llm listening on http://{shown}:{bound} ({profile.describe()})",
              file=sys.stderr, flush=True)
        if port_file:  # last: whoever waits for this file may rely on the line above
            _write_port_file(port_file, bound)
        await stop.wait()
    finally:
        await runner.cleanup()
    return EXIT_OK


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.mock_llm",
                                     description="An OpenAI-compatible mock model server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 = any free port")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        profile = MockProfile.from_env(os.environ)
    except ValueError as exc:
        print(f"mock-llm: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    _set_title()
    _raise_fd_limit()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(args.host, args.port, args.port_file, profile))


if __name__ == "__main__":
    sys.exit(main())
