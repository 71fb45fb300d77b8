"""How the mock model server (bench/mock_llm.py) reads a request and decides its reply.

This module owns the mock's profile (MockProfile, read from MOCK_* environment variables), the
per-request overrides of a `[[mock key=value ...]]` marker in the last user message, the
validation of an OpenAI chat request (BadRequest for the 400) and plan_reply, which turns a
request into a finished Plan: its timing, its length, its tool calls and which fault, if any, it
gets. It never touches a socket, writes a byte of the reply or keeps statistics: the server in
bench/mock_llm.py serves the Plan and bench/mock_stream.py puts it on the wire.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import partial

from bench import mock_stream as wire

__all__ = ["BadRequest", "MockProfile", "plan_reply"]

ERROR_KINDS = ("429", "500", "disconnect", "hang", "slow")
SLOW_FACTOR = 10           # `slow` delays the first token by this multiple of ttft_ms
QUERY_CHARS = 40           # tool-call arguments carry this much of the user's text

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
    "made_up_tool_calls": _tool_list,   # calls to tools the request did not offer: a model inventing one
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


def _check_tool_pairs(messages: list) -> None:
    """As OpenAI's API: each assistant message's tool calls are answered, each by a `tool`
    message, before the next message of another role, and a `tool` message answers one of them.
    A history that breaks this is a 400 there, so the mock refuses it too."""
    waiting: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in waiting:
                raise BadRequest(f"messages[{i}]: a message with role 'tool' must answer a tool call of the "
                                 f"assistant message before it, and {call_id!r} is none that waits")
            waiting.remove(call_id)
            continue
        if waiting:
            raise BadRequest("an assistant message with 'tool_calls' must be followed by tool messages answering "
                             f"each 'tool_call_id'; these were not answered: {', '.join(map(str, waiting))}")
        calls = message.get("tool_calls") if role == "assistant" else None
        if isinstance(calls, list):
            waiting = [c.get("id") for c in calls if isinstance(c, dict)]
    if waiting:
        raise BadRequest("an assistant message with 'tool_calls' must be followed by tool messages answering "
                         f"each 'tool_call_id'; these were not answered: {', '.join(map(str, waiting))}")


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
    _check_tool_pairs(messages)
    overrides, query = _parse_marker(user_text)

    fault = overrides.get("error")
    if fault is None and profile.error_rate > 0 and rng.random() < profile.error_rate:
        fault = profile.error_kind
    ttft_ms = float(overrides.get("ttft_ms", profile.ttft_ms))  # type: ignore[arg-type]
    tool_names: tuple[str, ...] = ()
    wanted = overrides.get("tool_calls", ())
    made_up = overrides.get("made_up_tool_calls", ())
    answered = any(m.get("role") == "tool" for m in messages[last_user + 1:])  # all dicts by now
    if (wanted or made_up) and not answered:
        offered = _tool_names(body.get("tools"))
        unknown = [name for name in wanted if name not in offered]
        if unknown:
            raise BadRequest(f"mock marker: tool_calls names tools not in the request: {unknown}")
        tool_names = (*wanted, *made_up)  # type: ignore[assignment]
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
