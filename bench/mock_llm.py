"""An OpenAI-compatible mock model server: the load source of every benchmark.

It owns the model's timing profile (time to first token, tokens per second, reply length), fault
injection (429, 500, broken and never-ending streams, slow first tokens), per-request overrides
through a `[[mock key=value ...]]` marker in the last user message, and `/stats` counters that let
a benchmark check how many streams were really open at once. It never calls a real model and keeps
nothing across restarts. The bytes on the wire are built in bench/mock_stream.py.

Run it with `python -m bench.mock_llm --port 0 --port-file PATH`; the profile comes from MOCK_*
environment variables (see MockProfile.from_env).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import re
import resource
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import partial

import orjson
import uvloop
from aiohttp import web

from bench import mock_stream as wire

__all__ = ["MockProfile", "build_app", "expected_text", "main"]

expected_text = wire.expected_text  # tests predict replies with it; it lives beside WORDS

ERROR_KINDS = ("429", "500", "disconnect", "hang", "slow")
SLOW_FACTOR = 10           # `slow` delays the first token by this multiple of ttft_ms
QUERY_CHARS = 40           # tool-call arguments carry this much of the user's text
SHUTDOWN_GRACE_SECS = 0.25  # open streams get this long (twice, in aiohttp) after SIGTERM;
                           # a `hang` stream would otherwise hold the exit forever
LISTEN_BACKLOG = 4096      # 1000 clients connect at once; the default 128 drops SYNs
MAX_BODY_BYTES = 64 << 20  # long agent conversations exceed aiohttp's default of 1 MiB
GC_THRESHOLDS = (50_000, 50, 50)  # see _tune_gc
EXIT_OK = 0
EXIT_BAD_CONFIG = 2

_MARKER = re.compile(r"\[\[mock(?P<body>[^\]]*)\]\]")


# ---------------------------------------------------------------------------------------------
# Profile

def _number(label: str, raw: object, *, integer: bool = False, minimum: float = 0,
            above: bool = False, maximum: float | None = None) -> float:
    """Parse one numeric setting; every message names `label` (an env var or a marker key)."""
    kind = "an integer" if integer else "a number"
    try:
        if isinstance(raw, bool) or (integer and isinstance(raw, float)):
            raise TypeError(raw)
        value = int(raw) if integer else float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be {kind}, got {raw!r}") from None
    if (not math.isfinite(value) or value < minimum or (above and value == minimum)
            or (maximum is not None and value > maximum)):
        upper = f" and <= {maximum:g}" if maximum is not None else ""
        raise ValueError(
            f"{label} must be {'>' if above else '>='} {minimum:g}{upper}, got {raw!r}")
    return value


_ms = partial(_number)
_rate_per_sec = partial(_number, above=True)
_count = partial(_number, integer=True)
_probability = partial(_number, maximum=1)


def _error_kind(label: str, raw: object) -> str:
    if raw not in ERROR_KINDS:
        raise ValueError(f"{label} must be one of {', '.join(ERROR_KINDS)}; got {raw!r}")
    return str(raw)


# Field name -> (environment variable, parser). The one table behind from_env and validation.
_PROFILE_FIELDS: dict[str, tuple[str, Callable[[str, object], object]]] = {
    "ttft_ms": ("MOCK_TTFT_MS", _ms),
    "tps": ("MOCK_TPS", _rate_per_sec),
    "tokens": ("MOCK_TOKENS", _count),
    "error_rate": ("MOCK_ERROR_RATE", _probability),
    "error_kind": ("MOCK_ERROR_KIND", _error_kind),
    "retry_after_secs": ("MOCK_RETRY_AFTER_SECS", _count),
}


@dataclass(frozen=True, slots=True)
class MockProfile:
    """How the mock model behaves when a request does not override it."""

    ttft_ms: float = 2000
    tps: float = 200             # tokens per second after the first
    tokens: int = 8
    error_rate: float = 0.0      # probability per request of applying error_kind
    error_kind: str = "500"      # one of ERROR_KINDS
    retry_after_secs: int = 1    # Retry-After of a 429

    def __post_init__(self) -> None:
        for f in fields(self):
            _PROFILE_FIELDS[f.name][1](f.name, getattr(self, f.name))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> MockProfile:
        """Read MOCK_* variables (missing = default); ValueError names a bad variable."""
        values = {name: parse(var, environ[var])
                  for name, (var, parse) in _PROFILE_FIELDS.items() if var in environ}
        return cls(**values)

    def describe(self) -> str:
        return (f"ttft={self.ttft_ms:g}ms tps={self.tps:g} tokens={self.tokens} "
                f"error_rate={self.error_rate:g}")


# ---------------------------------------------------------------------------------------------
# Requests

class BadRequest(Exception):
    """The request cannot be answered; the message goes back to the client in a 400."""


def _text_of(content: object, where: str) -> str:
    """Text of a message content: a string, a list of OpenAI content parts, or null."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    raise BadRequest(f"{where}.content must be a string, a list of parts or null")


def _tool_list(label: str, raw: object) -> tuple[str, ...]:
    names = tuple(n for n in str(raw).split(",") if n)
    if not names:
        raise ValueError(f"{label} must name at least one tool, got {raw!r}")
    return names


# Marker key -> parser: the keys a request may override.
_MARKER_KEYS: dict[str, Callable[[str, object], object]] = {
    "ttft_ms": _ms,
    "tps": _rate_per_sec,
    "tokens": _count,
    "error": _error_kind,
    "tool_calls": _tool_list,
}


def _parse_marker(text: str) -> tuple[dict[str, object], str]:
    """Overrides from the first `[[mock k=v ...]]` in `text`, and the text without it."""
    match = _MARKER.search(text) if "[[mock" in text else None
    if match is None:
        return {}, text.strip()
    overrides: dict[str, object] = {}
    for item in match.group("body").split():
        key, sep, value = item.partition("=")
        if not sep:
            raise BadRequest(f"mock marker: {item!r} is not key=value")
        parse = _MARKER_KEYS.get(key)
        if parse is None:
            raise BadRequest(f"mock marker: unknown key {key!r}")
        try:
            overrides[key] = parse(key, value)
        except ValueError as exc:
            raise BadRequest(f"mock marker: {exc}") from None
    rest = (text[:match.start()] + text[match.end():]).strip()
    return overrides, rest


def _tool_names(tools: object) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list")
    names = set()
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def plan_reply(body: object, profile: MockProfile, rng: random.Random) -> wire.Plan:
    """Validate an OpenAI chat request and decide the reply; BadRequest on bad input."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    model = body.get("model", "mock")
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    chars, last_user, user_text = 0, -1, ""
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object")
        text = _text_of(message.get("content"), f"messages[{i}]")
        chars += len(text)
        if message.get("role") == "user":
            last_user, user_text = i, text
    overrides, query = _parse_marker(user_text)

    fault = overrides.get("error")
    if fault is None and profile.error_rate > 0 and rng.random() < profile.error_rate:
        fault = profile.error_kind
    ttft_ms = float(overrides.get("ttft_ms", profile.ttft_ms))  # type: ignore[arg-type]
    tool_names: tuple[str, ...] = ()
    wanted = overrides.get("tool_calls", ())
    answered = any(m.get("role") == "tool" for m in messages[last_user + 1:])  # all dicts by now
    if wanted and not answered:
        offered = _tool_names(body.get("tools"))
        unknown = [name for name in wanted if name not in offered]
        if unknown:
            raise BadRequest(f"mock marker: tool_calls names tools not in the request: {unknown}")
        tool_names = wanted  # type: ignore[assignment]
    options = body.get("stream_options")
    return wire.Plan(
        model=model,
        stream=body.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        ttft_secs=ttft_ms / 1000 * (SLOW_FACTOR if fault == "slow" else 1),
        interval_secs=1 / float(overrides.get("tps", profile.tps)),  # type: ignore[arg-type]
        tokens=int(overrides.get("tokens", profile.tokens)),  # type: ignore[call-overload]
        fault=fault,  # type: ignore[arg-type]
        tool_names=tool_names,
        query=query[:QUERY_CHARS],
        prompt_tokens=max(1, chars // 4),
    )


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
