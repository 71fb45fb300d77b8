"""What of a session's history a model call is sent (`provider.max_context_chars`).

A session's transcript only grows, and a model's context does not: a long-lived session would
one day be refused by the provider on every turn. So a call may be sent only the newest messages
whose characters (as JSON: content, tool calls and results alike; about four a token in English)
fit the budget. The transcript itself keeps everything; only the request is windowed.

The current turn — from its user message on, its tool calls and results included — is always
sent whole, whatever it takes: the model cannot answer without it. Older messages are added
newest first while they fit, and the window begins at a user message: whole exchanges, never an
answer without its question nor a tool result whose call was left out (OpenAI-compatible
providers refuse a result with no call before it).
"""
from __future__ import annotations

from typing import Any

import orjson


def _chars(message: dict[str, Any]) -> int:
    return len(orjson.dumps(message))


def context(messages: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The messages a model call is sent: all of them, or (max_chars > 0) the current turn and the
    newest older ones that fit."""
    if max_chars <= 0 or not messages:
        return messages
    start = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0)
    turn_start = start
    total = sum(_chars(m) for m in messages[start:])
    while start > 0:
        size = _chars(messages[start - 1])
        if total + size > max_chars:
            break
        start, total = start - 1, total + size
    while start < turn_start and messages[start].get("role") != "user":
        start += 1
    return messages[start:] if start else messages
